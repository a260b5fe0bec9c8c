"""A session's timeline: its records as a person reads them (:func:`timeline`, :class:`Timeline`).

PURE (see :mod:`harness.views`). One :class:`TimelineItem` per record: inputs and their
settlements (a later copy of an input marked ``resent``), turns, model responses, usage
and retries, tool calls with their steps, sleeps and asks (open, answered, expired or
closed), app records.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from harness.records import (
    AppRecord,
    AskAnswered,
    AskOpened,
    InputAnswer,
    InputMessage,
    InputRecords,
    InputSettled,
    LogEntry,
    ModelResponseRecord,
    ModelRetry,
    ModelUsage,
    SleepScheduled,
    StepResult,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnResumed,
    TurnStarted,
)
from harness.replay.resends import FirstInputs
from harness.views.summaries import Usage, usage_text

__all__ = ["PREVIEW_CHARS", "Timeline", "TimelineItem", "TimelineKind", "preview", "timeline"]

PREVIEW_CHARS = 72
"""A value's preview is its compact JSON cut to this many characters."""


TimelineKind = Literal[
    "input.message",
    "input.answer",
    "input.records",
    "input.settled",
    "turn.started",
    "turn.resumed",
    "turn.finished",
    "model.response",
    "model.usage",
    "model.retry",
    "tool.started",
    "step",
    "sleep",
    "ask",
    "ask.answered",
    "tool.result",
    "record",
]


@dataclass(slots=True)
class TimelineItem:
    """One line of a session's timeline.

    ``depth`` nests it: 0 for inputs and turns, 1 for what happens in a turn (model
    responses, their usage and retries, tool calls), 2 for what happens in a tool call
    (steps, sleeps, asks, its app records). ``text`` is the item's main text (a
    message, a question, the model's answer, a retried failure), ``preview`` a short
    form of its JSON ``value``. ``status`` says how it ended: an input's settlement
    (``completed``, ``rejected`` ...), an ask's ``open`` / ``answered`` / ``expired``, a
    model response cut at its output limit ``truncated``, a retried model call
    ``retrying`` (``attempt`` = the retry's number, ``wake_at`` = when it runs). A later
    copy of an input (same id, same payload: SPEC 7.2, it has no effect) is ``resent``,
    ``detail["first_position"]`` the position of the copy that counts; it carries no
    text or value of its own (a reader must not see its message or records twice).
    ``error`` marks failures.
    """

    seq: int
    ts: int
    kind: TimelineKind
    depth: int
    input_id: str | None = None
    turn: int | None = None
    attempt: int | None = None
    tool_call_id: str | None = None
    name: str | None = None
    text: str | None = None
    value: Any = None
    preview: str | None = None
    status: str | None = None
    code: str | None = None
    error: bool = False
    wake_at: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    """A value's compact JSON, cut to ``limit`` characters (``…`` marks a cut)."""
    try:
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    text = " ".join(text.split())  # one line
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _args_preview(arguments: Any) -> str:
    if isinstance(arguments, dict):
        inner = ", ".join(
            f"{k}={preview(json.dumps(v, ensure_ascii=False) if isinstance(v, str) else v, 24)}"
            for k, v in arguments.items()
        )
        return preview(inner, PREVIEW_CHARS - 8)
    return preview(arguments, PREVIEW_CHARS - 8)


def timeline(entries: Sequence[LogEntry] | Iterable[LogEntry]) -> list[TimelineItem]:
    """A session's records (in log order) as a person reads them.

    An ask's item carries its answer (``status="answered"``, ``value``) once the
    answer is among ``entries``; an input's item carries its settlement (``status``,
    ``code``) the same way. Each answer and settlement also has an item of its own,
    at its own time.
    """
    return Timeline().add(entries)


class Timeline:
    """A session's timeline made as its records come (``harness tail``): each ``add``
    returns the items of the new records only, and costs what they are, not what the
    session holds. ``timeline(a + b)`` equals ``add(a) + add(b)`` item for item (earlier
    items are still updated by later answers and settlements)."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen = _Seen()

    def add(self, entries: Sequence[LogEntry] | Iterable[LogEntry]) -> list[TimelineItem]:
        """The items of ``entries`` (the session's next records, in log order)."""
        return _timeline_items(entries, self._seen)


@dataclass(slots=True)
class _Seen:
    """What later records of a timeline update: the first item of each input id, later
    copies that conflict with it (settled by position), open asks and the turn of each
    call (a turn that ends closes its calls' open asks)."""

    inputs: dict[str, TimelineItem] = field(default_factory=dict)
    firsts: FirstInputs = field(default_factory=FirstInputs)
    conflicts: dict[int, TimelineItem] = field(default_factory=dict)
    asks: dict[tuple[str, str], TimelineItem] = field(default_factory=dict)
    call_turns: dict[str, int] = field(default_factory=dict)


def _input_item(seq: int, item: TimelineItem, seen: _Seen, record: InputMessage | InputAnswer | InputRecords) -> None:
    """Keep the first item of its input id; mark a later copy: a resend, or a conflict."""
    first = seen.firsts.see(seq, record)
    if first is not None:
        item.status, item.detail = "resent", {"first_position": first}
        item.text = item.value = item.preview = None
    elif seen.inputs.setdefault(record.input_id, item) is not item:
        seen.conflicts[seq] = item


def _timeline_items(entries: Sequence[LogEntry] | Iterable[LogEntry], seen: _Seen) -> list[TimelineItem]:
    inputs, asks = seen.inputs, seen.asks
    items: list[TimelineItem] = []
    for entry in entries:
        r = entry.record
        seq, ts = entry.seq, r.ts
        item: TimelineItem | None = None
        if isinstance(r, InputMessage):
            item = TimelineItem(seq, ts, "input.message", 0, input_id=r.input_id, text=r.text,
                                detail={"harness": r.harness} if r.harness else {})
            _input_item(seq, item, seen, r)
        elif isinstance(r, InputAnswer):
            item = TimelineItem(seq, ts, "input.answer", 0, input_id=r.input_id, tool_call_id=r.tool_call_id,
                                name=r.name, value=r.value, preview=preview(r.value))
            _input_item(seq, item, seen, r)
        elif isinstance(r, InputRecords):
            records = r.records if isinstance(r.records, list) else []
            types = [str(b.get("type")) for b in records if isinstance(b, dict)]
            item = TimelineItem(seq, ts, "input.records", 0, input_id=r.input_id, value=r.records,
                                preview=preview(r.records), text=", ".join(types) or None)
            _input_item(seq, item, seen, r)
        elif isinstance(r, InputSettled):
            failed = r.outcome in ("failed", "rejected")
            item = TimelineItem(seq, ts, "input.settled", 0, input_id=r.input_id, status=r.outcome, code=r.code,
                                text=r.reason, error=failed)
            # (a settlement naming its input's position settles a conflicting later copy)
            copy = seen.conflicts.get(r.input_seq) if r.input_seq is not None else None
            first = copy if copy is not None else inputs.get(r.input_id)
            if first is not None and first.status is None:
                first.status, first.code, first.error = r.outcome, r.code, failed
        elif isinstance(r, TurnStarted):
            item = TimelineItem(seq, ts, "turn.started", 0, input_id=r.input_id, turn=r.turn, attempt=1)
        elif isinstance(r, TurnResumed):
            item = TimelineItem(seq, ts, "turn.resumed", 0, input_id=r.input_id, turn=r.turn, attempt=r.attempt)
        elif isinstance(r, TurnFinished):
            item = TimelineItem(seq, ts, "turn.finished", 0, input_id=r.input_id, turn=r.turn, status=r.outcome,
                                text=r.text if r.outcome == "completed" else (r.error or r.text), code=r.code,
                                error=r.outcome == "failed")
            for (call_id, _), asked in asks.items():
                if asked.status == "open" and seen.call_turns.get(call_id) == r.turn:
                    asked.status = "closed"  # its turn ended (cancelled, failed) with the ask unanswered
        elif isinstance(r, ModelResponseRecord):
            calls = [{"id": c["id"], "name": c["name"], "arguments": c.get("arguments")} for c in r.tool_calls]
            seen.call_turns.update((c["id"], r.turn) for c in calls)
            info: dict[str, Any] = {"index": r.index, "tool_calls": calls}
            if r.finish_reason is not None:
                info["finish_reason"] = r.finish_reason
            item = TimelineItem(seq, ts, "model.response", 1, turn=r.turn, text=r.text, detail=info,
                                status="truncated" if r.truncated else None,
                                preview=", ".join(f"{c['name']}({_args_preview(c['arguments'])})" for c in calls)
                                or None)
        elif isinstance(r, ModelUsage):
            used = {"input_tokens": r.input_tokens, "output_tokens": r.output_tokens, "cost": r.cost}
            item = TimelineItem(seq, ts, "model.usage", 1 if r.tool_call_id is None else 2, turn=r.turn, name=r.model,
                                value=used, tool_call_id=r.tool_call_id,
                                preview=usage_text(Usage(1, r.input_tokens, r.output_tokens, r.cost)),
                                detail={"index": r.index})
        elif isinstance(r, ModelRetry):
            item = TimelineItem(seq, ts, "model.retry", 1, turn=r.turn, attempt=r.retry, text=r.error,
                                status="retrying", code=r.kind or (str(r.status) if r.status else None),
                                wake_at=r.wait_until, detail={"index": r.index, "status": r.status})
        elif isinstance(r, ToolStarted):
            item = TimelineItem(seq, ts, "tool.started", 1, tool_call_id=r.tool_call_id, name=r.name,
                                attempt=r.attempt)
        elif isinstance(r, StepResult):
            item = TimelineItem(seq, ts, "step", 2, tool_call_id=r.tool_call_id, name=r.name, value=r.value,
                                preview=preview(r.value))
        elif isinstance(r, SleepScheduled):
            item = TimelineItem(seq, ts, "sleep", 2, tool_call_id=r.tool_call_id, name=r.name, wake_at=r.wake_at)
        elif isinstance(r, AskOpened):
            item = TimelineItem(seq, ts, "ask", 2, tool_call_id=r.tool_call_id, name=r.name, text=r.message,
                                status="open", detail={"schema": r.schema, "expires_at": r.expires_at})
            asks.setdefault((r.tool_call_id, r.name), item)
        elif isinstance(r, AskAnswered):
            item = TimelineItem(seq, ts, "ask.answered", 2, tool_call_id=r.tool_call_id, name=r.name,
                                input_id=r.input_id, value=r.value, preview=preview(r.value))
            ask = asks.get((r.tool_call_id, r.name))
            if ask is not None and ask.status == "open":
                ask.status, ask.value, ask.preview = "answered", r.value, preview(r.value)
        elif isinstance(r, ToolResult):
            item = TimelineItem(seq, ts, "tool.result", 1, tool_call_id=r.tool_call_id, name=r.name,
                                value=r.content, preview=preview(r.content), code=r.code, error=r.is_error,
                                detail={"replaced_by_hook": True} if r.replaced_by_hook else {})
            for (call_id, _), ask in asks.items():
                if call_id == r.tool_call_id and ask.status == "open":
                    # expired: the tool failed with AskExpired, or ended unanswered past the expiry
                    # (a tool that catches AskExpired and returns); else closed unanswered
                    expires = ask.detail.get("expires_at")
                    past = expires is not None and ts >= expires
                    ask.status = "expired" if r.code == "ask_expired" or _expired(r.content) or past else "closed"
        elif isinstance(r, AppRecord):
            item = TimelineItem(seq, ts, "record", 2 if r.tool_call_id else 1, tool_call_id=r.tool_call_id,
                                input_id=r.input_id, name=r.record_type, value=r.body, preview=preview(r.body))
        if item is not None:
            items.append(item)
    return items


def _expired(content: Any) -> bool:
    return isinstance(content, dict) and content.get("type") == "AskExpired"
