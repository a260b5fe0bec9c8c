"""What each call on a session handle does, on the session's core.

``send``, ``answer``, ``append_records`` and ``cancel`` append their input record the
same way whoever owns the session (``log.submit``) and wait for the owner to take it in
log order (see ``harness.runtime.core``). An input id already used with another payload
is refused without writing anything (``input_conflict``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from harness.context import check_app_records
from harness.errors import InvalidAnswer, InvalidRecord
from harness.ids import answer_input_id, check_id, check_sent_input_id
from harness.jsonvalues import answer_copy, check_message, check_text, json_copy
from harness.records import (
    InputAnswer,
    InputCancel,
    InputMessage,
    InputRecords,
    LogEntry,
)
from harness.replay.payload import record_payload
from harness.runtime.answers import judge_answer
from harness.runtime.core import SessionCore
from harness.runtime.results import TurnResult

__all__ = ["answer", "append_records", "cancel", "events", "put_input", "records", "recover", "send"]


def new_input_id(core: SessionCore, prefix: str) -> str:
    """A random input id that holds none of the session's secrets."""
    while True:
        candidate = f"{prefix}-{uuid.uuid4().hex}"
        if core.scrubber.find_in_name(candidate) is None:
            return candidate


async def send(core: SessionCore, text: str, input_id: str | None) -> TurnResult:
    core.check_open()
    check_message(text, core.session_id)
    if input_id is None:
        input_id = new_input_id(core, "in")
    else:
        check_sent_input_id(input_id)
        core.check_name("input id", input_id)
    record = InputMessage(core.session_id, core.now_ms(), input_id, text, core.harness.name)
    return await put_input(core, record)


async def put_input(core: SessionCore, record: InputMessage | InputAnswer | InputRecords | InputCancel) -> TurnResult:
    """Append an input (unless its id is taken) and wait for its result."""
    core.check_open()
    await core.refresh()
    redacted = core.redact(record)
    first = core.state.inputs.get(record.input_id)
    seq: int | None = None
    if first is not None:
        if record_payload(first.record) != record_payload(redacted):
            return TurnResult(
                input_id=record.input_id,
                outcome="rejected",
                code="input_conflict",
                error=f"input id {record.input_id!r} was already used with another payload",
            )
    else:
        entry = await core.log.submit(redacted)
        seq = entry.seq
        await core.refresh()
    core.after_new_records()
    return await core.wait_result(record.input_id, seq)


async def recover(core: SessionCore) -> list[TurnResult]:
    core.check_open()
    await core.refresh()
    todo = [i.input_id for i in core.state.pending_inputs()]
    active = core.state.active_turn
    if active is not None:
        todo.insert(0, active.input_id)
    if not todo:
        return []
    core.kick()
    return [await core.wait_result(i) for i in todo]


async def answer(core: SessionCore, tool_call_id: str, name: str, value: Any, input_id: str | None) -> TurnResult | None:
    core.check_open()
    value = answer_copy(value)
    if input_id is None:
        input_id = answer_input_id(tool_call_id, name, value)
    else:
        check_id(input_id, "input id")
    core.check_name("input id", input_id)
    await core.refresh()
    if input_id not in core.state.inputs:
        verdict = judge_answer(
            core.state, tool_call_id, name, value, core.now_ms(), core.ask_models.get((tool_call_id, name))
        )
        if not verdict.ok:
            raise InvalidAnswer(
                verdict.reason or "answer refused",
                reason=verdict.code or "invalid_answer",
                session_id=core.session_id,
                tool_call_id=tool_call_id,
                name=name,
            )
    settled = await put_input(core,
        InputAnswer(core.session_id, core.now_ms(), input_id, tool_call_id, name, value)
    )
    if settled.outcome == "rejected":
        error, code = settled.error, settled.code
        if code == "input_conflict":  # (the id answered the ask first, with another value: say so, as the gateway does)
            verdict = judge_answer(core.state, tool_call_id, name, value, core.now_ms())
            if not verdict.ok:
                error, code = verdict.reason, verdict.code
        raise InvalidAnswer(
            error or "answer refused",
            reason=code or "invalid_answer",
            session_id=core.session_id,
            tool_call_id=tool_call_id,
            name=name,
        )
    call = core.state.calls.get(tool_call_id)
    if call is None:
        return None
    return await core.wait_result(core.state.turns[call.turn - 1].input_id)


async def append_records(core: SessionCore, records: list[dict[str, Any]], input_id: str | None) -> None:
    core.check_open()
    checked = [core.scrubber.redact(r) for r in check_app_records(records)]
    if input_id is None:
        input_id = new_input_id(core, "rec")
    check_sent_input_id(input_id)
    core.check_name("input id", input_id)
    settled = await put_input(core, InputRecords(core.session_id, core.now_ms(), input_id, checked))
    if settled.outcome == "rejected":
        raise InvalidRecord(settled.error or f"records refused ({settled.code})")


async def cancel(core: SessionCore, input_id: str) -> TurnResult:
    core.check_open()
    check_id(input_id, "input id")
    core.check_name("input id", input_id)
    request = InputCancel(core.session_id, core.now_ms(), f"cancel:{input_id}", input_id)
    verdict = await put_input(core, request)
    if verdict.outcome == "rejected" and verdict.code != "already_settled":
        return TurnResult(input_id=input_id, outcome="rejected", code=verdict.code, error=verdict.error)
    return await core.wait_result(input_id)


async def records(core: SessionCore, type_: str | None) -> list[dict[str, Any]]:
    core.check_open()
    if type_ is not None:  # (a number would match nothing: an empty list, silently)
        check_text(type_, what="records(type=) takes a record type or None; the type")
    await core.refresh()
    return [json_copy(e.body) for e in core.state.app_records if type_ is None or e.type == type_]


async def events(core: SessionCore, after: int | None) -> AsyncIterator[LogEntry]:
    position = -1 if after is None else after
    while not core.closed:
        entries = await core.log.read(core.session_id, after=position)
        for entry in entries:
            position = entry.seq
            yield entry
        if not entries:
            await core.next_change()
