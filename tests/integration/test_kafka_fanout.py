"""Followers of a Kafka log against a real broker: one shared tail per partition per
process, resume without gap or duplicate, whole histories from the partition's
checkpoint, receipts, and owner producers that live as long as the log
(harness.log.kafka.fanout, harness.log.kafka.index, harness.client)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import confluent_kafka as ck
import pytest
import pytest_asyncio

from harness.client import HarnessClient, InputReceipt
from harness.codec import default_codec
from harness.errors import FencedError
from harness.ids import RECORD_TYPE_HEADER, message_key
from harness.log.base import Checkpoint, LogEntry
from harness.log.kafka import KafkaLog, tail_consumer
from harness.log.kafka import fanout as fanout_module
from harness.log.kafka import log as kafka_log_module
from harness.records import InputMessage, InputSettled, StepResult

pytestmark = [pytest.mark.kafka, pytest.mark.asyncio]

LEASE = timedelta(seconds=30)


def step(session: str, n: int) -> StepResult:
    return StepResult(session_id=session, ts=n, tool_call_id="call", name=f"step-{n}", value={"n": n})


@pytest_asyncio.fixture
async def make_log(kafka_bootstrap: str, unique_prefix: str) -> AsyncIterator[Callable[..., KafkaLog]]:
    opened: list[KafkaLog] = []

    def make(**kw: Any) -> KafkaLog:
        kw.setdefault("bootstrap", kafka_bootstrap)
        kw.setdefault("topic_prefix", unique_prefix)
        kw.setdefault("partitions", 1)  # every session in partition 0
        log = KafkaLog(**kw)
        opened.append(log)
        return log

    yield make
    for log in opened:
        await log.close()


async def take(entries: AsyncIterator[LogEntry], n: int, timeout: float = 30) -> list[LogEntry]:
    """The next ``n`` entries of a subscription."""
    out: list[LogEntry] = []
    async with asyncio.timeout(timeout):
        async for entry in entries:
            out.append(entry)
            if len(out) == n:
                break
    return out


async def write(log: KafkaLog, session: str, first: int, count: int) -> list[LogEntry]:
    """Steps ``first..first+count-1`` of ``session``, committed and readable by every reader.

    Kafka writes the commit markers just after ``commit_transaction`` returns, so another
    log's read could still end before them; the writer's own read waits for its commits.
    """
    writer = await log.claim(session, owner="w", lease=LEASE)
    out = []
    for n in range(first, first + count):
        out += await writer.append([step(session, n)])
    await log.read_partition(log.partition_for(session), out[-1].seq)
    return out


# --- one consumer for every follower ---------------------------------------------------------


async def test_a_thousand_waiters_of_one_partition_share_one_consumer(make_log):
    log = make_log()
    await log.start()
    sessions = [f"w-{i}" for i in range(1000)]
    subs = [log.subscribe(sid, after=0) for sid in sessions]
    firsts = [asyncio.ensure_future(take(sub, 1)) for sub in subs]
    await asyncio.sleep(0)  # the subscriptions register before anything is written
    while log.fanout.subscribers(0) < len(sessions):
        await asyncio.sleep(0.01)
    writer_log = make_log()
    writers = {sid: await writer_log.claim(sid, owner="w", lease=LEASE) for sid in sessions[:50]}
    written = await asyncio.gather(*(w.append([step(sid, 1)]) for sid, w in writers.items()))
    for sid in sessions[50:]:
        await writer_log.submit(InputMessage(sid, 1, "in-1", "hi", None))

    got = await asyncio.gather(*firsts)

    assert log.fanout.consumers == 1
    assert log.stats.tails_opened == 1
    for sid, entries in zip(sessions, got, strict=True):
        assert [e.session_id for e in entries] == [sid]
    assert [g for g in got[:50]] == [list(w) for w in written]
    assert log.stats.reads == 0  # nothing was read from the partition: the tail served them all
    for sub in subs:
        await sub.aclose()


async def test_tail_partition_and_subscribers_share_the_tail(make_log):
    log = make_log(partitions=2)
    await log.start()
    sid = next(f"s-{i}" for i in range(100) if log.partition_for(f"s-{i}") == 0)
    everything = log.tail_partition(0, 0)
    one = log.subscribe(sid, after=0)
    got_all = asyncio.ensure_future(take(everything, 3))
    got_one = asyncio.ensure_future(take(one, 3))
    while log.fanout.subscribers(0) < 2:
        await asyncio.sleep(0.01)
    entries = await write(make_log(partitions=2), sid, 1, 3)

    assert await got_one == entries
    assert await got_all == entries
    assert log.fanout.consumers == 1
    await one.aclose()
    await everything.aclose()


async def test_a_tail_hands_out_this_process_own_records_without_decoding_them(make_log):
    """A worker's partition tail reads back mostly its own appends: those come out as the
    records that were appended (folded already by their session), never decoded again;
    another process's records are decoded as before."""
    log = make_log()
    await log.start()
    everything = log.tail_partition(0, 0)
    got = asyncio.ensure_future(take(everything, 25))
    while log.fanout.subscribers(0) < 1:
        await asyncio.sleep(0.01)
    own = await write(log, "mine", 1, 20)  # this process's own appends
    theirs = await write(make_log(), "theirs", 1, 5)  # another process (another log object)
    entries = await got
    assert sorted(entries, key=lambda e: e.seq) == sorted(own + theirs, key=lambda e: e.seq)
    stats = log.stats.snapshot()
    # Every own record is told from its delivery report, before its commit marker exists,
    # so none can come back through the tail before it is told (none is decoded again).
    assert stats["tail_own"] == 20
    assert stats["tail_decoded"] == 5  # the other process's records are decoded
    reused = {e.seq for e in entries if any(e.record is o.record for o in own)}
    assert len(reused) == stats["tail_own"]
    await everything.aclose()


async def test_a_follower_of_some_record_types_decodes_only_those(make_log):
    """``follow.subscribe(types=)`` (what ``wait_settled`` uses): the records of the other
    types are read past by their framing, never decoded, live or from the tail's ring."""
    from harness.log.follow import subscribe

    log, writer_log = make_log(), make_log()
    await log.start()
    writer = await writer_log.claim("s", owner="w", lease=LEASE)
    wanted = frozenset({InputSettled.TYPE})
    live = subscribe(log, "s", after=0, dead_letter=False, types=wanted)
    got = asyncio.ensure_future(take(live, 2))
    while log.quiet_fanout.subscribers(0) < 1:
        await asyncio.sleep(0.01)
    settled: list[LogEntry] = []
    for n in range(2):
        await writer.append([step("s", 10 * n + k) for k in range(4)])
        settled += await writer.append([InputSettled("s", n, f"in-{n}", "completed")])
    assert await got == settled
    assert log.stats.snapshot()["tail_decoded"] == 2  # the 8 step results were not decoded

    # From the ring (the tail has passed them): the same.
    again = await take(subscribe(log, "s", after=0, dead_letter=False, types=wanted), 2)
    assert again == settled
    everything = await take(subscribe(log, "s", after=0, dead_letter=False), 10)
    assert [e.record_type for e in everything].count(StepResult.TYPE) == 8
    await live.aclose()


async def test_a_follower_of_some_record_types_on_sqlite(tmp_path):
    from harness.log.follow import subscribe
    from harness.log.sqlite import SqliteLog

    log = SqliteLog(tmp_path / "log.db")
    try:
        writer = await log.claim("s", owner="w", lease=LEASE)
        await writer.append([step("s", 1), step("s", 2)])
        settled = await writer.append([InputSettled("s", 0, "in-1", "completed")])
        got = await take(subscribe(log, "s", after=0, types={InputSettled.TYPE}), 1)
        assert got == settled
    finally:
        await log.close()


# --- no gap, no duplicate ------------------------------------------------------------------------


async def test_a_late_subscriber_joins_the_live_tail_without_gap_or_duplicate(make_log, monkeypatch):
    monkeypatch.setattr(fanout_module, "RING", 4)  # so a late subscriber must read what it missed
    log, writer_log = make_log(), make_log()
    await log.start()
    early = log.subscribe("s", after=0)
    first = asyncio.ensure_future(take(early, 1))
    while log.fanout.subscribers(0) < 1:
        await asyncio.sleep(0.01)
    written = await write(writer_log, "s", 1, 10)
    await write(writer_log, "other", 1, 10)  # pushes s's records out of the ring
    assert (await first) == written[:1]
    assert await take(early, 9) == written[1:]

    # Late: from the 3rd record on, while records keep coming.
    late = log.subscribe("s", after=written[2].seq)
    more = asyncio.ensure_future(write(writer_log, "s", 11, 20))
    got = await take(late, 27)
    written += await more

    assert got == written[3:]
    assert [e.seq for e in got] == sorted({e.seq for e in got})  # in order, no duplicate
    assert log.stats.catch_up_reads >= 1
    assert log.fanout.consumers == 1
    await early.aclose()
    await late.aclose()


async def test_a_subscriber_just_behind_the_tail_is_served_from_its_ring(make_log):
    log, writer_log = make_log(), make_log()
    await log.start()
    watcher = log.subscribe("other", after=0)
    seen = asyncio.ensure_future(take(watcher, 1))
    while log.fanout.subscribers(0) < 1:
        await asyncio.sleep(0.01)
    written = await write(writer_log, "s", 1, 5)
    await write(writer_log, "other", 1, 1)
    await seen  # the tail has passed every record of s
    reads = log.stats.reads

    got = await take(log.subscribe("s", after=written[1].seq), 3)

    assert got == written[2:]
    assert log.stats.reads == reads  # no read: the tail's ring had them
    await watcher.aclose()


async def test_a_subscriber_that_stops_reading_catches_up_later(make_log, monkeypatch):
    monkeypatch.setattr(fanout_module, "QUEUE_LIMIT", 3)
    log, writer_log = make_log(), make_log()
    await log.start()
    slow = log.subscribe("s", after=0)
    first = asyncio.ensure_future(take(slow, 1))
    while log.fanout.subscribers(0) < 1:
        await asyncio.sleep(0.01)
    written = await write(writer_log, "s", 1, 20)  # while the subscriber reads nothing more
    assert await first == written[:1]

    rest = await take(slow, 19)

    assert rest == written[1:]
    assert log.stats.catch_up_reads >= 1
    await slow.aclose()


async def test_records_of_a_transaction_open_when_the_tail_starts_are_not_skipped(make_log, kafka_bootstrap):
    log = make_log()
    await log.start()
    other = ck.Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{log.namespace}.other"})
    other.init_transactions(30)
    other.begin_transaction()
    record = InputMessage("s", 1, "in-1", "hi", None)
    other.produce(log.settings.sessions_topic, key=message_key("s"), value=default_codec().encode(record),
                  partition=0, headers=[(RECORD_TYPE_HEADER, record.TYPE.encode())])
    other.flush(30)  # written, not committed: the partition's end (LSO) stays before it

    sub = log.subscribe("s", after=0)
    got = asyncio.ensure_future(take(sub, 1))
    while log.fanout.subscribers(0) < 1:
        await asyncio.sleep(0.01)
    other.commit_transaction(30)

    assert [e.record for e in await got] == [record]
    await sub.aclose()


# --- whole histories start where the session starts ------------------------------------------------


async def test_whole_history_reads_start_at_the_checkpoint_not_at_offset_zero(make_log):
    writer_log = make_log()
    ended = await write(writer_log, "ended", 1, 3)
    live = await write(writer_log, "live", 1, 2)
    for i in range(30):
        await write(writer_log, f"old-{i}", 1, 1)
    history = await writer_log.read_partition(0)
    covers = history[-1].seq
    firsts: dict[str, int] = {}
    for entry in history:
        firsts.setdefault(entry.session_id, entry.seq)
    del firsts["live"]  # a checkpoint holds a live session's records, an ended one's first position
    await writer_log.snapshots.write(0, Checkpoint(covers=covers, sessions={"live": live}, ended=firsts))
    live += await write(writer_log, "live", 3, 1)
    new = await write(writer_log, "new", 1, 2)

    log = make_log()
    assert (await log.history("ended"))[1] == ended[0].seq - 1
    held, start = await log.history("live")
    assert held == live[:2] and start == covers
    assert (await log.history("new"))[1] == covers  # unknown below the checkpoint: starts after it
    assert await log.read("ended") == ended
    assert await log.read("live") == live
    assert await log.read("new") == new
    assert await log.read("nobody") == []
    # The reads taught the index the sessions after the checkpoint.
    assert (await log.history("new"))[1] == new[0].seq - 1
    assert (await log.history("nobody"))[1] >= new[-1].seq
    later = await write(writer_log, "later", 1, 2)
    assert await log.read("later") == later

    sub = log.subscribe("live", after=None)
    assert await take(sub, 3) == live
    await sub.aclose()


async def test_a_tail_teaches_the_index_every_new_session_so_reading_one_fetches_nothing(
    make_log, kafka_bootstrap, monkeypatch
):
    monkeypatch.setattr(kafka_log_module, "TAIL_CATCH_UP_S", 30.0)  # a stalled machine: still no read
    writer_log = make_log()
    await write(writer_log, "before", 1, 2)
    log = make_log()
    assert await log.read("before")  # the partition's index is loaded (and taught up to here)
    watch = log.subscribe("watched", after=None)  # a follower: the partition's shared tail opens
    waiting = asyncio.ensure_future(take(watch, 1))
    while log.fanout.subscribers(0) < 1:
        await asyncio.sleep(0.01)
    new = await write(writer_log, "new", 1, 3)
    other = await write(writer_log, "other", 1, 1)
    watched = await write(writer_log, "watched", 1, 1)
    assert await waiting == watched  # the tail has read past them
    consumer = ck.Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "end", "isolation.level": "read_committed"})
    try:
        end = consumer.get_watermark_offsets(ck.TopicPartition(log.settings.sessions_topic, 0), timeout=10, cached=False)[1]
    finally:
        consumer.close()
    reads = log.stats.reads
    assert await log.read("nobody") == []  # waits for the tail to reach the end (past the last marker)
    assert log.stats.reads == reads and log.stats.reads_from_tail == 1  # asked for the end, fetched nothing
    # No read taught it these: the tail did. A new session starts at the end (nothing to fetch),
    # and a session that began since the last read is read from its first record.
    assert (await log.history("nobody"))[1] == end
    assert (await log.history("new"))[1] == new[0].seq - 1
    assert (await log.history("other"))[1] == other[0].seq - 1
    assert await log.read("new") == new
    # A session committed (its marker written) just before a read is in it: the read asks
    # the broker for the partition's end and waits for the tail to get there.
    for i in range(5):
        written = await write(writer_log, f"fresh-{i}", 1, 1)
        assert await log.read(f"fresh-{i}") == written
    assert await log.read("nobody-2") == []
    await watch.aclose()


async def test_a_read_whose_tail_does_not_reach_the_end_in_time_reads_the_log(make_log, monkeypatch):
    monkeypatch.setattr(kafka_log_module, "TAIL_CATCH_UP_S", 0.05)
    writer_log = make_log()
    await write(writer_log, "before", 1, 1)
    log = make_log()
    assert await log.read("before")  # the index is loaded
    monkeypatch.setattr(log._followers, "following", lambda partition: True)  # a tail that never moves
    late = await write(writer_log, "late", 1, 2)
    reads = log.stats.reads
    assert await log.read("late") == late  # waited for the tail, then read
    assert log.stats.reads == reads + 1 and log.stats.reads_from_tail == 0


# --- receipts ---------------------------------------------------------------------------------------


async def test_send_returns_a_receipt_and_wait_settled_reads_from_its_position(make_log, kafka_bootstrap, unique_prefix):
    await make_log().start()  # a client never creates the topics: a worker (here: an owner's log) does
    async with HarnessClient(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1) as client:
        for i in range(20):  # history before the input
            await client.send(f"before-{i}", "hi")
        receipt = await client.send("s", "hello", input_id="in-1")
        assert isinstance(receipt, InputReceipt)
        assert (receipt.session_id, receipt.input_id) == ("s", "in-1")
        log: KafkaLog = client.log  # type: ignore[assignment]
        assert [e.seq for e in await log.read("s")] == [receipt.position]
        reads = log.stats.reads

        waiting = asyncio.ensure_future(client.wait_settled("s", receipt, timeout=30))
        while log.quiet_fanout.subscribers(0) < 1:  # a client reads: it never dead-letters
            await asyncio.sleep(0.01)
        owner = await make_log().claim("s", owner="w", lease=LEASE)
        await owner.append([InputSettled("s", 2, "in-1", "completed")])
        settled = await waiting

        assert settled.input_id == "in-1" and settled.outcome == "completed"
        assert log.stats.reads == reads  # the wait read nothing: it followed the tail from the input on
        by_id = await client.wait_settled("s", "in-1", timeout=30)  # an id alone: the session's history
        assert by_id == settled
        answer = await client.answer("s", "call-1", "ask", {"ok": True})
        records = await client.append_records("s", [{"type": "app.note"}], input_id="rec-1")
        assert answer.position < records.position
        assert [e.seq for e in await log.read("s", after=receipt.position)][-2:] == [answer.position, records.position]


# --- owner producers live as long as the log ---------------------------------------------------------


async def test_a_second_session_after_the_first_closed_needs_no_new_producer(make_log):
    log = make_log()
    first = await log.claim("a", owner="w", lease=LEASE)
    await first.append([step("a", 1)])
    await first.release()  # the partition's last session
    second = await log.claim("b", owner="w", lease=LEASE)
    await second.append([step("b", 1)])
    await second.release()

    assert log.stats.producers_started == 1
    assert [e.session_id for e in await log.read_partition(0)] == ["a", "b"]


async def test_a_host_session_after_the_partitions_last_one_closed_reuses_its_producer(make_log):
    from harness import HarnessHost, define_harness
    from harness.models import ModelResponse, ScriptedModel

    harness = define_harness(name="chat", model=ScriptedModel(lambda m: ModelResponse(text="hi")), tools=[])
    log = make_log()
    host = HarnessHost(log=log)
    for sid in ("first", "second", "third"):  # one partition: each is its last session when it closes
        session = await host.open(harness, session_id=sid)
        assert (await session.send("hello")).outcome == "completed"
        await session.close()
    assert log.stats.producers_started == 1


async def test_a_producer_fenced_while_idle_says_so_once_then_the_next_claim_takes_over(make_log):
    mine, theirs = make_log(), make_log()
    writer = await mine.claim("s", owner="w1", lease=LEASE)
    await writer.append([step("s", 1)])
    await writer.release()  # idle producer, still open
    other = await theirs.claim("s", owner="w2", lease=LEASE)  # fences it
    await other.append([step("s", 2)])

    again = await mine.claim("s", owner="w1", lease=LEASE)
    with pytest.raises(FencedError):
        await again.append([step("s", 3)])
    taken = await mine.claim("s", owner="w1", lease=LEASE)  # a new producer fences theirs back
    await taken.append([step("s", 4)])
    with pytest.raises(FencedError):
        await other.append([step("s", 5)])

    assert mine.stats.producers_started == 2
    assert [e.record.name for e in await mine.read("s")] == ["step-1", "step-2", "step-4"]


async def test_disown_partition_still_closes_its_producer(make_log):
    log = make_log()
    await log.own_partition(0)
    writer = await log.claim("s", owner="w", lease=LEASE)
    await writer.append([step("s", 1)])
    await log.disown_partition(0)
    with pytest.raises(FencedError):
        await writer.append([step("s", 2)])
    with contextlib.suppress(FencedError):
        await writer.release()
    assert log.stats.producers_started == 1


# --- a worker picks up new inputs as they commit ---------------------------------------------------


async def test_a_worker_picks_up_inputs_as_they_commit_not_on_a_poll(make_log, monkeypatch):
    from harness import define_harness
    from harness.models import ModelResponse, ScriptedModel
    from harness.runtime.worker import Worker

    harness = define_harness(name="pickup", model=ScriptedModel(lambda m: ModelResponse(text="hi")), tools=[])
    worker_log = make_log(partitions=2)
    worker = Worker(log=worker_log, harnesses=[harness], poll_interval=timedelta(hours=1))
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    async with asyncio.timeout(60):
        await worker.ready.wait()
    client = HarnessClient(log=make_log(partitions=2))
    by_partition: dict[int, list[str]] = {0: [], 1: []}
    for i in range(100):
        by_partition[client.log.partition_for(f"s{i}")].append(f"s{i}")
    try:
        # A turn in each partition first (every tail of both processes runs then), then two more each.
        sessions = [sids[k] for k in range(3) for sids in by_partition.values()]
        for i, sid in enumerate(sessions):
            if i == 2:
                # From here on the tails' blocking wait for records is long: a pickup can
                # only come from the wait returning at the record's arrival (the broker
                # answering the fetch at the commit), never from a timer.
                monkeypatch.setattr(tail_consumer, "WAIT_S", 120.0)
            receipt = await client.send(sid, "hello", harness="pickup")
            settled = await client.wait_settled(sid, receipt, timeout=60)
            assert settled.outcome == "completed"
        assert worker_log.fanout.tails == 2  # one tail per owned partition
        assert worker_log.fanout.consumers == 1  # read by one consumer
    finally:
        # The tails' threads sit in a 120 s wait: a record in each partition ends it, so
        # their consumers close with the logs, not after the test (reconnect noise).
        monkeypatch.setattr(tail_consumer, "WAIT_S", 0.02)
        for sids in by_partition.values():
            await client.send(sids[-1], "bye", harness="pickup")
        stop.set()
        await run
