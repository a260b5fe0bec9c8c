"""Partition checkpoints: a rebuild from the latest checkpoint plus the tail gives the
same state as a rebuild from the start of the partition (they are an optimisation only)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from pydantic import BaseModel

from harness import HarnessHost, define_harness, durable_tool, tool_definition
from harness.log.kafka.log import KafkaLog
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import InputMessage
from harness.runtime.partition import PartitionRuntime

pytestmark = pytest.mark.kafka


class Args(BaseModel):
    park: bool = False


class Yes(BaseModel):
    ok: bool


async def work(args: Args, ctx) -> dict:
    await ctx.step.do("one", lambda: 1)
    if args.park:
        await ctx.step.ask("approve", message="ok?", schema=Yes)
    return {"done": True}


def harness_():
    def script(messages):
        if any(m["role"] == "assistant" for m in messages[-1:]) or sum(m["role"] == "assistant" for m in messages) % 2:
            return ModelResponse(text="done")
        park = "park" in [m for m in messages if m["role"] == "user"][-1]["content"]
        n = sum(m["role"] == "user" for m in messages)
        return ModelResponse(tool_calls=[ToolCall(id=f"c{n}", name="work", arguments={"park": park})])

    tool = durable_tool(tool_definition(name="work", description="w", input_schema=Args), work)
    return define_harness(name="snap", model=ScriptedModel(script), tools=[tool])


async def _populate(log: KafkaLog) -> None:
    host = HarnessHost(log=log, lease=timedelta(seconds=5))
    h = harness_()
    sessions = [await host.open(h, session_id=f"s{i}") for i in range(24)]
    results = await asyncio.gather(*(s.send("park" if i % 6 == 0 else "go", input_id="in-1") for i, s in enumerate(sessions)))
    assert {r.outcome for r in results} == {"completed", "waiting"}
    await host.close()


async def test_rebuild_from_checkpoint_equals_rebuild_from_start(kafka_bootstrap: str, unique_prefix: str) -> None:
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    try:
        await _populate(log)
        history = await log.read_partition(0, 0)
        settled = [i for i, e in enumerate(history) if e.type == "harness.input.settled"]
        cut = settled[len(settled) // 2] + 1  # half the finished sessions ended before the cut
        # An ended session comes back after the checkpoint: its history must be read back.
        await log.submit(InputMessage("s1", 0, "in-2", "go again", "snap"))
        host = HarnessHost(log=log)

        first = PartitionRuntime(host=host, harnesses={}, partition=0)
        first.rebuild(history[:cut])
        await first.forget_ended()
        checkpoint = first.checkpoint()
        assert checkpoint.ended and checkpoint.sessions  # both kinds are in it
        await log.snapshots.write(0, checkpoint)
        assert await log.snapshots.read(0) == checkpoint

        from_checkpoint = PartitionRuntime(host=host, harnesses={}, partition=0)
        from_checkpoint.load_checkpoint(await log.snapshots.read(0))
        tail = await log.read_partition(0, from_checkpoint.position)
        assert len(tail) < len(history)  # the point: less to read
        from_checkpoint.rebuild(tail)
        live_a = await from_checkpoint.forget_ended()

        from_start = PartitionRuntime(host=host, harnesses={}, partition=0)
        from_start.rebuild(await log.read_partition(0, 0))
        live_b = await from_start.forget_ended()

        assert live_a == live_b
        assert "s1" in live_a  # came back after the checkpoint, with its whole history
        assert len(live_a["s1"].turns) == 1 and "in-2" in live_a["s1"].inputs
        assert from_checkpoint.checkpoint().ended == from_start.checkpoint().ended
    finally:
        await log.close()


async def test_no_checkpoint_reads_none(kafka_bootstrap: str, unique_prefix: str) -> None:
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=2)
    try:
        assert await log.snapshots.read(1) is None
    finally:
        await log.close()
