"""What a message or answer POST that waits (``?wait=SECONDS``) answers: how its turn ended,
or that it waits for a person, read from the session's folded state (pure: no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.records import InputAnswer
from harness.replay.state import SessionState
from harness.views import OpenAsk, input_queued_behind_person, input_waits_for_person, open_asks

__all__ = ["RUNNING", "Settlement", "answer_settlement_of", "settlement_of"]


@dataclass(frozen=True, slots=True)
class Settlement:
    """``outcome``: the input's settlement (``completed``, ``failed``, ``aborted``,
    ``rejected``, with its ``code`` and ``reason``, and the turn's answer ``text``),
    ``waiting`` (its turn waits for a person: ``asks``; or it is queued behind a turn that
    does: ``queued_behind`` names that turn's input) or ``running`` (neither within the
    wait: the turn goes on, and the session's events show how)."""

    outcome: str
    code: str | None = None
    reason: str | None = None
    text: str | None = None
    asks: tuple[OpenAsk, ...] = ()
    queued_behind: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"outcome": self.outcome}
        for name in ("code", "reason", "text", "queued_behind"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.outcome == "waiting":
            out["asks"] = [ask.to_json() for ask in self.asks]
        return out


RUNNING = Settlement("running")
"""Not settled, and not waiting for a person, when the wait ended."""


def settlement_of(state: SessionState, input_id: str, *, now_ms: int) -> Settlement | None:
    """How ``input_id`` ended, or that its turn waits for a person; None: neither yet."""
    inp = state.inputs.get(input_id)
    if inp is None:
        return None
    settled = inp.settled
    if settled is not None:
        turn = state.turn_of(input_id)
        text = turn.finished.text if turn is not None and turn.finished is not None else None
        return Settlement(settled.outcome, settled.code, settled.reason, text)
    if input_waits_for_person(state, input_id, now_ms=now_ms):
        return Settlement("waiting", asks=open_asks(state, now_ms=now_ms))
    behind = input_queued_behind_person(state, input_id, now_ms=now_ms)
    if behind is not None:  # (it runs once that turn's ask is answered: say which)
        return Settlement("waiting", asks=open_asks(state, now_ms=now_ms), queued_behind=behind)
    return None


def answer_settlement_of(state: SessionState, input_id: str, *, now_ms: int) -> Settlement | None:
    """For the answer ``input_id``: its refusal once the owner refused it, else, once the
    owner took it, how the turn it resumed ended (or that it waits for a person again);
    None: neither yet."""
    inp = state.inputs.get(input_id)
    if inp is None or inp.settled is None or not isinstance(inp.record, InputAnswer):
        return None
    settled = inp.settled
    if settled.outcome != "completed":
        return Settlement(settled.outcome, settled.code, settled.reason)
    call = state.calls.get(inp.record.tool_call_id)
    if call is None or not 0 < call.turn <= len(state.turns):
        return None
    return settlement_of(state, state.turns[call.turn - 1].input_id, now_ms=now_ms)
