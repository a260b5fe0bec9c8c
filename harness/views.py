"""Session views: what a person (or a console, or an API client) sees of a session.

PURE: no I/O, no clock (the time comes in as ``now_ms``), no asyncio. Two views:

* :func:`summarize`: one session at a glance (:class:`SessionSummary`): its harness,
  its state (``running``, ``waiting`` for a person, ``sleeping`` until a time, ``idle``,
  ``failed``), its last activity, its open asks, how many turns and how the last one went,
  and what its model calls used (:class:`Usage`: tokens, cost when known);
* :func:`timeline`: a session's records as a person reads them (:class:`TimelineItem`):
  inputs and their settlements, turns with their attempts and takeovers, model
  responses (and their usage, and the transient failures retried before them), tool
  calls with their steps, asks with their answer (or still open), sleeps with their
  wake time, app records and errors.

Both are JSON-serialisable with ``.to_json()``, so ``harness sessions --json``,
``harness show --json``, the gateway's API and the web console share one shape.
Times are milliseconds since the epoch (UTC), as in the records.
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
from harness.replay.state import AskState, CallState, SessionState, UsageTotals

__all__ = [
    "SESSION_STATES",
    "OpenAsk",
    "OpenSleep",
    "SessionStateName",
    "SessionSummary",
    "TimelineItem",
    "Usage",
    "classify",
    "input_queued_behind_person",
    "input_waits_for_person",
    "last_record_ts",
    "open_asks",
    "open_sleeps",
    "preview",
    "summarize",
    "timeline",
    "usage_text",
]

SessionStateName = Literal["running", "waiting", "sleeping", "idle", "failed"]
SESSION_STATES: tuple[str, ...] = ("running", "waiting", "sleeping", "idle", "failed")
"""``running``: a turn (or an input) is being worked on, or waits for its owner;
``waiting``: every open tool call waits for a person's answer; ``sleeping``: every
open tool call sleeps (or waits for a person) until a wake time; ``idle``: nothing
to do; ``failed``: nothing to do and the last message's turn failed (or was rejected)."""

PREVIEW_CHARS = 72
"""A value's preview is its compact JSON cut to this many characters."""


# --- open asks -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenAsk:
    """A question a parked tool is waiting on."""

    tool_call_id: str
    name: str
    message: str
    schema: dict[str, Any]
    expires_at: float | None  # seconds since the epoch

    def to_json(self) -> dict[str, Any]:
        return {
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "message": self.message,
            "schema": self.schema,
            "expires_at": self.expires_at,
        }


def _open_calls(state: SessionState) -> list[CallState]:
    """The unfinished calls of the active turn: a call with its result, or of a turn that
    ended (cancelled, failed, cut by a takeover that ended it), is over."""
    active = state.active_turn
    if active is None:
        return []
    return [c for c in state.calls.values() if c.result is None and c.turn == active.turn]


def open_asks(state: SessionState, *, now_ms: int | None = None) -> tuple[OpenAsk, ...]:
    """Every ask opened by an unfinished call of the active turn and not answered yet
    (a turn that ended, e.g. cancelled, leaves no ask open); with ``now_ms``, not past
    its ``expires_at`` either (nobody can answer it: its tool is about to fail)."""
    out = []
    for call in _open_calls(state):
        for name, ask in call.asks.items():
            if _ask_waits(ask, now_ms):
                o = ask.opened
                expires = o.expires_at / 1000 if o.expires_at else None
                out.append(OpenAsk(call.tool_call_id, name, o.message, o.schema, expires))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class OpenSleep:
    """A sleep of a call still open: its tool wakes at ``wake_at`` (ms since the epoch)."""

    tool_call_id: str
    name: str
    wake_at: int

    def to_json(self, *, now_ms: int) -> dict[str, Any]:
        """With ``due``: the wake time has come (the tool runs again soon)."""
        return {"tool_call_id": self.tool_call_id, "name": self.name, "wake_at": self.wake_at,
                "due": self.wake_at <= now_ms}


def open_sleeps(state: SessionState) -> tuple[OpenSleep, ...]:
    """The sleeps of the unfinished calls of the active turn. The sleep of a call that is
    over (finished, cut, or its turn ended: cancelled, failed) wakes nobody: not listed."""
    return tuple(OpenSleep(c.tool_call_id, name, wake) for c in _open_calls(state) for name, wake in c.sleeps.items())


# --- usage -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Usage:
    """What a session's completed model calls used (the sum of its ``harness.model.usage``).

    ``cost`` is the sum of the costs the provider reported, None when no call reported one.
    """

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None

    @classmethod
    def of(cls, totals: UsageTotals) -> Usage:
        return cls(totals.calls, totals.input_tokens, totals.output_tokens, totals.cost)

    def to_json(self) -> dict[str, Any]:
        return {"calls": self.calls, "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cost": self.cost}


# --- one session at a glance ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """One session at a glance.

    ``partial`` marks a session known only by its id: it ended before the latest
    checkpoint of its Kafka partition, whose records a quick listing does not read
    (``list_sessions(log, history=True)`` reads them). Such a session is ``idle``
    and its other fields are unknown.
    """

    session_id: str
    harness: str | None
    state: SessionStateName
    last_activity: int | None = None
    sleeping_until: int | None = None
    open_asks: tuple[OpenAsk, ...] = ()
    turns: int = 0
    last_outcome: str | None = None
    last_code: str | None = None
    active_input: str | None = None
    pending_inputs: int = 0
    partial: bool = False
    usage: Usage = Usage()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["open_asks"] = [a.to_json() for a in self.open_asks]
        out["usage"] = self.usage.to_json()
        return out


def _ask_waits(ask: AskState, now_ms: int | None) -> bool:
    """Not answered, and (when ``now_ms`` is known) not expired."""
    if ask.answered is not None:
        return False
    expires = ask.opened.expires_at
    return now_ms is None or expires is None or expires > now_ms


def _asks_open(call: CallState, now_ms: int) -> bool:
    return any(_ask_waits(a, now_ms) for a in call.asks.values())


def _sleep_until(call: CallState, now_ms: int) -> int | None:
    """The wake time of the call's sleep that is not due yet, if any."""
    later = [w for w in call.sleeps.values() if w > now_ms]
    return min(later) if later else None


def input_waits_for_person(state: SessionState, input_id: str, *, now_ms: int) -> bool:
    """Whether ``input_id``'s turn is the active one and waits for a person's answer."""
    inp = state.inputs.get(input_id)
    active = state.active_turn
    if inp is None or inp.turn is None or active is None or active.turn != inp.turn:
        return False
    return classify(state, now_ms=now_ms)[0] == "waiting"


def input_queued_behind_person(state: SessionState, input_id: str, *, now_ms: int) -> str | None:
    """The input of the active turn that the message ``input_id`` is queued behind, when
    that turn waits for a person's answer; else None.

    A message is taken only once the turn before it has ended, so it waits for that answer
    too: whoever waits for it should say which ask to answer rather than wait for ever.
    """
    inp = state.inputs.get(input_id)
    active = state.active_turn
    if inp is None or inp.kind != "message" or inp.settled is not None or inp.turn is not None:
        return None
    if active is None or active.input_id == input_id:
        return None
    return active.input_id if classify(state, now_ms=now_ms)[0] == "waiting" else None


def classify(state: SessionState, *, now_ms: int) -> tuple[SessionStateName, int | None]:
    """The session's state name, and when it wakes if it sleeps."""
    turn = state.active_turn
    pending = state.pending_inputs()
    if turn is None:
        if pending:
            return "running", None  # an input waits for its owner
        outcome, _ = _last_outcome(state)
        return ("failed" if outcome in ("failed", "rejected") else "idle"), None
    if any(i.kind != "message" for i in pending):
        return "running", None  # an answer or records to take up
    last = turn.last_response
    if last is None:
        return "running", None
    open_calls = [c for c in state.batch(last) if c.result is None]
    if not open_calls:
        return "running", None  # the model is about to be called again
    person = [c for c in open_calls if _asks_open(c, now_ms)]
    wakes = {c.tool_call_id: _sleep_until(c, now_ms) for c in open_calls if c not in person}
    if any(w is None for w in wakes.values()):
        return "running", None  # some call is working
    until = min((w for w in wakes.values() if w is not None), default=None)
    if person:
        return "waiting", until
    return "sleeping", until


def _last_outcome(state: SessionState) -> tuple[str | None, str | None]:
    """How the latest settled message input ended (outcome, code)."""
    last = None
    for inp in state.inputs.values():
        if inp.kind == "message" and inp.settled is not None and (last is None or inp.seq > last.seq):
            last = inp
    if last is None or last.settled is None:
        return None, None
    return last.settled.outcome, last.settled.code


def last_record_ts(state: SessionState) -> int | None:
    """The latest time found in the records the state keeps (a lower bound of the
    session's last activity: step results and sleeps keep no time in the state)."""
    times: list[int] = []
    for inp in state.inputs.values():
        times.append(inp.record.ts)
        if inp.settled is not None:
            times.append(inp.settled.ts)
    for turn in state.turns:
        times.extend(r.ts for r in turn.responses)
        if turn.finished is not None:
            times.append(turn.finished.ts)
    for call in state.calls.values():
        for ask in call.asks.values():
            times.append(ask.opened.ts)
            if ask.answered is not None:
                times.append(ask.answered.ts)
        if call.result is not None:
            times.append(call.result.ts)
    return max(times) if times else None


def summarize(state: SessionState, *, now_ms: int, last_activity_ms: int | None = None) -> SessionSummary:
    """One session at a glance, as of ``now_ms``.

    Args:
        state: the folded session (``harness.replay.fold``).
        now_ms: the time to judge sleeps by (milliseconds since the epoch).
        last_activity_ms: the time of the session's last record, when the caller read
            it (the state alone does not keep every record's time).
    """
    name, until = classify(state, now_ms=now_ms)
    outcome, code = _last_outcome(state)
    active = state.active_turn
    return SessionSummary(
        session_id=state.session_id,
        harness=state.harness,
        state=name,
        last_activity=last_activity_ms if last_activity_ms is not None else last_record_ts(state),
        sleeping_until=until,
        open_asks=open_asks(state, now_ms=now_ms),
        turns=len(state.turns),
        last_outcome=outcome,
        last_code=code,
        active_input=active.input_id if active is not None else None,
        pending_inputs=len(state.pending_inputs()),
        usage=Usage.of(state.usage),
    )


# --- the timeline ------------------------------------------------------------------------------


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


def usage_text(usage: Usage) -> str:
    """``1,200 in / 340 out tokens, $0.0042`` (the cost only when known)."""
    text = f"{usage.input_tokens:,} in / {usage.output_tokens:,} out tokens"
    return f"{text}, ${usage.cost:.4g}" if usage.cost is not None else text


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
