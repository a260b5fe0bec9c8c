"""One session at a glance: :func:`summarize` and what it is made of.

PURE (see :mod:`harness.views`). A session's state name (:func:`classify`), its open asks
(:class:`OpenAsk`) and sleeps (:class:`OpenSleep`), what its model calls used
(:class:`Usage`), all in one :class:`SessionSummary`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from harness.replay.state import AskState, CallState, SessionState, UsageTotals

__all__ = [
    "SESSION_STATES",
    "OpenAsk",
    "OpenSleep",
    "SessionStateName",
    "SessionSummary",
    "Usage",
    "classify",
    "input_queued_behind_person",
    "input_waits_for_person",
    "last_record_ts",
    "open_asks",
    "open_sleeps",
    "summarize",
    "usage_text",
]

SessionStateName = Literal["running", "waiting", "sleeping", "idle", "failed", "unreadable"]
SESSION_STATES: tuple[str, ...] = ("running", "waiting", "sleeping", "idle", "failed", "unreadable")
"""``running``: a turn (or an input) is being worked on, or waits for its owner;
``waiting``: every open tool call waits for a person's answer; ``sleeping``: every
open tool call sleeps (or waits for a person) until a wake time; ``idle``: nothing
to do; ``failed``: nothing to do and the last message's turn failed (or was rejected);
``unreadable``: a record of the session cannot be read (see :func:`summarize`)."""

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


def usage_text(usage: Usage) -> str:
    """``1,200 in / 340 out tokens, $0.0042`` (the cost only when known)."""
    text = f"{usage.input_tokens:,} in / {usage.output_tokens:,} out tokens"
    return f"{text}, ${usage.cost:.4g}" if usage.cost is not None else text


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


def summarize(
    state: SessionState, *, now_ms: int, last_activity_ms: int | None = None, unreadable: int = 0
) -> SessionSummary:
    """One session at a glance, as of ``now_ms``.

    A session with an unreadable record (``unreadable`` > 0) is ``unreadable``, whatever its
    readable records look like: the state folded without that record is a guess (its
    ``turn.finished`` unread, a cancelled turn parked on an ask looks ``waiting``, a
    completed one ``running``), and its owner parks it: nothing of it runs and an answer or
    a message is refused (``session_unreadable``) until the record is repaired. So it lists
    no open ask and no wake time (nobody can act on them); the rest (turns, the last
    outcome, usage, the active input) is what its readable records say.

    Args:
        state: the folded session (``harness.replay.fold``) of its readable records.
        now_ms: the time to judge sleeps by (milliseconds since the epoch).
        last_activity_ms: the time of the session's last record, when the caller read
            it (the state alone does not keep every record's time).
        unreadable: how many of the session's records could not be read (left out of
            ``state``).
    """
    name, until = classify(state, now_ms=now_ms)
    asks = open_asks(state, now_ms=now_ms)
    if unreadable:
        name, until, asks = "unreadable", None, ()
    outcome, code = _last_outcome(state)
    active = state.active_turn
    return SessionSummary(
        session_id=state.session_id,
        harness=state.harness,
        state=name,
        last_activity=last_activity_ms if last_activity_ms is not None else last_record_ts(state),
        sleeping_until=until,
        open_asks=asks,
        turns=len(state.turns),
        last_outcome=outcome,
        last_code=code,
        active_input=active.input_id if active is not None else None,
        pending_inputs=len(state.pending_inputs()),
        usage=Usage.of(state.usage),
    )
