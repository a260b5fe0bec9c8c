"""Text for people: session tables and timelines, aligned, coloured on a terminal.

Pure functions from the views (``harness.views``) to lines; colour only when asked
(``Style(color=True)``: a terminal without ``NO_COLOR``, or ``--color always``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from harness.views import OpenAsk, SessionSummary, TimelineItem, usage_text

__all__ = [
    "Style",
    "age",
    "ask_lines",
    "clock",
    "printable",
    "session_header",
    "sessions_table",
    "state_text",
    "style_for",
    "table_cuts",
    "timeline_line",
    "timeline_lines",
]

_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34", "magenta": "35",
          "cyan": "36"}


class Style:
    """ANSI colours, or none."""

    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, *names: str) -> str:
        if not self.color or not names or not text:
            return text
        codes = ";".join(_CODES[n] for n in names)
        return f"\x1b[{codes}m{text}\x1b[0m"


def style_for(stream: IO[str], choice: str = "auto") -> Style:
    """Colour on a terminal (``auto``) unless ``NO_COLOR`` is set or ``TERM=dumb``."""
    if choice == "always":
        return Style(True)
    if choice == "never":
        return Style(False)
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Style(tty and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb")


def clock(ms: int | None, now_ms: int, *, millis: bool = False) -> str:
    """Local time: ``12:00:31`` today, ``2025-11-30 12:00:31`` another day."""
    if ms is None:
        return "-"
    t = time.localtime(ms / 1000)
    text = time.strftime("%H:%M:%S", t)
    if millis:
        text += f".{ms % 1000:03d}"
    if time.strftime("%Y-%m-%d", t) != time.strftime("%Y-%m-%d", time.localtime(now_ms / 1000)):
        text = f"{time.strftime('%Y-%m-%d', t)} {text}"
    return text


def _duration(seconds: int) -> str:
    """``45 s``, ``12 min``, ``3 h``, ``2 days``."""
    for size, unit in ((86400, " days"), (3600, " h"), (60, " min")):
        if seconds >= 2 * size or (unit != " days" and seconds >= size):
            return f"{seconds // size}{unit}"
    return f"{seconds} s"


def age(ms: int | None, now_ms: int) -> str:
    """``12s ago``, ``3m ago``, ``2h ago``, ``4d ago``."""
    if ms is None:
        return "-"
    seconds = max(0, (now_ms - ms) // 1000)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def state_text(summary: SessionSummary, now_ms: int) -> str:
    """``running``, ``queued (1 input not taken yet)``, ``waiting for a person``, ``sleeping until
    12:00:31``, ``idle``, ``failed (code)``, ``parked: a record cannot be read``
    (the JSON keeps the state name: ``running``)."""
    if summary.state == "waiting":
        return "waiting for a person"
    if summary.state == "sleeping":
        return f"sleeping until {clock(summary.sleeping_until, now_ms)}"
    if summary.state == "failed":
        return f"failed ({summary.last_code})" if summary.last_code else "failed"
    if summary.state == "unreadable":
        return "parked: a record cannot be read"
    if summary.partial:
        return "idle (ended)"
    if summary.state == "running" and summary.active_input is None and summary.pending_inputs:
        # no turn yet: a worker takes it at once, so this lasts only while none runs on the log
        return f"queued ({summary.pending_inputs} input{'s' if summary.pending_inputs > 1 else ''} not taken yet)"
    return summary.state


_STATE_COLOURS = {"running": ("cyan",), "waiting": ("yellow", "bold"), "sleeping": ("blue",), "idle": ("dim",),
                  "failed": ("red", "bold"), "unreadable": ("red", "bold")}


TABLE_ID_WIDTH = 40
"""The widest session id or harness name a table cell shows; a longer one (ids go up to 512
characters) is cut with an ellipsis, so one long id does not pad every row past the screen."""

TABLE_ASKS_WIDTH = 60
"""The widest list of open asks a table cell shows (tool call ids are as long as session ids)."""


def cut(text: str, width: int) -> str:
    """``text``, or its first ``width - 1`` characters and an ellipsis if it is longer."""
    return text if len(text) <= width else text[: width - 1] + "…"


def table_cuts(summaries: Sequence[SessionSummary]) -> bool:
    """Whether :func:`sessions_table` cuts a cell of these sessions."""
    return any(
        len(s.session_id) > TABLE_ID_WIDTH or len(s.harness or "") > TABLE_ID_WIDTH
        or len(_asks_cell(s)) > TABLE_ASKS_WIDTH
        for s in summaries
    )


def _asks_cell(s: SessionSummary) -> str:
    return ", ".join(f"{a.tool_call_id}/{a.name}" for a in s.open_asks) or "-"


def sessions_table(summaries: Sequence[SessionSummary], now_ms: int, style: Style) -> list[str]:
    """One row per session: id, harness, state, last activity, open asks, turns (long ids
    cut: see :data:`TABLE_ID_WIDTH`)."""
    header = ("SESSION", "HARNESS", "STATE", "LAST ACTIVITY", "ASKS", "TURNS")
    rows = [
        (
            cut(s.session_id, TABLE_ID_WIDTH),
            cut(s.harness or "-", TABLE_ID_WIDTH),
            state_text(s, now_ms),
            age(s.last_activity, now_ms),
            cut(_asks_cell(s), TABLE_ASKS_WIDTH),
            "-" if s.partial else str(s.turns),
        )
        for s in summaries
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: Sequence[str], colours: Sequence[tuple[str, ...]] = ()) -> str:
        parts = []
        for i, cell in enumerate(cells):
            padded = cell if i == len(cells) - 1 else cell.ljust(widths[i])
            parts.append(style(padded, *(colours[i] if i < len(colours) else ())))
        return "  ".join(parts).rstrip()

    out = [line(header, [("bold",)] * len(header))]
    for s, row in zip(summaries, rows, strict=True):
        out.append(line(row, [(), ("dim",), _STATE_COLOURS.get(s.state, ()), (), ("yellow",) if s.open_asks else ()]))
    return out


def session_header(summary: SessionSummary, now_ms: int, style: Style) -> str:
    turns = f"{summary.turns} turn{'s' if summary.turns != 1 else ''}"
    last = f", last {summary.last_outcome}" if summary.last_outcome else ""
    return "  ·  ".join([
        style(f"session {summary.session_id}", "bold"),
        f"harness {summary.harness or '-'}",
        style(state_text(summary, now_ms), *_STATE_COLOURS.get(summary.state, ())),
        f"{turns}{last}",
        *([f"{summary.usage.calls} model call{'s' if summary.usage.calls != 1 else ''}: "
           f"{usage_text(summary.usage)}"] if summary.usage.calls else []),
        f"last activity {clock(summary.last_activity, now_ms)}",
    ])


def ask_lines(
    asks: Sequence[OpenAsk], session_id: str, style: Style, waiting: Mapping[tuple[str, str], str] | None = None
) -> list[str]:
    """The open asks and the command that answers each (``waiting``: the answers in the
    log not taken yet, by ``(tool_call_id, name)``: no command for those)."""
    out = []
    now_ms = int(time.time() * 1000)
    for a in asks:
        expires = ""
        if a.expires_at is not None:  # a person should know how long they have
            at_ms = int(a.expires_at * 1000)
            expires = f" (expires {clock(at_ms, now_ms)}, in {_duration(max(0, at_ms - now_ms) // 1000)})"
        where = printable(f"{a.tool_call_id}/{a.name}")
        out.append(f"{style('ask', 'yellow', 'bold')} {where}: {printable(a.message, lines=True)}{expires}")
        fields = ", ".join(sorted((a.schema or {}).get("properties", {}))) if isinstance(a.schema, dict) else ""
        hint = f" (fields: {fields})" if fields else ""
        answer = (waiting or {}).get((a.tool_call_id, a.name))
        if answer is not None:
            out.append(style(f"  answered by {printable(answer)}: waits for the session's worker to take it", "dim"))
            continue
        command = " ".join(shlex.quote(printable(part)) for part in ("harness", "answer", session_id, a.tool_call_id, a.name))
        out.append(style(f"  answer with: {command} 'JSON'{hint}", "dim"))
    return out


_LABELS = {
    "input.message": ("message", ("bold",)),
    "input.answer": ("answer", ("yellow",)),
    "input.records": ("records", ()),
    "input.settled": ("settled", ("dim",)),
    "model.response": ("model", ("cyan",)),
    "model.usage": ("usage", ("dim",)),
    "model.retry": ("retry", ("yellow",)),
    "tool.started": ("tool", ("green",)),
    "step": ("step", ()),
    "sleep": ("sleep", ("blue",)),
    "ask": ("ask", ("yellow", "bold")),
    "ask.answered": ("answered", ("yellow",)),
    "tool.result": ("result", ("green",)),
    "record": ("record", ("magenta",)),
}


def _quoted(text: str | None, limit: int = 100) -> str:
    if text is None:
        return ""
    one = " ".join(text.split())
    if len(one) > limit:
        one = one[: limit - 1] + "…"
    return f'"{one}"'


def _body(item: TimelineItem, now_ms: int, style: Style) -> str:
    k = item.kind
    if item.status == "resent":  # a later copy of an input: it has no effect (SPEC 7.2)
        first = item.detail.get("first_position")
        return f"{item.input_id}" + style(f"  (resent; the first at position {first} counts)", "dim")
    if k == "input.message":
        settled = f"  → {item.status}" if item.status else "  (not settled yet)"
        return f"{item.input_id} {_quoted(item.text)}" + style(settled, "red" if item.error else "dim")
    if k == "input.answer":
        return f"{item.input_id} for {item.tool_call_id}/{item.name} = {item.preview}"
    if k == "input.records":
        return f"{item.input_id} {item.text or ''} {item.preview}".rstrip()
    if k == "input.settled":
        why = f" ({item.code}: {item.text})" if item.code else ""
        return f"{item.input_id} {item.status}{why}"
    if k == "turn.started":
        return f"started (input {item.input_id})"
    if k == "turn.resumed":
        return f"taken over by a new owner (attempt {item.attempt})"
    if k == "turn.finished":
        if item.error:
            return f"failed ({item.code}): {item.text}" if item.code else f"failed: {item.text}"
        return f"{item.status} {_quoted(item.text)}".rstrip()
    if k == "model.response":
        calls = f"  → {item.preview}" if item.preview else ""
        cut = style("  (cut at the output limit: its calls do not run)", "yellow") if item.status == "truncated" else ""
        return f"{_quoted(item.text) or '(no text)'}{calls}{cut}"
    if k == "model.usage":
        by = f" (the sub-agent of [{item.tool_call_id}])" if item.tool_call_id else ""
        return f"{item.name or 'model'}: {item.preview}{by}"
    if k == "model.retry":
        why = f" ({item.code})" if item.code else ""
        return f"failed{why}: {item.text}; retry {item.attempt} at {clock(item.wake_at, now_ms, millis=True)}"
    if k == "tool.started":
        return f"{item.name} [{item.tool_call_id}] started (attempt {item.attempt})"
    if k == "step":
        return f"{item.name} = {item.preview}"
    if k == "sleep":
        return f"{item.name} until {clock(item.wake_at, now_ms)}"
    if k == "ask":
        if item.status == "answered":
            answer = f" → {item.preview}"
        elif item.status == "open":
            answer = style(" (open: waiting for an answer)", "yellow")
        else:
            answer = f" ({item.status})"
        return f"{item.name} [{item.tool_call_id}] {_quoted(item.text)}{answer}"
    if k == "ask.answered":
        return f"{item.name} [{item.tool_call_id}] = {item.preview}"
    if k == "tool.result":
        code = f" ({item.code})" if item.error and item.code else ""
        return f"{item.name} [{item.tool_call_id}]{code} → {item.preview}"
    if k == "record":
        return f"{item.name} {item.preview}"
    return item.kind


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_TEXT_FIELDS = ("input_id", "tool_call_id", "name", "text", "preview", "code", "status")


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``): a name or a value
    holding a newline keeps its item on one line, and one holding terminal escape
    sequences cannot recolour or rewrite the screen. ``lines``: keep line breaks and tabs
    (a question for a person may have several lines)."""
    return _CONTROL.sub(lambda m: m.group() if lines and m.group() in "\n\t" else repr(m.group())[1:-1], text)


def _printable_item(item: TimelineItem) -> TimelineItem:
    changes: dict[str, Any] = {
        # (a text's line breaks and tabs read as spaces, as its quoted form shows them)
        name: printable(" ".join(value.split()) if name == "text" else value)
        for name in _TEXT_FIELDS
        if isinstance(value := getattr(item, name, None), str) and _CONTROL.search(value)
    }
    return dataclasses.replace(item, **changes) if changes else item


def timeline_line(item: TimelineItem, now_ms: int, style: Style) -> str:
    """``12:00:01.123    tool     checkout [c1] started (attempt 1)``"""
    item = _printable_item(item)
    colours: tuple[str, ...]
    if item.kind.startswith("turn."):
        label, colours = f"turn {item.turn}", ("bold",)
        if item.kind == "turn.resumed":
            colours = ("magenta", "bold")
        elif item.error:
            colours = ("red", "bold")
    else:
        label, colours = _LABELS.get(item.kind, (item.kind, ()))
        if item.error:
            label, colours = ("error" if item.kind == "tool.result" else label), ("red", "bold")
    when = style(clock(item.ts, now_ms, millis=True), "dim")
    indent = "  " * item.depth
    body = _body(item, now_ms, style)
    if item.error and item.kind != "input.message":
        body = style(body, "red")
    return f"{when}  {indent}{style(label.ljust(9), *colours)}{body}"


def timeline_lines(items: Sequence[TimelineItem], now_ms: int, style: Style) -> list[str]:
    return [timeline_line(i, now_ms, style) for i in items]
