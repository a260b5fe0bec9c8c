"""Settling inputs that arrive through the log, and judging answers (SPEC 3.2, 3.3).

An answer is judged by the tool's own pydantic model (its validators and formats)
when this process runs the parked tool (the ask registered it); any other server,
even one without the tool's code, checks it against the JSON schema recorded in
``harness.ask.opened``. A refused answer settles ``rejected`` and leaves the ask open.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
from pydantic import BaseModel, ValidationError

from harness.context import check_app_records
from harness.errors import HarnessError
from harness.jsonvalues import storable_text
from harness.records import AskAnswered, InputAnswer, InputCancel, InputRecords, InputSettled, Record
from harness.replay.state import InputState, SessionState
from harness.secrets import SecretScrubber

__all__ = ["AnswerVerdict", "judge_answer", "secret_refusal", "settle_conflict", "settle_input", "waiting_answers"]


@dataclass(frozen=True, slots=True)
class AnswerVerdict:
    ok: bool
    code: str | None = None  # no_open_ask | already_answered | ask_expired | invalid_answer | answer_waiting
    reason: str | None = None


def _as_json(exc: jsonschema.ValidationError) -> str:
    """jsonschema's message with the value as JSON, as the person wrote it ('true', not 'True')."""
    message = str(exc.message)
    try:
        return message.replace(repr(exc.instance), json.dumps(exc.instance), 1)
    except (TypeError, ValueError):
        return message


MODEL_ERRORS_SHOWN = 3
"""A refusal by the ask's model names at most this many of its errors (then how many more)."""


def _model_refusal(exc: ValidationError) -> str:
    """One line from pydantic's errors: where and what, without its banner and URL (the
    reason is stored in the settlement and shown by ``harness show`` and the console)."""
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or '(answer)'}: {' '.join(str(e['msg']).split())}"
        for e in exc.errors(include_url=False)
    ]
    more = len(parts) - MODEL_ERRORS_SHOWN
    text = "; ".join(parts[:MODEL_ERRORS_SHOWN]) + (f" (and {more} more)" if more > 0 else "")
    return f"the answer does not fit the ask's model: {text}"


def waiting_answers(state: SessionState) -> dict[tuple[str, str], str]:
    """``(tool_call_id, ask name) -> input id`` of each answer in the log that the
    session's owner has not taken yet (the first one per ask: it is the one judged first)."""
    out: dict[tuple[str, str], str] = {}
    for pending in state.pending_inputs():
        record = pending.record
        if isinstance(record, InputAnswer):
            out.setdefault((record.tool_call_id, record.name), pending.input_id)
    return out


def judge_answer(
    state: SessionState,
    tool_call_id: str,
    name: str,
    value: Any,
    now_ms: int,
    model: type[BaseModel] | None = None,
) -> AnswerVerdict:
    """Whether ``value`` answers the open ask ``name`` of call ``tool_call_id``.

    ``model``: the ask's pydantic model, when this process runs the parked tool.
    """
    call = state.calls.get(tool_call_id)
    ask = call.asks.get(name) if call is not None else None
    if ask is None or call is None:
        return AnswerVerdict(False, "no_open_ask", f"no ask named {name!r} is open for call {tool_call_id!r}")
    if ask.answered is not None:
        return AnswerVerdict(False, "already_answered", f"ask {name!r} of call {tool_call_id!r} has its answer")
    turn = state.turns[call.turn - 1] if 0 < call.turn <= len(state.turns) else None
    if call.result is not None or turn is None or turn.finished is not None:
        return AnswerVerdict(False, "no_open_ask", f"call {tool_call_id!r} has finished")
    settled = state.final_settlement(turn)
    if settled is not None:  # a left-over turn: its owner closes it, running nothing more
        return AnswerVerdict(
            False, "no_open_ask",
            f"call {tool_call_id!r} belongs to a turn whose input {turn.input_id!r} has settled {settled.outcome}",
        )
    expires = ask.opened.expires_at
    if expires is not None and now_ms >= expires:
        return AnswerVerdict(False, "ask_expired", f"ask {name!r} expired")
    if model is not None:
        try:
            model.model_validate(value)
        except ValidationError as exc:
            return AnswerVerdict(False, "invalid_answer", storable_text(_model_refusal(exc)))
        return AnswerVerdict(True)
    try:
        jsonschema.validate(value, ask.opened.schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(answer)"
        return AnswerVerdict(
            False, "invalid_answer", f"the answer does not fit the ask's schema at {where}: {_as_json(exc)}"
        )
    except jsonschema.SchemaError as exc:  # a schema we recorded ourselves: should not happen
        return AnswerVerdict(False, "invalid_answer", f"the ask's recorded schema is invalid: {exc.message}")
    return AnswerVerdict(True)


def settle_conflict(state: SessionState, conflict: InputState, now_ms: int) -> InputSettled:
    """Refuse a later record that reuses an input id with another payload."""
    return InputSettled(
        state.session_id,
        now_ms,
        conflict.input_id,
        "rejected",
        "input_conflict",
        f"input id {conflict.input_id!r} was already used with another payload",
        conflict.seq,
    )


def secret_refusal(session_id: str, inp: InputState, scrubber: SecretScrubber, now_ms: int) -> InputSettled | None:
    """The refusal of an input whose session id or own id holds one of the session's
    secrets, else None.

    In-process senders are refused before they write (``SecretInName``); this is for an
    input another process wrote without knowing the secrets (a gateway, a client). Its id
    stays as it is in the settlement (ids are never rewritten: a settlement under another
    id would never settle it), which writes nothing the input did not already hold.
    """
    found = scrubber.find_in_name(session_id)
    if found is not None:
        reason = f"the session id holds the session secret {found!r}: use a session id without it"
    elif (found := scrubber.find_in_name(inp.input_id)) is not None:
        reason = f"the input id holds the session secret {found!r}: send it again with an id without it"
    else:
        return None
    return InputSettled(session_id, now_ms, inp.input_id, "rejected", "secret_in_name", reason)


def settle_input(
    state: SessionState,
    inp: InputState,
    now_ms: int,
    models: Mapping[tuple[str, str], type[BaseModel]] | None = None,
) -> list[Record]:
    """The records that settle an answer, app-records or cancel input taken from the log.

    An accepted answer lands as ``harness.ask.answered``; app records land when their
    input settles ``completed``; anything refused settles ``rejected`` with a code.
    A cancel of a queued input settles both (the target ``aborted``); a cancel of the
    active turn's input is left to the driver (``[]``), which aborts the turn.
    """
    r = inp.record
    sid = state.session_id
    if isinstance(r, InputCancel):
        target = state.inputs.get(r.target_input_id)
        if target is None:
            reason = f"no input {r.target_input_id!r} in this session"
            return [InputSettled(sid, now_ms, r.input_id, "rejected", "unknown_input", reason)]
        if target.settled is not None:
            reason = f"input {r.target_input_id!r} had already settled {target.settled.outcome}"
            return [InputSettled(sid, now_ms, r.input_id, "rejected", "already_settled", reason)]
        if target.turn is not None:
            return []  # the active turn's input: the driver stops the turn (AbortTurn)
        return [
            InputSettled(sid, now_ms, r.target_input_id, "aborted", "cancelled", "the input was cancelled"),
            InputSettled(sid, now_ms, r.input_id, "completed"),
        ]
    if isinstance(r, InputAnswer):
        model = models.get((r.tool_call_id, r.name)) if models is not None else None
        verdict = judge_answer(state, r.tool_call_id, r.name, r.value, now_ms, model)
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
