"""A worker's rebuild reads lazily: the result equals the eager read, and a record whose
framing is fine but whose body is not is reported and parks its session (never driven:
issue 7), never fatal for the others."""

from __future__ import annotations

from datetime import timedelta

import confluent_kafka as ck
import pytest

from harness import HarnessHost
from harness.codec import default_codec
from harness.errors import CorruptRecord
from harness.log.kafka.log import KafkaLog
from harness.log.kafka.reader import LazyEntry
from harness.records import (
    InputMessage,
    InputSettled,
    ModelResponseRecord,
    StepResult,
    TurnFinished,
    TurnStarted,
)
from harness.runtime.partition import PartitionRuntime

pytestmark = pytest.mark.kafka


async def _populate(log: KafkaLog) -> None:
    for i in range(6):
        sid = f"s{i}"
        writer = await log.claim(sid, owner="w", lease=timedelta(seconds=5))
        records = [
            InputMessage(sid, 0, "in-1", "hi", "h"),
            TurnStarted(sid, 0, "in-1", 1),
            ModelResponseRecord(sid, 0, 1, 0, "thinking", ()),
        ]
        if i % 2 == 0:  # ended
            records += [TurnFinished(sid, 0, "in-1", 1, "completed", "ok"), InputSettled(sid, 0, "in-1", "completed")]
        await writer.append(records)
        await writer.release()


async def test_lazy_rebuild_equals_eager_and_skips_a_bad_body(kafka_bootstrap: str, unique_prefix: str) -> None:
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    try:
        await _populate(log)
        # Framing of a real StepResult, garbage body: only decoding it can tell.
        good = default_codec().encode(StepResult("s1", 0, "c1", "x", 1))
        poison = good[:10] + b"\xff" * 7
        producer = ck.Producer({"bootstrap.servers": kafka_bootstrap})
        producer.produce(log.settings.sessions_topic, key=b"s1", value=poison, partition=0)
        producer.flush(10)

        lazy = await log.read_partition(0, 0, lazy=True)
        assert all(isinstance(e, LazyEntry) for e in lazy)
        eager = await log.read_partition(0, 0)  # dead-letters the poison at read time
        assert len(lazy) == len(eager) + 1

        host = HarnessHost(log=log)
        reported: list[CorruptRecord] = []
        a = PartitionRuntime(host=host, harnesses={}, partition=0)
        a.on_corrupt = reported.append
        a.rebuild(lazy)
        live_a = await a.forget_ended()
        b = PartitionRuntime(host=host, harnesses={}, partition=0)
        b.rebuild(eager)
        live_b = await b.forget_ended()

        assert sorted(live_b) == ["s1", "s3", "s5"]  # the eager read skipped the poison unseen
        assert sorted(a.parked) == ["s1"]  # the lazy one found it: s1 is parked, not driven
        assert live_a == {sid: state for sid, state in live_b.items() if sid != "s1"}
        assert [c.session_id for c in reported] == ["s1"] and reported[0].raw == poison
        # A parked session is in a checkpoint as ended (so an owner that starts from it parks
        # it again when a record of it comes): from its first position.
        first_of_s1 = min(e.seq for e in lazy if e.session_id == "s1")
        assert a.checkpoint().ended == {**b.checkpoint().ended, "s1": first_of_s1}
        # Sessions that ended were classified without decoding their other records.
        ended_bodies = [e for e in lazy if e.session_id in ("s0", "s2", "s4") and e.type == "harness.model.response"]
        assert len(ended_bodies) == 3 and all(e._record is None for e in ended_bodies)
    finally:
        await log.close()
