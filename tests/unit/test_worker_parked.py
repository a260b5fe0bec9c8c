"""Thousands of sessions parked on step.ask in one worker hold no thread and no
connection; every one of them goes on when its answer arrives through the log."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.log.memory import MemoryLog
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import InputAnswer, InputMessage, InputSettled
from harness.runtime.worker import Worker

SESSIONS = 2000


class Args(BaseModel):
    pass


class Ok(BaseModel):
    ok: bool


async def approve(args: Args, ctx: Any) -> dict[str, bool]:
    answer = await ctx.step.ask("approve", message="ok?", schema=Ok)
    return {"ok": answer.ok}


HARNESS = define_harness(
    name="parked",
    model=ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(id="c1", name="approve", arguments={})]), ModelResponse(text="done")]
    ),
    tools=[durable_tool(tool_definition(name="approve", description="ask", input_schema=Args), approve)],
)


async def _until(predicate: Any, rounds: int = 4000) -> None:
    for _ in range(rounds):
        if await predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def test_thousands_of_parked_sessions_per_worker() -> None:
    log = MemoryLog()
    worker = Worker(log=log, harnesses=[HARNESS])
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    await worker.ready.wait()
    threads_before = set(threading.enumerate())
    for i in range(SESSIONS):
        await log.submit(InputMessage(f"s{i}", 0, "in-1", "approve?", "parked"))

    async def all_parked() -> bool:
        entries = await log.read_all()
        return sum(e.type == "harness.ask.opened" for e in entries) == SESSIONS

    await _until(all_parked)
    new_threads = set(threading.enumerate()) - threads_before
    # parked tools hold no thread (a thread of an earlier test may end meanwhile); the
    # host's one loop watchdog starts with its poller, whatever the number of sessions
    assert len([t for t in new_threads if t.name == "harness-loop-watchdog"]) <= 1
    assert not {t for t in new_threads if t.name != "harness-loop-watchdog"}
    for i in range(SESSIONS):
        await log.submit(InputAnswer(f"s{i}", 0, "a-1", "c1", "approve", {"ok": True}))

    async def all_settled() -> bool:
        entries = await log.read_all()
        done = {e.session_id for e in entries if isinstance(e.record, InputSettled) and e.record.input_id == "in-1"}
        return len(done) == SESSIONS

    await _until(all_settled)
    stop.set()
    await run
    entries = await log.read_all()
    outcomes = {e.record.outcome for e in entries if isinstance(e.record, InputSettled) and e.record.input_id == "in-1"}
    assert outcomes == {"completed"}
