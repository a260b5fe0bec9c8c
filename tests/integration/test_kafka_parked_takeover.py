"""A parked session's verdicts across a Kafka takeover, on a real broker.

The first owner parks session ``bad`` (an unreadable record) but cannot write its
inputs' verdicts (here: every claim of ``bad`` fails as a short outage would); the
partition checkpoint it writes meanwhile names ``bad`` in ``reread``. It stops; the
next owner starts from that checkpoint (no record of ``bad`` after it), reads ``bad``
whole, parks it again and writes the verdicts: each sender gets its answer, once, and
the unreadable record is not dead-lettered again.
"""

from __future__ import annotations

import asyncio
import zlib
from datetime import timedelta
from typing import Any

import confluent_kafka as ck
import pytest
from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.client import HarnessClient
from harness.codec import default_codec
from harness.errors import CorruptRecord, LogUnavailable
from harness.ids import RECORD_CRC_HEADER, RECORD_TYPE_HEADER, message_key
from harness.log.kafka.inputs import DLQ_OFFSET_HEADER, DLQ_PARTITION_HEADER
from harness.log.kafka.log import KafkaLog
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import (
    InputMessage,
    InputSettled,
    LogEntry,
    ModelResponseRecord,
    StepResult,
    ToolStarted,
    TurnStarted,
)
from harness.runtime.worker import Worker
from tests.integration.test_kafka_log import consume_all

pytestmark = pytest.mark.kafka


class Args(BaseModel):
    order_id: str = "42"


def shop(charges: list[str]) -> Any:
    async def checkout(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("charge", lambda: charges.append(ctx.session_id) or {"amount": 100})

    tool = durable_tool(tool_definition(name="checkout", description="d", input_schema=Args), checkout)
    return define_harness(name="shop", model=ScriptedModel([
        ModelResponse(tool_calls=[ToolCall(id="c1", name="checkout", arguments={})]), ModelResponse(text="paid"),
    ]), tools=[tool])


class OutageLog(KafkaLog):
    """A Kafka log on which every claim of session ``bad`` fails (a short outage that lasts)."""

    refused = 0

    async def claim(self, session_id: str, *, owner: str, lease: timedelta) -> Any:
        if session_id == "bad":
            self.refused += 1
            raise LogUnavailable("the broker is gone for a moment")
        return await super().claim(session_id, owner=owner, lease=lease)


def _produce_changed(bootstrap: str, topic: str, sid: str, value: bytes, changed: bytes, record_type: str) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap})
    producer.produce(
        topic, key=message_key(sid), value=changed, partition=0,
        headers=[(RECORD_TYPE_HEADER, record_type.encode()), (RECORD_CRC_HEADER, zlib.crc32(value).to_bytes(4, "big"))],
    )
    assert producer.flush(30) == 0


async def _a_session_with_an_unreadable_charge(bootstrap: str, prefix: str) -> None:
    """``bad``: its first owner charged, then its step's record has a changed byte; in-1's
    turn was running. ``good``: a session that ended, to make a checkpoint worth having."""
    log = KafkaLog(bootstrap=bootstrap, topic_prefix=prefix, partitions=1)
    try:
        sid = "bad"
        await log.submit(InputMessage(sid, 1, "in-1", "check out", "shop"))
        writer = await log.claim(sid, owner="dead", lease=timedelta(seconds=30))
        calls = ({"id": "c1", "name": "checkout", "arguments": {}},)
        await writer.append([TurnStarted(sid, 2, "in-1", 1), ModelResponseRecord(sid, 3, 1, 0, None, calls)])
        await writer.append([ToolStarted(sid, 4, "c1", "checkout", 1)])
        value = default_codec().encode(StepResult(sid, 5, "c1", "charge", {"amount": 100}))
        await asyncio.to_thread(
            _produce_changed, bootstrap, log.settings.sessions_topic, sid,
            value, value.replace(b"100", b"900"), StepResult.TYPE,
        )
        await writer.release()
    finally:
        await log.close()


async def _until(predicate: Any, what: str, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not reached in {timeout:g} s: {what}")


async def test_a_parked_sessions_verdicts_pending_at_a_checkpoint_are_written_by_the_next_owner(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    charges: list[str] = []
    await _a_session_with_an_unreadable_charge(kafka_bootstrap, unique_prefix)
    reader = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    client = HarnessClient(log=reader)
    try:
        waiting = await client.send("bad", "and again?", input_id="in-2")  # sent before the checkpoint

        # The first owner: parks bad, cannot write its verdicts, checkpoints meanwhile.
        first_log = OutageLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
        first = Worker(log=first_log, harnesses=[shop(charges)])
        stop = asyncio.Event()
        run = asyncio.create_task(first.run(stop))
        try:
            async def checkpointed() -> bool:
                rt = first.runtimes.get(0)
                if rt is None or "bad" not in rt.parked or first_log.refused < 1:
                    return False
                checkpoint = await reader.snapshots.read(0, create=False)
                return checkpoint is not None and checkpoint.reread == ("bad",)

            await _until(checkpointed, "the first owner parked bad and checkpointed while its verdicts fail")
        finally:
            stop.set()
            await run
            await first_log.close()
        checkpoint = await reader.snapshots.read(0, create=False)
        assert checkpoint is not None and "bad" in checkpoint.ended and "bad" not in checkpoint.sessions
        end = max(i.seq for i in await reader.scan_partition(0, 0))
        assert checkpoint.covers == end  # no record of bad (none at all) comes after it
        assert not [i for i in await reader.scan("bad") if isinstance(i, LogEntry) and isinstance(i.record, InputSettled)]
        assert first_log.stats.dead_lettered == 1

        # The next owner starts from that checkpoint and writes the verdicts.
        second_log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
        second = Worker(log=second_log, harnesses=[shop(charges)])
        stop = asyncio.Event()
        run = asyncio.create_task(second.run(stop))
        try:
            settled = await asyncio.wait_for(client.wait_settled("bad", waiting), 60)
            assert (settled.outcome, settled.code) == ("rejected", "session_unreadable")
            running = await asyncio.wait_for(client.wait_settled("bad", "in-1"), 60)
            assert (running.outcome, running.code) == ("failed", "session_unreadable")
            assert "bad" in second.runtimes[0].parked
            await asyncio.sleep(1.0)  # it runs on: no second verdict, nothing driven
            assert second_log.stats.dead_lettered == 0  # the first owner dead-lettered that record
        finally:
            stop.set()
            await run
            await second_log.close()

        verdicts = [
            (i.record.input_id, i.record.outcome)
            for i in await reader.scan("bad")
            if isinstance(i, LogEntry) and isinstance(i.record, InputSettled)
        ]
        assert sorted(verdicts) == [("in-1", "failed"), ("in-2", "rejected")]  # one each
        assert charges == []  # never driven: the charge did not run again
        [poison] = [i for i in await reader.scan("bad") if isinstance(i, CorruptRecord)]
        letters = await asyncio.to_thread(consume_all, kafka_bootstrap, reader.settings.dead_letter_topic, 0)
        where = [(dict(m.headers())[DLQ_PARTITION_HEADER], dict(m.headers())[DLQ_OFFSET_HEADER]) for m in letters]
        assert where == [(b"0", str(poison.offset).encode())]  # dead-lettered once, by the first owner
    finally:
        await client.close()
        await reader.close()
