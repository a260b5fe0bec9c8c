"""A session core nobody references any more is freed at once by reference counting.

A worker forgets ended sessions all the time; when the core's parts (its driver, its
ownership's lost-lease callback) pointed back at it strongly, every forgotten session
left a cycle of ~34 objects for the cyclic collector, whose middle-generation passes
then stopped a busy worker's loop for 0.3-0.5 s every ~25 s. These run with the
collector off: a core that is only freed by it fails them.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from harness import HarnessHost, define_harness, durable_tool, tool_definition
from harness.log.memory import MemoryLog
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import InputMessage, InputSettled
from harness.runtime.partition import PartitionRuntime


class Work(BaseModel):
    steps: int


async def _work(args: Work, ctx: Any) -> dict[str, int]:
    for i in range(args.steps):
        await ctx.step.do(f"s{i}", lambda: 1)
    return {"steps": args.steps}


def _script(messages: list[dict[str, Any]]) -> ModelResponse:
    if messages[-1]["role"] == "tool":
        return ModelResponse(text="done")
    return ModelResponse(text="working", tool_calls=[ToolCall(id="w", name="work", arguments={"steps": 3})])


def _harness():
    tool = durable_tool(tool_definition(name="work", description="steps", input_schema=Work), _work)
    return define_harness(name="w", model=ScriptedModel(_script), tools=[tool])


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_a_core_the_worker_forgets_is_freed_without_the_cyclic_collector(collector_off: None) -> None:
    log = MemoryLog()
    host = HarnessHost(log=log)
    rt = PartitionRuntime(host=host, harnesses={"w": _harness()})
    await rt.go_live()
    await rt.ingest([await log.submit(InputMessage("s", 0, "in-1", "go", "w"))])
    settled = False
    for _ in range(10_000):  # feed the runtime what the log committed, as a tail would
        entries = [e for e in await log.read_all() if e.seq > rt.position]
        await rt.ingest(entries)
        settled = settled or any(isinstance(e.record, InputSettled) for e in entries)
        if settled and not rt.sessions["s"].busy:
            break
        await asyncio.sleep(0)  # (one loop step: the driver runs)
    assert settled and not rt.sessions["s"].busy
    core = weakref.ref(rt.sessions["s"])
    assert rt.forget_idle() == 1
    await asyncio.sleep(0)  # (the loop lets go of the driver's finished task)
    assert core() is None
    await rt.stop()


async def test_a_closed_session_handle_frees_its_core(collector_off: None) -> None:
    async with HarnessHost(log=MemoryLog()) as host:
        session = await host.open(_harness(), session_id="s")
        result = await session.send("go")
        assert result.text == "done"
        core = weakref.ref(session._core)
        await session.close()
        del session
        await asyncio.sleep(0)
        assert core() is None
