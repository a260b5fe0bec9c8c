"""Settling inputs that arrive through the log, and judging answers (SPEC 3.2, 3.3).

Any server can take an answer, even one without the tool's code: the answer is
checked against the JSON schema recorded in ``harness.ask.opened``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonschema

from harness.context import check_app_records
from harness.errors import HarnessError
from harness.records import AskAnswered, InputAnswer, InputRecords, InputSettled, Record
from harness.replay.state import InputState, SessionState

__all__ = ["AnswerVerdict", "judge_answer", "settle_input"]


@dataclass(frozen=True, slots=True)
class AnswerVerdict:
    ok: bool
    code: str | None = None  # no_open_ask | already_answered | ask_expired | invalid_answer
    reason: str | None = None


def judge_answer(
    state: SessionState, tool_call_id: str, name: str, value: Any, now_ms: int
) -> AnswerVerdict:
    call = state.calls.get(tool_call_id)
    ask = call.asks.get(name) if call is not None else None
    if ask is None:
        return AnswerVerdict(False, "no_open_ask", f"no ask named {name!r} is open for call {tool_call_id!r}")
    if ask.answered is not None:
        return AnswerVerdict(False, "already_answered", f"ask {name!r} of call {tool_call_id!r} has its answer")
    if call is not None and call.result is not None:
        return AnswerVerdict(False, "no_open_ask", f"call {tool_call_id!r} has finished")
    expires = ask.opened.expires_at
    if expires is not None and now_ms >= expires:
        return AnswerVerdict(False, "ask_expired", f"ask {name!r} expired")
    try:
        jsonschema.validate(value, ask.opened.schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(answer)"
        return AnswerVerdict(False, "invalid_answer", f"the answer does not fit the ask's schema at {where}: {exc.message}")
    except jsonschema.SchemaError as exc:  # a schema we recorded ourselves: should not happen
        return AnswerVerdict(False, "invalid_answer", f"the ask's recorded schema is invalid: {exc.message}")
    return AnswerVerdict(True)


def settle_input(state: SessionState, inp: InputState, now_ms: int) -> list[Record]:
    """The records that settle an answer or app-records input taken from the log.

    An accepted answer lands as ``harness.ask.answered``; app records land when their
    input settles ``completed``; anything refused settles ``rejected`` with a code.
    """
    r = inp.record
    sid = state.session_id
    if isinstance(r, InputAnswer):
        verdict = judge_answer(state, r.tool_call_id, r.name, r.value, now_ms)
        if verdict.ok:
            return [
                AskAnswered(sid, now_ms, r.tool_call_id, r.name, r.value, r.input_id),
                InputSettled(sid, now_ms, r.input_id, "completed"),
            ]
        return [InputSettled(sid, now_ms, r.input_id, "rejected", verdict.code, verdict.reason)]
    if isinstance(r, InputRecords):
        try:
            check_app_records(r.records)
        except HarnessError as exc:
            return [InputSettled(sid, now_ms, r.input_id, "rejected", "invalid_records", str(exc))]
        return [InputSettled(sid, now_ms, r.input_id, "completed")]
    return []
