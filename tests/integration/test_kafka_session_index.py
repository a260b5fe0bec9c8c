"""KafkaSessionIndex: a long-running reader (the gateway) lists a Kafka log's sessions and
reads each partition only from where its previous listing stopped."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from harness import HarnessHost, define_harness, durable_tool, tool_definition
from harness.log.kafka.log import KafkaLog
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.runtime.catalog import KafkaSessionIndex, list_sessions, sort_summaries

pytestmark = pytest.mark.kafka


class Args(BaseModel):
    park: bool = False


class Yes(BaseModel):
    ok: bool


async def work(args: Args, ctx: Any) -> dict[str, bool]:
    await ctx.step.do("one", lambda: 1)
    if args.park:
        await ctx.step.ask("approve", message="ok?", schema=Yes)
    return {"done": True}


def script(messages: list[dict[str, Any]]) -> ModelResponse:
    if messages[-1]["role"] == "tool":
        return ModelResponse(text="done")
    n = sum(m["role"] == "user" for m in messages)
    park = "park" in messages[-1]["content"]
    return ModelResponse(tool_calls=[ToolCall(id=f"c{n}", name="work", arguments={"park": park})])


HARNESS = define_harness(
    name="kafka-index",
    model=ScriptedModel(script),
    tools=[durable_tool(tool_definition(name="work", description="w", input_schema=Args), work)],
)


class CountingLog:
    """A Kafka log that counts the records its partition scans and its by-id scans return."""

    def __init__(self, log: KafkaLog) -> None:
        self._log = log
        self.partition_records = 0
        self.by_id = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    async def scan_partition(self, partition: int, start: int = 0, end: int | None = None) -> Any:
        items = await self._log.scan_partition(partition, start, end)
        self.partition_records += len(items)
        return items

    async def scan(self, session_id: str | None = None, **kwargs: Any) -> Any:
        items = await self._log.scan(session_id, **kwargs)
        if session_id is not None:
            self.by_id += len(items)
        return items


def _json(summaries: list[Any]) -> list[dict[str, Any]]:
    return [s.to_json() for s in sort_summaries(summaries)]


async def _records(log: KafkaLog) -> int:
    return sum([len(await log.read_partition(p, 0)) for p in range(log.settings.partitions)])


async def test_a_kafka_index_lists_what_a_fresh_listing_lists_and_reads_only_what_is_new(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=2)
    counting = CountingLog(log)
    index = KafkaSessionIndex(counting)  # type: ignore[arg-type]
    host = HarnessHost(log=log, lease=timedelta(seconds=5))
    try:
        done = await host.open(HARNESS, session_id="done")
        assert (await done.send("go", input_id="m1")).outcome == "completed"
        waiting = await host.open(HARNESS, session_id="waiting")
        assert (await waiting.send("park", input_id="m1")).outcome == "waiting"

        first = await index.summaries()
        assert _json(first) == _json(await list_sessions(log))
        assert {s.session_id: s.state for s in first} == {"done": "idle", "waiting": "waiting"}
        read_once, records_then = counting.partition_records, await _records(log)
        assert read_once == records_then  # no checkpoint yet: each partition read whole, once

        assert _json(await index.summaries()) == _json(first)
        assert counting.partition_records == read_once  # nothing new: nothing read

        # New records: a quiet session gets a message (read again by its id), an ask is
        # answered, a new session starts.
        assert (await done.send("go", input_id="m2")).outcome == "completed"
        assert (await waiting.answer("c1", "approve", {"ok": True})).outcome == "completed"
        fresh = await host.open(HARNESS, session_id="fresh")
        assert (await fresh.send("go", input_id="m1")).outcome == "completed"

        later = await index.summaries()
        assert _json(later) == _json(await list_sessions(log))
        assert {s.session_id: (s.state, s.turns) for s in later} == {
            "done": ("idle", 2),
            "waiting": ("idle", 1),
            "fresh": ("idle", 1),
        }
        assert counting.partition_records == read_once + (await _records(log) - records_then)  # only the new
        assert counting.by_id > 0  # the quiet sessions that came back were read by id
    finally:
        await host.close()
        await log.close()
