"""The Kafka session log against a real broker: partitioning, group commit, isolation,
poison records, zombie fencing, topic validation (harness.log.kafka)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import confluent_kafka as ck
import pytest
import pytest_asyncio
from confluent_kafka.admin import AdminClient, NewTopic

from harness.codec import default_codec
from harness.errors import FencedError, LogUnavailable
from harness.ids import RECORD_TYPE_HEADER, message_key, owner_transactional_id
from harness.log import open_log
from harness.log.kafka import (
    DLQ_ERROR_HEADER,
    DLQ_OFFSET_HEADER,
    DLQ_PARTITION_HEADER,
    DLQ_TOPIC_HEADER,
    KafkaLog,
    RecordTooLarge,
)
from harness.log.kafka.partitioner import partition_for
from harness.records import InputMessage, StepResult
from tests.integration.fleet_helpers import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.asyncio]

LEASE = timedelta(seconds=30)


def step(session: str, n: int, value: object = None) -> StepResult:
    return StepResult(
        session_id=session, ts=n, tool_call_id="call", name=f"step-{n}", value=value or {"n": n}
    )


def sessions_in_partition(partition: int, partitions: int, count: int, stem: str = "s") -> list[str]:
    out, i = [], 0
    while len(out) < count:
        sid = f"{stem}-{i}"
        if partition_for(sid, partitions) == partition:
            out.append(sid)
        i += 1
    return out


@pytest_asyncio.fixture
async def make_log(kafka_bootstrap: str, unique_prefix: str) -> AsyncIterator[Callable[..., KafkaLog]]:
    opened: list[KafkaLog] = []

    def make(**kw: Any) -> KafkaLog:
        kw.setdefault("bootstrap", kafka_bootstrap)
        kw.setdefault("topic_prefix", unique_prefix)
        kw.setdefault("partitions", 4)
        log = KafkaLog(**kw)
        opened.append(log)
        return log

    yield make
    for log in opened:
        await log.close()


def consume_all(bootstrap: str, topic: str, partition: int, *, committed: bool = True) -> list[Any]:
    """Every message of one partition (read_committed unless told otherwise)."""
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.assign([ck.TopicPartition(topic, partition, 0)])
    out: list[Any] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == ck.KafkaError._PARTITION_EOF:
                    return out
                continue
            out.append(msg)
    finally:
        consumer.close()
    raise AssertionError(f"no EOF on {topic}[{partition}]")


# --- partitioning ---------------------------------------------------------------------------


async def test_partition_for_matches_librdkafka_murmur2_random(kafka_bootstrap: str, unique_prefix: str):
    topic = f"{unique_prefix}.partitioning"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=12, replication_factor=1)])[topic].result(30)
    producer = ck.Producer(
        {"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random", "linger.ms": 5}
    )
    keys = [f"session-{i}-{uuid.uuid4().hex[: i % 9]}" for i in range(200)] + ["a", "ünïcødé-€", "x" * 97]
    chosen: dict[str, int] = {}
    for key in keys:
        producer.produce(
            topic,
            key=message_key(key),
            value=b"v",
            on_delivery=lambda e, m, k=key: chosen.__setitem__(k, m.partition()),
        )
    assert producer.flush(30) == 0
    assert chosen == {key: partition_for(key, 12) for key in keys}
    assert len(set(chosen.values())) == 12  # the sample really spreads over every partition


async def test_a_sessions_topic_that_deletes_old_records_is_a_warning(make_log, kafka_bootstrap, unique_prefix, caplog):
    """A topic an admin made with the broker's default retention (7 days) would lose
    sessions' history without a sign; the log's owner says so, with the fix."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    topic = f"{unique_prefix}.sessions"
    for future in admin.create_topics([NewTopic(topic, 2, 1, config={"retention.ms": "604800000"})]).values():
        future.result(timeout=30)
    log = make_log(partitions=2)
    with caplog.at_level("WARNING", logger="harness"):
        await log.start()
    assert f"topic {topic} deletes old records (retention.ms=604800000)" in caplog.text
    assert "--add-config retention.ms=-1" in caplog.text
    caplog.clear()
    other = make_log(topic_prefix=f"{unique_prefix}-b", partitions=2)  # made by the log itself: keeps all
    with caplog.at_level("WARNING", logger="harness"):
        await other.start()
    assert "deletes old records" not in caplog.text


async def test_session_lives_in_its_murmur2_partition(make_log, kafka_bootstrap):
    log = make_log(partitions=4)
    writer = await log.claim("s-1", owner="w", lease=LEASE)
    await writer.append([step("s-1", 1)])
    await log.submit(InputMessage(session_id="s-1", ts=2, input_id="i", text="hi"))
    p = log.partition_for("s-1")
    msgs = consume_all(kafka_bootstrap, log.settings.sessions_topic, p)
    assert [m.key() for m in msgs] == [b"s-1", b"s-1"]
    assert [dict(m.headers())[RECORD_TYPE_HEADER] for m in msgs] == [
        b"harness.step.result",
        b"harness.input.message",
    ]


# --- group commit ---------------------------------------------------------------------------


async def test_group_commit_64_concurrent_sessions_of_one_partition(make_log):
    log = make_log(partitions=4)
    sessions = sessions_in_partition(2, 4, 64)
    writers = await asyncio.gather(*(log.claim(s, owner="w", lease=LEASE) for s in sessions))
    assert len({id(w._writer) for w in writers}) == 1  # one shared producer for the partition

    results = await asyncio.gather(*(w.append([step(w.session_id, n) for n in range(3)]) for w in writers))

    for writer, entries in zip(writers, results, strict=True):
        seqs = [e.seq for e in entries]
        assert seqs == list(range(seqs[0], seqs[0] + 3)), seqs  # contiguous, in order
        assert [e.record for e in entries] == [step(writer.session_id, n) for n in range(3)]
        assert await log.read(writer.session_id) == entries
    stats = log.stats.snapshot()
    assert stats["appends"] == 64 and stats["records"] == 192
    assert stats["transactions"] < 64, stats  # appends shared transactions
    everything = await log.read_partition(2)
    assert len(everything) == 192 and [e.seq for e in everything] == sorted(e.seq for e in everything)


async def test_a_cancelled_append_lands_only_if_its_transaction_had_begun(make_log, monkeypatch):
    """Cancelling ``append`` before its transaction began lands nothing; after, its
    outcome stands (the caller's await is cancelled either way). Other appends of the
    group commit are not affected."""
    import threading

    from harness.log.kafka import writer as writer_module

    gate, entered = threading.Event(), threading.Event()
    transaction = writer_module.PartitionWriter._transaction

    def held(self, pending, deadline):  # the first transaction waits (it has begun: running)
        if not entered.is_set():
            entered.set()
            gate.wait(30)
        return transaction(self, pending, deadline)

    monkeypatch.setattr(writer_module.PartitionWriter, "_transaction", held)
    log = make_log()
    a, b = sessions_in_partition(0, 4, 2)
    wa = await log.claim(a, owner="w", lease=LEASE)
    wb = await log.claim(b, owner="w", lease=LEASE)
    begun = asyncio.ensure_future(wa.append([step(a, 1)]))
    await asyncio.to_thread(entered.wait, 30)  # its transaction began, and waits
    queued = asyncio.ensure_future(wb.append([step(b, 1)]))
    await asyncio.sleep(0.05)  # queued behind it
    begun.cancel()
    queued.cancel()
    for task in (begun, queued):
        with pytest.raises(asyncio.CancelledError):
            await task
    gate.set()
    after = await wb.append([step(b, 2)])  # the writer goes on
    assert [e.record.name for e in await log.read(a)] == ["step-1"]  # begun: it landed
    assert await log.read(b) == after  # queued: nothing of it landed


async def test_one_session_appends_stay_in_call_order(make_log):
    log = make_log()
    writer = await log.claim("s", owner="w", lease=LEASE)
    results = await asyncio.gather(
        *(writer.append([step("s", 2 * n), step("s", 2 * n + 1)]) for n in range(20))
    )
    flat = [e for entries in results for e in entries]
    assert [e.record.name for e in flat] == [f"step-{n}" for n in range(40)]
    assert [e.seq for e in flat] == sorted(e.seq for e in flat)
    assert await log.read("s") == flat


# --- read_committed isolation -------------------------------------------------------------


async def test_s7_4_read_committed_never_sees_an_aborted_batch(make_log, kafka_bootstrap):
    log = make_log()
    writer = await log.claim("s", owner="w", lease=LEASE)
    kept = await writer.append([step("s", 1)])
    codec = default_codec()
    producer = ck.Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"hand-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for n in (2, 3):
        producer.produce(
            log.settings.sessions_topic,
            key=message_key("s"),
            value=codec.encode(step("s", n)),
            partition=log.partition_for("s"),
        )
    producer.flush(30)
    producer.abort_transaction(30)

    later = await writer.append([step("s", 4)])
    assert await log.read("s") == kept + later
    raw = consume_all(kafka_bootstrap, log.settings.sessions_topic, log.partition_for("s"), committed=False)
    assert len(raw) == 4  # the aborted records are in the partition; readers skip them


async def test_read_terminates_on_a_partition_holding_only_aborted_records(make_log, kafka_bootstrap):
    log = make_log(partitions=1)
    await log.start()
    producer = ck.Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"hand-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(
        log.settings.sessions_topic, key=b"s", value=default_codec().encode(step("s", 1)), partition=0
    )
    producer.flush(30)
    producer.abort_transaction(30)
    t0 = time.monotonic()
    assert await log.read("s") == []
    assert await log.read_partition(0) == []
    assert time.monotonic() - t0 < 5


# --- poison records --------------------------------------------------------------------------


async def test_poison_record_is_dead_lettered_once_and_skipped(make_log, kafka_bootstrap):
    log = make_log()
    writer = await log.claim("s", owner="w", lease=LEASE)
    before = await writer.append([step("s", 1)])
    p = log.partition_for("s")
    plain = ck.Producer({"bootstrap.servers": kafka_bootstrap})
    offsets: list[int] = []
    plain.produce(
        log.settings.sessions_topic,
        key=b"s",
        value=b"\xc3\x01garbage",
        partition=p,
        on_delivery=lambda e, m: offsets.append(m.offset()),
    )
    plain.flush(30)
    after = await writer.append([step("s", 2)])

    assert await log.read("s") == before + after
    assert await log.read("s") == before + after  # a second read does not dead-letter it again
    assert await log.read_partition(p) == before + after
    assert log.stats.dead_lettered == 1
    assert log.stats.corrupt == 3

    (letter,) = consume_all(kafka_bootstrap, log.settings.dead_letter_topic, 0)
    headers = dict(letter.headers())
    assert letter.value() == b"\xc3\x01garbage" and letter.key() == b"s"
    assert headers[DLQ_TOPIC_HEADER] == log.settings.sessions_topic.encode()
    assert headers[DLQ_PARTITION_HEADER] == str(p).encode()
    assert headers[DLQ_OFFSET_HEADER] == str(offsets[0]).encode()
    assert b"fingerprint" in headers[DLQ_ERROR_HEADER] or b"header" in headers[DLQ_ERROR_HEADER]

    (corrupt,) = [item for item in await log.scan("s") if not hasattr(item, "record")]
    assert (corrupt.topic, corrupt.partition, corrupt.offset) == (log.settings.sessions_topic, p, offsets[0])
    assert corrupt.raw == b"\xc3\x01garbage"


async def test_a_quiet_subscriber_skips_a_poison_record_and_writes_no_dead_letter(make_log, kafka_bootstrap):
    """Clients and the gateway subscribe with dead_letter=False: they read past a poison
    record (no stall) and leave the dead-letter topic to the owner. A loud subscriber
    beside it shows when the poison record's report has been handled."""
    from harness.log.follow import subscribe

    owner, quiet, loud = make_log(), make_log(), make_log()
    writer = await owner.claim("s", owner="w", lease=LEASE)
    before = await writer.append([step("s", 1)])
    plain = ck.Producer({"bootstrap.servers": kafka_bootstrap})
    plain.produce(owner.settings.sessions_topic, key=b"s", value=b"\xc3\x01garbage", partition=owner.partition_for("s"))
    plain.flush(30)
    after = await writer.append([step("s", 2)])

    async def first_two(log: KafkaLog, dead_letter: bool) -> list[Any]:
        seen = []
        async with contextlib.aclosing(subscribe(log, "s", after=0, dead_letter=dead_letter)) as entries:
            async for entry in entries:
                seen.append(entry)
                if len(seen) == 2:
                    return seen
        return seen

    assert await first_two(quiet, False) == before + after
    assert await first_two(loud, True) == before + after
    for _ in range(300):  # the loud one dead-letters the poison record (off the loop)
        if loud.stats.dead_lettered == 1:
            break
        await asyncio.sleep(0.1)
    assert loud.stats.dead_lettered == 1
    assert quiet.stats.tail_decoded >= 3 and quiet.stats.dead_lettered == 0


async def test_a_poison_record_nobody_wanted_when_the_tail_passed_it_is_reported_to_a_late_subscriber(
    make_log, kafka_bootstrap
):
    """The shared tail decodes only what its subscribers want: a poison record of a session
    nobody followed yet goes by undecoded. A subscriber of that session joining later is
    served from the tail's ring, and the poison record is reported then (dead-lettered)."""
    from harness.log.follow import subscribe

    owner, reader = make_log(partitions=1), make_log(partitions=1)
    writer = await owner.claim("s", owner="w", lease=LEASE)
    other = await owner.claim("other", owner="w", lease=LEASE)
    before = await writer.append([step("s", 1)])
    plain = ck.Producer({"bootstrap.servers": kafka_bootstrap})
    plain.produce(owner.settings.sessions_topic, key=b"s", value=b"\xc3\x01garbage", partition=0)
    plain.flush(30)
    after = await writer.append([step("s", 2)])
    last = await other.append([step("other", 1)])

    async def first(log: KafkaLog, sid: str, n: int) -> list[Any]:
        seen = []
        async with contextlib.aclosing(subscribe(log, sid, after=0)) as entries:
            async for entry in entries:
                seen.append(entry)
                if len(seen) == n:
                    return seen
        return seen

    # The tail passes the poison record while only "other" is followed, then "s" joins.
    async with contextlib.aclosing(subscribe(reader, "other", after=0)) as others:
        assert [e async for e in _take(others, 1)] == last
        assert await first(reader, "s", 2) == before + after
    await wait_until(lambda: reader.stats.dead_lettered == 1, timeout=30, what="the poison record dead-lettered",
                     details=lambda: str(reader.stats))  # (off the loop)


async def _take(entries: Any, n: int) -> Any:
    async for entry in entries:
        yield entry
        n -= 1
        if n == 0:
            return


async def test_a_record_whose_key_names_another_session_is_poison(make_log, kafka_bootstrap):
    log = make_log(partitions=1)
    await log.start()
    plain = ck.Producer({"bootstrap.servers": kafka_bootstrap})
    plain.produce(
        log.settings.sessions_topic, key=b"s", value=default_codec().encode(step("other", 1)), partition=0
    )
    plain.flush(30)
    assert await log.read("s") == []
    assert log.stats.dead_lettered == 1


# --- fencing (SPEC 7.1) -----------------------------------------------------------------------


async def test_s7_1_zombie_writer_is_fenced_by_a_second_log(make_log, kafka_bootstrap):
    old_log, new_log = make_log(), make_log()
    old = await old_log.claim("s", owner="w1", lease=LEASE)
    first = await old.append([step("s", 1)])
    neighbour = sessions_in_partition(old_log.partition_for("s"), 4, 2)[1]
    old_neighbour = await old_log.claim(neighbour, owner="w1", lease=LEASE)

    new = await new_log.claim("s", owner="w2", lease=LEASE)  # init_transactions fences old_log

    with pytest.raises(FencedError) as caught:
        await old.append([step("s", 2)])
    assert caught.value.session_id == "s"
    with pytest.raises(FencedError):  # every session of the fenced partition writer
        await old_neighbour.append([step(neighbour, 1)])
    with pytest.raises(FencedError):
        await old.renew()
    assert (await old_log.lease_info("s")).owner is None

    second = await new.append([step("s", 3)])
    assert await new_log.read("s") == first + second
    assert await old_log.read("s") == first + second
    assert await new_log.read(neighbour) == []
    assert old_log.stats.fenced == 1


async def test_s7_1_zombie_open_transaction_is_aborted_by_the_new_owner(make_log, kafka_bootstrap):
    log = make_log()
    p = log.partition_for("s")
    await log.start()
    zombie = ck.Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": owner_transactional_id(log.namespace, p)}
    )
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(
        log.settings.sessions_topic, key=b"s", value=default_codec().encode(step("s", 1)), partition=p
    )
    zombie.flush(30)  # written, not committed: the owner died here

    writer = await log.claim("s", owner="w2", lease=LEASE)  # fences the zombie, aborts its transaction
    entries = await writer.append([step("s", 2)])
    with pytest.raises(ck.KafkaException) as caught:
        zombie.commit_transaction(30)
    assert caught.value.args[0].fatal() or caught.value.args[0].code() == ck.KafkaError._FENCED
    assert await log.read("s") == entries


async def test_own_partition_fences_this_process_writers_of_it(make_log):
    log = make_log()
    writer = await log.claim("s", owner="w", lease=LEASE)
    await log.own_partition(log.partition_for("s"))
    with pytest.raises(FencedError):
        await writer.append([step("s", 1)])
    again = await log.claim("s", owner="w", lease=LEASE)
    assert await again.append([step("s", 2)]) == await log.read("s")


# --- failures of one append ------------------------------------------------------------------


async def test_too_large_record_fails_its_append_alone(make_log):
    log = make_log(partitions=1, client_config={"message.max.bytes": 20_000})
    big_writer = await log.claim("big", owner="w", lease=LEASE)
    small_writer = await log.claim("small", owner="w", lease=LEASE)
    big, small = await asyncio.gather(
        big_writer.append([step("big", 1), step("big", 2, value={"blob": "x" * 50_000})]),
        small_writer.append([step("small", 1)]),
        return_exceptions=True,
    )
    assert isinstance(big, RecordTooLarge) and big.session_id == "big"
    assert [e.record for e in small] == [step("small", 1)]
    assert await log.read("big") == []
    assert await big_writer.append([step("big", 3)]) == await log.read("big")  # still usable
    assert log.stats.too_large == 1


async def test_too_large_input_is_refused_with_how_to_fix_and_nothing_lands(make_log):
    log = make_log(partitions=1, client_config={"message.max.bytes": 20_000})
    with pytest.raises(RecordTooLarge, match=r"send less, or raise the topic's max\.message\.bytes") as refused:
        await log.submit(InputMessage(session_id="big", ts=1, input_id="i", text="x" * 50_000))
    assert refused.value.session_id == "big" and refused.value.size > 50_000
    entry = await log.submit(InputMessage(session_id="big", ts=2, input_id="j", text="small"))
    assert [e.record.input_id for e in await log.read("big")] == ["j"]  # type: ignore[attr-defined]
    assert entry.seq == (await log.read("big"))[0].seq


# --- topics ------------------------------------------------------------------------------------


async def test_existing_topic_with_another_partition_count_is_refused(
    kafka_bootstrap, unique_prefix, make_log
):
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    topic = f"{unique_prefix}.sessions"
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(30)
    log = make_log(partitions=12)
    with pytest.raises(LogUnavailable, match="3 partitions"):
        await log.start()
    ok = make_log(partitions=3)
    await ok.start()


async def test_topics_are_created_with_unlimited_retention(kafka_bootstrap, make_log):
    log = make_log(partitions=5)
    await log.start()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    metadata = admin.list_topics(timeout=10)
    assert len(metadata.topics[log.settings.sessions_topic].partitions) == 5
    assert log.settings.dead_letter_topic in metadata.topics
    resource = ck.admin.ConfigResource("topic", log.settings.sessions_topic)
    config = admin.describe_configs([resource])[resource].result(30)
    assert config["retention.ms"].value == "-1"
    assert config["cleanup.policy"].value == "delete"


async def test_open_log_routes_kafka_urls(kafka_bootstrap, unique_prefix):
    log = open_log(f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}&partitions=2")
    try:
        assert isinstance(log, KafkaLog)
        assert log.namespace == unique_prefix and log.settings.partitions == 2
        entry = await log.submit(InputMessage(session_id="s", ts=1, input_id="i", text="hi"))
        assert await log.read("s") == [entry]
    finally:
        await log.close()


# --- partition primitives ------------------------------------------------------------------------


async def test_read_partition_ranges_and_tail(make_log):
    log = make_log(partitions=1)
    a = await log.claim("a", owner="w", lease=LEASE)
    first = await a.append([step("a", 1), step("a", 2)])
    entry = await log.submit(InputMessage(session_id="b", ts=1, input_id="i", text="hi"))
    everything = await log.read_partition(0)
    assert everything == [*first, entry]
    assert await log.read_partition(0, start_offset=first[-1].seq) == [entry]
    assert await log.read_partition(0, end_offset=first[-1].seq) == first
    assert await log.sessions() == ["a", "b"]

    tail = log.tail_partition(0, start_offset=first[1].seq - 1)
    got = [await anext(tail), await anext(tail)]
    later = await a.append([step("a", 3)])
    got.append(await asyncio.wait_for(anext(tail), 10))
    await tail.aclose()
    assert got == [first[1], entry, *later]


async def test_lease_info_is_local_and_has_no_lease(make_log):
    log = make_log()
    assert (await log.lease_info("s")).epoch == 0
    writer = await log.claim("s", owner="w1", lease=LEASE)
    info = await log.lease_info("s")
    assert (info.owner, info.epoch, info.lease_until) == ("w1", writer.epoch, None)
    await writer.release()
    assert (await log.lease_info("s")).owner is None


# --- broker restart ------------------------------------------------------------------------------


@pytest.mark.slow
async def test_appends_and_reads_carry_on_across_a_broker_restart(unique_prefix):
    from harness.testing.kafka_local import LocalKafka

    broker = LocalKafka()
    await asyncio.to_thread(broker.start)
    try:
        log = KafkaLog(bootstrap=broker.bootstrap, topic_prefix=unique_prefix, partitions=2)
        try:
            writer = await log.claim("s", owner="w", lease=LEASE)
            before = await writer.append([step("s", 1)])
            await asyncio.to_thread(broker.restart)
            after = await writer.append([step("s", 2)])  # retriable errors are retried in place
            assert await log.read("s") == before + after
        finally:
            await log.close()
    finally:
        await asyncio.to_thread(broker.close)


async def test_a_new_owner_writer_starts_even_if_the_previous_one_never_closes(
    kafka_bootstrap: str, unique_prefix: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A partition's new writer waits for this process's previous one to close (its last
    transaction must not be fenced in flight), but not for ever: a close that hangs
    (librdkafka aborting a transaction the broker lost in a restart) froze the partition."""
    import concurrent.futures
    import logging

    from harness.log.kafka import writer as writer_module
    from harness.log.kafka.config import KafkaSettings
    from harness.log.kafka.stats import KafkaLogStats

    monkeypatch.setattr(writer_module, "PREVIOUS_CLOSE_TIMEOUT_S", 0.5)

    class NeverCloses:
        closed: concurrent.futures.Future[None] = concurrent.futures.Future()

    new = writer_module.PartitionWriter(
        settings=KafkaSettings(kafka_bootstrap, unique_prefix, partitions=1), partition=0, stats=KafkaLogStats(),
        is_current=lambda session, epoch: True, on_commit=lambda partition, end: None,
        previous=NeverCloses(),  # type: ignore[arg-type]
    )
    with caplog.at_level(logging.WARNING, logger="harness.log.kafka"):
        new.start()
        try:
            await asyncio.to_thread(new.ready.result, 60)  # before the bound: never
        finally:
            await asyncio.to_thread(new.close().result, 60)
    assert any("previous producer of this process did not close" in r.getMessage() for r in caplog.records)
