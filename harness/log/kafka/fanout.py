"""One shared tailing consumer per process, fanned out to every subscriber.

``Fanout.subscribe(partition, after=, session_id=)`` is an async iterator of the committed
records of one session (or of every session, ``session_id=None``) with ``seq > after``, in
log order, live. However many subscribers a process has (a thousand clients waiting for
their turns, SSE streams, a worker's partition runtimes), every followed partition is
read by ONE read_committed consumer on ONE thread (one fetch request covers every
partition, and a busy process's partitions come back in the same responses); its records
are handed to the event loop in batches, routed by partition to that partition's tail,
then by key. Only records somebody subscribed to are decoded.

No gap, no duplicate. The tail knows ``position``: every committed record with an offset
below it has been dispatched (a record's ``seq`` is its offset + 1). A subscriber with
``after >= position`` only waits. One that starts behind catches up first, in the same
loop step that registers it (so nothing is dispatched in between): from the tail's ring
of recent records when they reach back far enough (no read at all), else with a bounded
read of ``[after, position)``; live records dispatched meanwhile queue behind. A
subscriber that stops reading falls behind at ``QUEUE_LIMIT`` unread records: its queue
stops growing, and once it drained what it had it catches up again the same way.

A new tail starts at the end of the partition (the last stable offset, so records of a
transaction still open when it starts are not skipped), or at its first subscriber's
position when that is close to the end: its position is set on the loop first, then the
partition is added to the consumer's assignment (``incremental_assign``), so nothing it
reads can come before the position. A tail nobody subscribes to closes after
``LINGER_S`` (its partition leaves the assignment). Assignment changes run in order on
the consumer's thread between two waits (:mod:`harness.log.kafka.tail_consumer`); librdkafka discards whatever was fetched
for an earlier assignment of a partition, and a batch of a partition that has no live tail
is dropped.

Records this process committed itself (an owner's appends, told by its partition writer
with their offsets, ``own``) are handed out as the records they were when they come
back through the tail: their bytes are not decoded again (a worker's own appends are
most of what its partition tail reads; the sessions that wrote them skip them by
position).

A subscriber may name the record types it wants (``types=``, a hint: e.g. a client
waiting for its input to settle needs two of a turn's dozen records): a record that no
subscriber of its key wants is not decoded at all, its type read from its framing. The
subscriber may still get records of other types (from a catch-up read, or one decoded
for a subscriber beside it); ``harness.log.follow.subscribe`` drops those.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from harness.errors import CorruptRecord, LogClosed, LogUnavailable
from harness.ids import message_key
from harness.log.base import LogEntry
from harness.log.kafka.config import KafkaSettings
from harness.log.kafka.reader import Decoder, decode_message
from harness.log.kafka.stats import KafkaLogStats
from harness.log.kafka.tail_consumer import TailConsumer
from harness.records import Record

__all__ = ["CatchUp", "Covered", "Fanout"]

log = logging.getLogger("harness.log.kafka")

CatchUp = Callable[[int, int, int, bytes | None, int], Awaitable[tuple[list[LogEntry], int]]]
"""``(partition, start, end, key, limit) -> (entries, reached)``: committed records of
``key`` (every key if None) with ``start <= offset < end``, at most ``limit`` of them
(corrupt ones skipped), and the offset the read covered up to (``end`` unless cut by
``limit``)."""

Covered = Callable[[int, int, int, "collections.deque[Any]"], None]
"""``(partition, covered, ring_start, ring)``: every committed record of ``partition``
below ``covered`` went by this process's tail; those from ``ring_start`` on are the raw
messages in ``ring`` (oldest first). Called on the loop, after each batch and end event."""

LINGER_S = 30.0
"""A tail without subscribers stays open this long, so a burst of short waits reuses it."""
QUEUE_LIMIT = 10_000
"""Unread records a subscriber may hold; beyond, it catches up with a read instead."""
RING = 4096
"""Recent records a tail keeps (raw, undecoded) for subscribers that start just behind it."""
CATCH_UP_CHUNK = 1000
"""Records per bounded catch-up read."""
CLOSE_WAIT_S = 2.0
"""How long ``close`` waits for a tail's thread; it closes its consumer itself when its
current wait ends."""
OWN_LIMIT = 100_000
"""Own records a tail keeps for their return; beyond (a tail far behind), they are decoded."""


class _Sub:
    """One subscriber: its key filter, its position and its unread records."""

    __slots__ = ("after", "catch_up_to", "key", "overflow", "queue", "types", "waiter")

    def __init__(self, key: bytes | None, after: int, types: frozenset[str] | None = None) -> None:
        self.key = key
        self.types = types  # the record types it wants (None: all); a hint, see the module doc
        self.after = after  # every record with seq <= after was yielded (or is not wanted)
        self.queue: collections.deque[LogEntry] = collections.deque()
        self.catch_up_to: int | None = None  # read [after, catch_up_to) before the queue
        self.overflow = False
        self.waiter: asyncio.Future[None] | None = None

    def push(self, entry: LogEntry) -> None:
        if self.overflow:
            return
        if len(self.queue) >= QUEUE_LIMIT:
            self.overflow = True  # catches up with a read once it drained its queue
        else:
            self.queue.append(entry)
        self.wake()

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Tail:
    """One followed partition: its position, ring and subscribers (used on the loop)."""

    def __init__(self, fanout: Fanout, reader: TailConsumer, partition: int) -> None:
        self.fanout = fanout
        self.reader = reader
        self.partition = partition
        self.loop = reader.loop
        self.position = 0  # offset: every committed record below it was dispatched
        # offset >= position: every committed record below it was dispatched, and only
        # transaction markers (or aborted records) lie between ``position`` and it
        self.covered = 0
        self._end_at_start = 0  # the partition's end when the tail started
        self.live = False  # position set and the partition assigned: batches are taken
        self.ring: collections.deque[Any] = collections.deque(maxlen=RING)  # recent raw messages
        self.ring_start = 0  # every committed record from this offset to ``position`` is in ``ring``
        self.ready: asyncio.Future[None] = self.loop.create_future()
        self.error: BaseException | None = None
        self.by_key: dict[bytes, set[_Sub]] = {}
        self.wants: dict[bytes, frozenset[str] | None] = {}  # key -> types its subscribers want (None: all)
        self.every: set[_Sub] = set()
        self._linger: asyncio.TimerHandle | None = None
        # offset -> a record this process committed there (told in offset order)
        self._own: collections.OrderedDict[int, Record] = collections.OrderedDict()
        self._own_lock = threading.Lock()  # (written by partition writer threads)
        self._reported: set[int] = set()  # offsets of the poison records reported (once each)
        self.starting: asyncio.Task[None] | None = None

    async def start(self, hint: int) -> None:
        """Find the start, set the position, then join the consumer's assignment."""
        try:
            start, end = await self.reader.op(self.reader.start_offset, self.partition, hint)
            if self.error is None:
                self.position = self.ring_start = self.covered = start
                self._end_at_start = end
                self.live = True
                await self.reader.op(self.reader.assign, self.partition, start)
        except BaseException as exc:  # noqa: BLE001 - reported to the subscribers
            self.failed(exc if isinstance(exc, LogUnavailable) else LogUnavailable(
                f"cannot tail partition {self.partition}: {exc}"))
            return
        if not self.ready.done():
            self.ready.set_result(None)

    def failed(self, exc: BaseException) -> None:
        if self.error is not None:
            return
        self.error = exc
        self.live = False
        if not self.ready.done():
            self.ready.set_exception(exc)
            self.ready.exception()  # retrieved: a failed start is reported to the subscriber
        self.fanout._forget(self)
        for sub in [*self.every, *(s for subs in self.by_key.values() for s in subs)]:
            sub.wake()

    def own(self, records: list[tuple[int, Record]]) -> None:
        """Records committed by this process at these offsets (any thread)."""
        with self._own_lock:
            if len(self._own) + len(records) > OWN_LIMIT:
                return
            position = self.position
            for offset, record in records:
                if offset >= position:
                    self._own[offset] = record

    def dispatch(self, batch: list[Any]) -> None:
        decode = self.fanout.decode
        topic = self.fanout.settings.sessions_topic
        own = self._own
        decoded = reused = 0
        for msg in batch:
            offset: int = msg.offset()
            if offset < self.position:
                continue
            record = None
            if own:
                with self._own_lock:
                    record = own.pop(offset, None)
            key = msg.key()
            subs = self.by_key.get(key)
            if subs and record is None and not self.every:
                wants = self.wants.get(key)
                if wants is not None and not self._wanted(wants, msg):
                    subs = None  # nobody here wants this type: not decoded
            if subs or self.every:
                if record is not None:
                    item: LogEntry | CorruptRecord = LogEntry(offset + 1, record)
                    reused += 1
                else:
                    item = decode_message(decode, topic, self.partition, msg)
                    decoded += 1
                if isinstance(item, CorruptRecord):
                    self._report(offset, item)
                else:
                    for sub in subs or ():
                        sub.push(item)
                    for sub in self.every:
                        sub.push(item)
            if len(self.ring) == self.ring.maxlen:
                self.ring_start = self.ring[0].offset() + 1
            self.ring.append(msg)
            self.position = offset + 1
        if own:  # told only after their records went by (a race with the commit): drop them
            with self._own_lock:
                while own and next(iter(own)) < self.position:
                    own.popitem(last=False)
        if decoded or reused:
            self.fanout.stats.add(tail_decoded=decoded, tail_own=reused)
        self._cover(self.position)

    def reached(self, offset: int) -> None:
        """The consumer reached the partition's end at ``offset``: the records before it
        came first (a partition's messages and events come in order).

        librdkafka drops the events of an earlier assignment of the partition as it drops
        its records (both carry the fetch's version); should one still come, it names an
        offset up to the end this tail started at, and one below that end is not believed
        until the tail has passed it."""
        if offset >= self._end_at_start or self.position >= self._end_at_start:
            self._cover(offset)

    def _cover(self, offset: int) -> None:
        if offset > self.covered:
            self.covered = offset
            self.fanout.covered(self)

    def _wanted(self, wants: frozenset[str], msg: Any) -> bool:
        """Whether ``msg`` may be of a type in ``wants`` (its type read from its framing;
        a framing that does not tell is decoded, and reported if it is corrupt)."""
        peek = self.fanout.peek
        if peek is None:
            return True
        record_type = peek(msg.value() or b"")
        return record_type is None or record_type in wants

    def _want(self, key: bytes) -> None:
        """Recompute what the subscribers of ``key`` want (None: every type)."""
        subs = self.by_key.get(key)
        if not subs:
            self.wants.pop(key, None)
        elif any(sub.types is None for sub in subs):
            self.wants[key] = None
        else:
            self.wants[key] = frozenset().union(*(sub.types for sub in subs if sub.types is not None))

    def add(self, sub: _Sub) -> None:
        """Register ``sub``; if it starts behind, give it what it missed (see the module doc)."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if sub.key is None:
            self.every.add(sub)
        else:
            self.by_key.setdefault(sub.key, set()).add(sub)
            self._want(sub.key)
        if sub.after >= self.position:
            return
        if sub.after >= self.ring_start:
            self._replay(sub)
        else:
            sub.catch_up_to = self.position

    def _replay(self, sub: _Sub) -> None:
        """The ring's records after ``sub.after`` of ``sub``'s key, queued in order."""
        wanted = []
        for msg in reversed(self.ring):
            if msg.offset() < sub.after:
                break
            if sub.key is None or (msg.key() == sub.key and (sub.types is None or self._wanted(sub.types, msg))):
                wanted.append(msg)
        decode = self.fanout.decode
        topic = self.fanout.settings.sessions_topic
        for msg in reversed(wanted):
            item = decode_message(decode, topic, self.partition, msg)
            if isinstance(item, LogEntry):
                sub.queue.append(item)
            else:  # reported when dispatched only if someone wanted it then (e.g. the first
                self._report(msg.offset(), item)  # batch can come before the first subscriber)
        if wanted:  # decoded for a subscriber all the same, only later than the batch came
            self.fanout.stats.add(tail_decoded=len(wanted))

    def _report(self, offset: int, corrupt: CorruptRecord) -> None:
        """Report a poison record of this partition, once."""
        if offset not in self._reported:
            self._reported.add(offset)
            self.fanout.report_corrupt(corrupt)

    def remove(self, sub: _Sub) -> None:
        if sub.key is None:
            self.every.discard(sub)
        else:
            subs = self.by_key.get(sub.key)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self.by_key[sub.key]
                self._want(sub.key)
        if not self.every and not self.by_key and self.error is None and self._linger is None:
            self._linger = self.loop.call_later(LINGER_S, self._close_idle)

    def _close_idle(self) -> None:
        self._linger = None
        if not self.every and not self.by_key:
            self.live = False
            self.fanout._forget(self)


class Fanout:
    """The shared tails of a Kafka log's partitions in this process (see the module doc).

    Args:
        settings: the log's settings (topic, client configs).
        decode: the codec's ``decode``.
        catch_up: the bounded read a subscriber that starts behind uses.
        on_corrupt: called (on a worker thread) with each undecodable record, once.
        stats: counters (``tails_opened``, ``catch_up_reads``, ``tail_decoded``, ``tail_own``).
        peek: the codec's ``framed_type`` (a record's type from its framing, None when that
            does not tell), so records that no subscriber wants are not decoded (see
            ``types`` of :meth:`subscribe`).
        on_covered: told how far each tail has read (:data:`Covered`): the log's index of
            where sessions start learns every new session from it, without a read.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        decode: Decoder,
        catch_up: CatchUp,
        on_corrupt: Callable[[CorruptRecord], None],
        stats: KafkaLogStats,
        peek: Callable[[bytes], str | None] | None = None,
        on_covered: Covered | None = None,
    ) -> None:
        self.settings = settings
        self.decode = decode
        self.peek = peek
        self._on_covered = on_covered
        self._catch_up = catch_up
        self._on_corrupt = on_corrupt
        self.stats = stats
        self._tails: dict[int, _Tail] = {}
        self._reader: TailConsumer | None = None
        self._closed = False

    @property
    def consumers(self) -> int:
        """Tailing consumers open now: one for every partition this process follows, or none."""
        return 1 if self._reader is not None else 0

    @property
    def tails(self) -> int:
        """Partitions followed now."""
        return len(self._tails)

    def subscribers(self, partition: int) -> int:
        tail = self._tails.get(partition)
        if tail is None:
            return 0
        return len(tail.every) + sum(len(s) for s in tail.by_key.values())

    def read_upto(self, partition: int) -> tuple[int, int] | None:
        """``(handed out, read)`` of this process's tail of ``partition``: the position after
        the last record it handed out, and the one up to which it has read the log (past
        transaction markers, which no record's position shows). None: no tail follows it."""
        tail = self._tails.get(partition)
        if tail is None or self._reader is None:
            return None
        end = self._reader.ends.get(partition)
        return tail.position, (end if end is not None and end >= tail.position else tail.position)

    def idle_polls(self) -> int:
        """Blocking waits of the shared consumer that ended with nothing (for tests)."""
        return self._reader.idle_polls if self._reader is not None else 0

    def covered(self, tail: _Tail) -> None:
        """A tail read further (see ``on_covered``)."""
        if self._on_covered is not None:
            self._on_covered(tail.partition, tail.covered, tail.ring_start, tail.ring)

    def own(self, partition: int, records: list[tuple[int, Record]]) -> None:
        """Records this process committed to ``partition`` (offset, record), from any thread:
        the partition's tail, if one runs, hands them out without decoding them."""
        tail = self._tails.get(partition)
        if tail is not None:
            tail.own(records)

    def report_corrupt(self, corrupt: CorruptRecord) -> None:
        asyncio.get_running_loop().run_in_executor(None, self._on_corrupt, corrupt)

    def _forget(self, tail: _Tail) -> None:
        """``tail`` is closed or failed: drop it, and its partition from the assignment."""
        if self._tails.get(tail.partition) is tail:
            del self._tails[tail.partition]
        reader = tail.reader
        if reader.tails.get(tail.partition) is tail:
            del reader.tails[tail.partition]
            if self._reader is reader:
                reader.op_nowait(reader.unassign, tail.partition)

    def _forget_reader(self, reader: TailConsumer) -> None:
        if self._reader is reader:
            self._reader = None
        reader.stop()

    def _reader_on(self, loop: asyncio.AbstractEventLoop) -> TailConsumer:
        reader = self._reader
        if reader is not None and reader.loop is not loop:  # the log moved to another event loop
            self._forget_reader(reader)
            for tail in list(reader.tails.values()):
                tail.failed(LogUnavailable("the Kafka session log moved to another event loop"))
            reader = None
        if reader is None:
            reader = self._reader = TailConsumer(self.settings, loop, on_failed=self._forget_reader)
        return reader

    async def _tail(self, partition: int, hint: int) -> _Tail:
        if self._closed:
            raise LogClosed("the Kafka session log is closed")
        loop = asyncio.get_running_loop()
        tail = self._tails.get(partition)
        if tail is not None and tail.loop is not loop:
            tail = None
        if tail is None:
            reader = self._reader_on(loop)
            tail = self._tails[partition] = reader.tails[partition] = _Tail(self, reader, partition)
            tail.starting = loop.create_task(tail.start(hint))
            self.stats.add(tails_opened=1)
        await asyncio.shield(tail.ready)
        return tail

    async def subscribe(
        self, partition: int, *, after: int, session_id: str | None = None, types: frozenset[str] | None = None
    ) -> AsyncIterator[LogEntry]:
        """Committed records of ``session_id`` (every session if None) in ``partition``
        with ``seq > after``, in order, as they commit; never ends by itself. ``types``:
        the record types wanted (a hint, with ``session_id``: others may come too).

        Raises:
            LogUnavailable: the partition's tail failed (subscribe again to reopen it).
        """
        key = message_key(session_id) if session_id is not None else None
        after = max(0, after)
        tail = await self._tail(partition, after)
        sub = _Sub(key, after, types if key is not None else None)
        tail.add(sub)
        try:
            while True:
                if sub.catch_up_to is not None:
                    end = sub.catch_up_to
                    start = sub.after
                    while start < end:
                        self.stats.add(catch_up_reads=1)
                        entries, start = await self._catch_up(partition, start, end, key, CATCH_UP_CHUNK)
                        for entry in entries:
                            if entry.seq > sub.after:
                                sub.after = entry.seq
                                yield entry
                    sub.after = max(sub.after, end)
                    sub.catch_up_to = None
                while sub.queue:
                    entry = sub.queue.popleft()
                    if entry.seq > sub.after:
                        sub.after = entry.seq
                        yield entry
                if sub.overflow:  # records were dropped after the queue: read them instead
                    sub.overflow = False
                    sub.catch_up_to = tail.position
                    continue
                if tail.error is not None:
                    raise tail.error
                sub.waiter = tail.loop.create_future()
                try:
                    await sub.waiter
                finally:
                    sub.waiter = None
        finally:
            tail.remove(sub)

    async def close(self) -> None:
        """Stop the shared tail (every subscriber's next wait raises ``LogUnavailable``)."""
        self._closed = True
        reader, self._reader = self._reader, None
        tails, self._tails = list(self._tails.values()), {}
        if reader is not None:
            reader.stop()
        for tail in tails:
            tail.failed(LogClosed("the Kafka session log is closed"))
        if reader is not None:
            await asyncio.to_thread(reader.join, CLOSE_WAIT_S)
