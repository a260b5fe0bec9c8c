"""Session views for the API and the console (a stand-in, PURE: no I/O).

The CLI's ``harness.views`` (``summarize(state, now_ms=)`` and ``timeline(entries)``)
is the one source of truth for how a session reads; until it is in the library this
module gives the same two functions with the same names, so switching is one import
(see ``harness.services.gateway.app``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

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
    SleepScheduled,
    StepResult,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnResumed,
    TurnStarted,
)
from harness.replay.state import SessionState

__all__ = ["OpenAsk", "SessionSummary", "TimelineItem", "summarize", "timeline"]

PREVIEW = 120


@dataclass(frozen=True, slots=True)
class OpenAsk:
    tool_call_id: str
    name: str
    message: str
    schema: Any
    expires_at: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SessionSummary:
    session_id: str
    harness: str | None
    state: str  # running | waiting | sleeping | idle | failed
    last_activity: int | None
    open_asks: tuple[OpenAsk, ...] = ()
    sleeping_until: int | None = None
    turns: int = 0
    last_outcome: str | None = None
    last_code: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["open_asks"] = [a.to_json() for a in self.open_asks]
        return out


@dataclass(frozen=True, slots=True)
class TimelineItem:
    seq: int
    ts: int
    kind: str  # input | settled | turn | model | tool | step | sleep | ask | answer | result | record
    title: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _open_asks(state: SessionState) -> list[OpenAsk]:
    out = []
    for call in state.calls.values():
        if call.result is not None:
            continue
        for ask in call.asks.values():
            if ask.answered is None:
                o = ask.opened
                out.append(OpenAsk(o.tool_call_id, o.name, o.message, o.schema, o.expires_at))
    return out


def summarize(state: SessionState, *, now_ms: int, last_ts: int | None = None) -> SessionSummary:
    """How a session stands now."""
    asks = _open_asks(state) if state.active_turn is not None else []
    wake = [
        w
        for call in state.calls.values()
        if call.result is None
        for w in call.sleeps.values()
        if w > now_ms
    ]
    last = state.turns[-1].finished if state.turns else None
    if state.active_turn is not None:
        kind = "waiting" if asks else "sleeping" if wake else "running"
    elif state.pending_inputs():
        kind = "running"
    elif last is not None and last.outcome == "failed":
        kind = "failed"
    else:
        kind = "idle"
    return SessionSummary(
        session_id=state.session_id,
        harness=state.harness,
        state=kind,
        last_activity=last_ts,
        open_asks=tuple(asks),
        sleeping_until=min(wake) if wake and kind == "sleeping" else None,
        turns=len(state.turns),
        last_outcome=last.outcome if last is not None else None,
        last_code=last.code if last is not None else None,
    )


def _preview(value: Any) -> str:
    import json

    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def _item(entry: LogEntry) -> TimelineItem | None:
    r = entry.record
    seq, ts = entry.seq, r.ts
    if isinstance(r, InputMessage):
        return TimelineItem(seq, ts, "input", f"message: {_preview(r.text)}",
                            {"input_id": r.input_id, "text": r.text, "harness": r.harness})
    if isinstance(r, InputAnswer):
        return TimelineItem(seq, ts, "input", f"answer to {r.name}: {_preview(r.value)}",
                            {"input_id": r.input_id, "tool_call_id": r.tool_call_id, "name": r.name, "value": r.value})
    if isinstance(r, InputRecords):
        return TimelineItem(seq, ts, "input", f"{len(r.records or [])} app record(s) sent",
                            {"input_id": r.input_id, "records": r.records})
    if isinstance(r, InputSettled):
        why = f" ({r.code})" if r.code else ""
        return TimelineItem(seq, ts, "settled", f"input {r.input_id} {r.outcome}{why}",
                            {"input_id": r.input_id, "outcome": r.outcome, "code": r.code, "reason": r.reason})
    if isinstance(r, TurnStarted):
        return TimelineItem(seq, ts, "turn", f"turn {r.turn} started", {"turn": r.turn, "input_id": r.input_id})
    if isinstance(r, TurnResumed):
        return TimelineItem(seq, ts, "turn", f"turn {r.turn} taken over (attempt {r.attempt})",
                            {"turn": r.turn, "attempt": r.attempt})
    if isinstance(r, TurnFinished):
        why = f" ({r.code})" if r.code else ""
        return TimelineItem(seq, ts, "turn", f"turn {r.turn} {r.outcome}{why}",
                            {"turn": r.turn, "outcome": r.outcome, "text": r.text, "code": r.code, "error": r.error})
    if isinstance(r, ModelResponseRecord):
        calls = ", ".join(c["name"] for c in r.tool_calls)
        title = _preview(r.text) if r.text else ""
        if calls:
            title = f"{title} → calls {calls}".strip()
        return TimelineItem(seq, ts, "model", title or "(empty response)",
                            {"turn": r.turn, "text": r.text, "tool_calls": list(r.tool_calls)})
    if isinstance(r, ToolStarted):
        return TimelineItem(seq, ts, "tool", f"{r.name} started (run {r.attempt})",
                            {"tool_call_id": r.tool_call_id, "name": r.name, "attempt": r.attempt})
    if isinstance(r, StepResult):
        return TimelineItem(seq, ts, "step", f"step {r.name}: {_preview(r.value)}",
                            {"tool_call_id": r.tool_call_id, "name": r.name, "value": r.value})
    if isinstance(r, SleepScheduled):
        return TimelineItem(seq, ts, "sleep", f"sleep {r.name} until {r.wake_at}",
                            {"tool_call_id": r.tool_call_id, "name": r.name, "wake_at": r.wake_at})
    if isinstance(r, AskOpened):
        return TimelineItem(seq, ts, "ask", f"asks: {r.message}",
                            {"tool_call_id": r.tool_call_id, "name": r.name, "message": r.message,
                             "schema": r.schema, "expires_at": r.expires_at})
    if isinstance(r, AskAnswered):
        return TimelineItem(seq, ts, "answer", f"{r.name} answered: {_preview(r.value)}",
                            {"tool_call_id": r.tool_call_id, "name": r.name, "value": r.value})
    if isinstance(r, ToolResult):
        status = f"error ({r.code})" if r.is_error else "ok"
        return TimelineItem(seq, ts, "result", f"{r.name} {status}: {_preview(r.content)}",
                            {"tool_call_id": r.tool_call_id, "name": r.name, "content": r.content,
                             "is_error": r.is_error, "code": r.code})
    if isinstance(r, AppRecord):
        return TimelineItem(seq, ts, "record", f"record {r.record_type}", {"body": r.body})
    return TimelineItem(seq, ts, "record", r.TYPE, {})


def timeline(entries: Sequence[LogEntry]) -> list[TimelineItem]:
    """The session's records as a person reads them, in log order."""
    return [item for item in (_item(e) for e in entries) if item is not None]
