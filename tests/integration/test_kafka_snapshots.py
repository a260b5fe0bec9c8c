"""Partition checkpoints: a rebuild from the latest checkpoint plus the tail gives the
same state as a rebuild from the start of the partition (they are an optimisation only)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from pydantic import BaseModel

from harness import HarnessHost, define_harness, durable_tool, tool_definition
from harness.log.base import Checkpoint, LogEntry
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


def ended_now(checkpoint: Checkpoint) -> dict[str, int]:
    """The sessions a checkpoint holds as ended (not live again)."""
    return {sid: first for sid, first in checkpoint.ended.items() if sid not in checkpoint.sessions}


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
        # The same sessions are ended now (the first may also know that s1 ended once);
        # every first position either names is the session's true first record.
        assert ended_now(from_checkpoint.checkpoint()) == ended_now(from_start.checkpoint())
        true_first: dict[str, int] = {}
        for entry in history:
            true_first.setdefault(entry.session_id, entry.seq)
        for rt in (from_checkpoint, from_start):
            assert {sid: true_first[sid] for sid in rt.checkpoint().ended} == dict(rt.checkpoint().ended)
    finally:
        await log.close()


async def test_no_checkpoint_reads_none(kafka_bootstrap: str, unique_prefix: str) -> None:
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=2)
    try:
        assert await log.snapshots.read(1) is None
    finally:
        await log.close()


def _snapshot_bytes(log: KafkaLog, partition: int, start: int) -> tuple[int, int]:
    """(bytes of the snapshot records from ``start`` on, the partition's end)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": log.settings.bootstrap, "group.id": "t-bytes", "enable.partition.eof": True})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(log.snapshots.topic, partition), timeout=10)
        consumer.assign([TopicPartition(log.snapshots.topic, partition, start)])
        total, seen = 0, start
        while seen < high:
            msg = consumer.poll(5)
            assert msg is not None, "the snapshot records did not come"
            if msg.error() is None:
                total += len(msg.value() or b"")
                seen = msg.offset() + 1
        return total, high
    finally:
        consumer.close()


async def test_a_checkpoint_writes_what_changed_not_every_session_the_partition_ever_had(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    """20,000 ended sessions are sealed into directory parts once; the next checkpoints
    write only the sessions ended since, and every reader still gets them all."""
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    try:
        ended = {f"chat-{i:06d}": 10 * i + 1 for i in range(20_000)}
        first = await log.snapshots.write(0, Checkpoint(covers=200_000, sessions={}, ended=ended))
        assert first.sealed == len(ended) and first.directory
        big, end = _snapshot_bytes(log, 0, 0)

        more = {f"late-{i}": 200_000 + i for i in range(100)}
        second = await log.snapshots.write(
            0, Checkpoint(covers=201_000, sessions={}, ended={**ended, **more}, directory=first.directory,
                          unsealed=tuple(more.items())))
        assert second.sealed == 0 and second.directory == first.directory
        small, _ = _snapshot_bytes(log, 0, end)
        assert small * 50 < big  # the 100 new ones, not the 20,100

        back = await log.snapshots.read(0)
        assert back is not None and back.covers == 201_000 and back.ended == {**ended, **more}
        # A new owner goes on from it: its runtime names the same parts and the new entries only.
        rt = PartitionRuntime(host=HarnessHost(log=log), harnesses={}, partition=0)
        rt.load_checkpoint(back)
        assert rt.checkpoint().directory == first.directory and rt.checkpoint().unsealed == tuple(more.items())
        # A reader that holds the parts reads only what is not in them.
        held = await log.snapshots.read(0, have={part_id for part_id, _ in first.directory})
        assert held is not None and held.ended == more
    finally:
        await log.close()


async def test_a_checkpoint_whose_records_are_not_all_there_gives_way_to_the_last_complete_one(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    """A writer that died before its header's records were in (or a header naming a part
    compaction lost): the reader takes the last complete checkpoint instead."""
    import json

    from confluent_kafka import Producer

    from harness.log.kafka import checkpoint_format as fmt

    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    try:
        ended = {f"s{i:06d}": i + 1 for i in range(20_000)}
        written = await log.snapshots.write(0, Checkpoint(covers=30_000, sessions={}, ended=ended))
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        broken = fmt.header_value("gone", 40_000, 1, 0, (*written.directory, ("never-written", 5)))
        producer.produce(log.snapshots.topic, key=fmt.header_key(0), value=broken, partition=0)
        producer.flush(10)
        assert json.loads(broken)["covers"] == 40_000
        back = await log.snapshots.read(0)
        assert back is not None and back.covers == 30_000 and back.ended == ended
    finally:
        await log.close()


async def test_a_listing_shows_a_session_live_again_with_its_records_not_as_ended(
    kafka_bootstrap: str, unique_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint names a session that ended once among its ended sessions and, live
    again, among its live ones: the listing summarizes it from its records (the ended
    ones are known by id: their history is past the listing's budget)."""
    from harness.runtime import session_index
    from harness.runtime.catalog import list_sessions

    monkeypatch.setattr(session_index, "HISTORY_BUDGET", 0)

    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    try:
        await _populate(log)
        history = await log.read_partition(0, 0)
        first: dict[str, int] = {}
        for entry in history:
            first.setdefault(entry.session_id, entry.seq)
        back = await log.read("s1")
        await log.snapshots.write(0, Checkpoint(covers=history[-1].seq, sessions={"s1": back}, ended=first))
        by_id = {s.session_id: s for s in await list_sessions(log)}
        assert not by_id["s1"].partial and by_id["s1"].turns == 1 and by_id["s1"].state == "idle"
        assert len(by_id) == 24 and all(by_id[f"s{i}"].partial for i in range(2, 24))
    finally:
        await log.close()


async def test_chunk_keys_a_checkpoint_no_longer_uses_are_tombstoned(kafka_bootstrap: str, unique_prefix: str) -> None:
    """Three live sessions of 300 kB each take three chunks; once they ended, the next
    checkpoint takes one and deletes the other two keys (compaction then drops them)."""
    from confluent_kafka import Consumer, TopicPartition

    from harness.log.kafka import checkpoint_format as fmt
    from harness.records import StepResult

    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    try:
        big = {f"big-{i}": [LogEntry(i + 1, StepResult(f"big-{i}", 0, "c", "s", "x" * 300_000))] for i in range(3)}
        await log.snapshots.write(0, Checkpoint(covers=10, sessions=big))
        await log.snapshots.write(0, Checkpoint(covers=20, sessions={}, ended={sid: e[0].seq for sid, e in big.items()}))
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "t-tomb", "enable.partition.eof": True})
        last: dict[bytes, bytes | None] = {}
        try:
            consumer.assign([TopicPartition(log.snapshots.topic, 0, 0)])
            while True:
                msg = consumer.poll(10)
                assert msg is not None
                if msg.error() is not None:
                    break  # the end of the partition
                last[msg.key()] = msg.value()
        finally:
            consumer.close()
        assert last[fmt.chunk_key(0, 0)] is not None
        assert last[fmt.chunk_key(0, 1)] is None and last[fmt.chunk_key(0, 2)] is None
        back = await log.snapshots.read(0)
        assert back is not None and back.covers == 20 and back.sessions == {} and set(back.ended) == set(big)
    finally:
        await log.close()
