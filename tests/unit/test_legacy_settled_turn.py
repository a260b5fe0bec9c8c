"""A turn whose input already has its verdict, left open by an older version, is closed.

Before the fix of the cancel race (a cancel taken while its input's turn was being
started), the cancel was settled as for a queued input (``aborted``) and the turn ran on:
its tool parked on an ask for good and each later message of the session queued behind
it. Logs written then hold such sessions. The next owner (a worker, or a handle's
``recover``) closes that turn (``aborted`` / ``input_already_settled``) from the folded log,
runs nothing more of it, settles nothing twice, refuses answers to its asks, and goes on
with the session's next input. Memory and SQLite here; Kafka in tests/integration.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from harness import FakeClock, HarnessHost, define_harness, durable_tool, tool_definition
from harness.log.base import SessionLog
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import (
    AskAnswered,
    AskOpened,
    InputAnswer,
    InputCancel,
    InputMessage,
    InputSettled,
    ModelResponseRecord,
    Record,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnResumed,
    TurnStarted,
)
from harness.runtime.worker import Worker

from .conftest import LEASE, POLL, Args, eventually

SID = "legacy"
ASK_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


class Ok(BaseModel):
    ok: bool


class App:
    """A harness whose ``approve`` tool asks; counts what runs."""

    def __init__(self) -> None:
        self.tool_runs = 0
        self.model_calls: list[str] = []  # the last user message of each model call

    def harness(self) -> Any:
        async def approve(args: Args, ctx: Any) -> dict[str, Any]:
            self.tool_runs += 1
            answer = await ctx.step.ask("approve", message="ok?", schema=Ok)
            return {"ok": answer.ok}

        async def script(messages: list[dict[str, Any]]) -> ModelResponse:
            last_user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
            self.model_calls.append(last_user)
            if last_user == "approve it":
                return ModelResponse(tool_calls=[ToolCall(id="c1", name="approve", arguments={})])
            return ModelResponse(text=f"hello: {last_user}")

        tool = durable_tool(tool_definition(name="approve", description="d", input_schema=Args), approve, replay="safe")
        return define_harness(name="app", model=ScriptedModel(script), tools=[tool])


async def write_legacy_log(log: SessionLog, now: int = 1) -> None:
    """The exact records the old bug left, then an answer to the stuck ask and a next message."""
    await log.submit(InputMessage(SID, now, "in-1", "approve it", "app"))
    await log.submit(InputCancel(SID, now, "cancel:in-1", "in-1"))
    writer = await log.claim(SID, owner="old-version", lease=timedelta(seconds=5))
    owner_records: list[list[Record]] = [
        # the cancel, taken while in-1's turn was being started, settled as for a queued input
        [InputSettled(SID, now, "in-1", "aborted", "cancelled", "the input was cancelled"),
         InputSettled(SID, now, "cancel:in-1", "completed")],
        # ... and the turn started anyway, its first answer riding with the start
        [TurnStarted(SID, now, "in-1", 1),
         ModelResponseRecord(SID, now, 1, 0, None, ({"id": "c1", "name": "approve", "arguments": {}},)),
         ToolStarted(SID, now, "c1", "approve", 1)],
        [AskOpened(SID, now, "c1", "approve", "ok?", ASK_SCHEMA)],  # parked there for good
    ]
    for batch in owner_records:
        await writer.append(batch)
    await writer.release()
    await log.submit(InputAnswer(SID, now, "answer-1", "c1", "approve", {"ok": True}))
    await log.submit(InputMessage(SID, now, "in-2", "next", "app"))


async def check_closed_and_went_on(log: SessionLog, app: App) -> None:
    entries = await log.read(SID)
    of = lambda kind: [e.record for e in entries if isinstance(e.record, kind)]  # noqa: E731
    assert [(f.turn, f.input_id, f.outcome, f.code) for f in of(TurnFinished)] == [
        (1, "in-1", "aborted", "input_already_settled"), (2, "in-2", "completed", None),
    ]
    assert "input 'in-1' had already settled aborted (cancelled)" in (of(TurnFinished)[0].error or "")
    verdicts = [(s.input_id, s.outcome, s.code) for s in of(InputSettled)]
    assert verdicts == [
        ("in-1", "aborted", "cancelled"), ("cancel:in-1", "completed", None),  # the old version's
        ("answer-1", "rejected", "no_open_ask"), ("in-2", "completed", None),  # in-1 once: its verdict stands
    ]
    assert of(AskAnswered) == [] and of(ToolResult) == []
    assert of(TurnResumed) == []  # closed, not taken over
    assert app.tool_runs == 0  # nothing more of the turn ran: no tool ...
    assert app.model_calls == ["next"]  # ... and no model call, only turn 2's


async def test_a_worker_closes_a_legacy_turn_whose_input_was_settled_and_runs_the_next_input(
    log: SessionLog, clock: FakeClock
) -> None:
    await write_legacy_log(log)
    app = App()
    clock.advance(60)  # (the old owner's lease ran out long ago)
    worker = Worker(log=log, harnesses=[app.harness()], clock=clock, lease=LEASE, poll_interval=POLL)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:
        async def next_done() -> bool:
            return any(isinstance(e.record, InputSettled) and e.record.input_id == "in-2" for e in await log.read(SID))

        await eventually(next_done, tries=20000)
    finally:
        stop.set()
        await run
    await check_closed_and_went_on(log, app)


async def test_recover_closes_a_legacy_turn_and_a_restart_changes_nothing_more(log: SessionLog, clock: FakeClock) -> None:
    await write_legacy_log(log)
    app = App()
    clock.advance(60)
    async with HarnessHost(log=log, clock=clock, lease=LEASE, poll_interval=POLL) as host:
        session = await host.open(app.harness(), session_id=SID)
        results = await asyncio.wait_for(session.recover(), 30)
        assert [(r.input_id, r.outcome) for r in results] == [
            ("in-1", "aborted"), ("answer-1", "rejected"), ("in-2", "completed"),
        ]
    await check_closed_and_went_on(log, app)
    written = len(await log.read(SID))
    clock.advance(60)
    async with HarnessHost(log=log, clock=clock, lease=LEASE, poll_interval=POLL) as host:  # a restart
        session = await host.open(app.harness(), session_id=SID)
        assert await asyncio.wait_for(session.recover(), 30) == []
    assert len(await log.read(SID)) == written
    await check_closed_and_went_on(log, app)
