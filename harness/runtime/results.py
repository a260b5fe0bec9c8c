"""What a session's state says about an input: settled, waiting for a person, or neither.

Pure functions over ``SessionState`` (the live driver adds what only it knows: which
calls are running and which of them are parked).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from typing import Any

from harness.replay.state import SessionState

__all__ = ["OpenAsk", "TurnResult", "open_asks", "settled_result", "waiting_in_log", "waiting_live"]


@dataclass(frozen=True, slots=True)
class OpenAsk:
    """A question a parked tool is waiting on."""

    tool_call_id: str
    name: str
    message: str
    schema: dict[str, Any]
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class TurnResult:
    """How an input ended.

    ``outcome`` is ``completed``, ``failed`` or ``aborted`` once the input
    settled, ``rejected`` for an input the owner refused, or ``waiting`` while
    the turn is parked on a person's answer (``waiting`` lists the open asks;
    ``session.answer`` resumes it).
    """

    input_id: str
    outcome: str
    text: str | None = None
    code: str | None = None
    error: str | None = None
    waiting: tuple[OpenAsk, ...] = ()


def settled_result(state: SessionState, input_id: str) -> TurnResult | None:
    """The result of ``input_id`` if it settled."""
    inp = state.inputs.get(input_id)
    if inp is None or inp.settled is None:
        return None
    s = inp.settled
    turn = state.turn_of(input_id)
    fin = turn.finished if turn is not None else None
    return TurnResult(
        input_id=input_id,
        outcome=s.outcome,
        text=fin.text if fin is not None else None,
        code=s.code,
        error=(fin.error if fin is not None else None) or s.reason,
    )


def open_asks(state: SessionState) -> tuple[OpenAsk, ...]:
    """Every ask opened by an unfinished call of the active turn and not answered yet."""
    out = []
    active = state.active_turn
    for call in state.calls.values():
        if call.result is not None or active is None or call.turn != active.turn:
            continue
        for name, ask in call.asks.items():
            if ask.answered is None:
                o = ask.opened
                expires = o.expires_at / 1000 if o.expires_at else None
                out.append(OpenAsk(call.tool_call_id, name, o.message, o.schema, expires))
    return tuple(out)


def waiting_live(
    state: SessionState, input_id: str, running: Set[str], parked: Set[str]
) -> TurnResult | None:
    """``waiting`` for the driver: every running call is parked on an ask still open
    (a parked call whose answer already committed is about to wake: not waiting)."""
    if not running or not running <= parked:
        return None
    asks = open_asks(state)
    if running <= {a.tool_call_id for a in asks}:
        return TurnResult(input_id=input_id, outcome="waiting", waiting=asks)
    return None


def waiting_in_log(state: SessionState, input_id: str) -> TurnResult | None:
    """``waiting`` as the log shows it, for a handle that does not drive the turn."""
    turn = state.turn_of(input_id)
    last = turn.last_response if turn is not None and turn.finished is None else None
    if last is None:
        return None
    open_calls = [c for c in state.batch(last) if c.result is None]
    if open_calls and all(c.waiting_for_person() for c in open_calls):
        return TurnResult(input_id=input_id, outcome="waiting", waiting=open_asks(state))
    return None
