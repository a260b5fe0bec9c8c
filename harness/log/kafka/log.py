"""The Kafka session log (``kafka://host:port?topic_prefix=...``).

Layout: topic ``<prefix>.sessions`` (key = session id, so a session lives in one
partition, in order) and ``<prefix>.dead-letter`` for records nobody can decode.

* Owner writes go through one fenced transactional producer per owned partition
  (:mod:`harness.log.kafka.writer`), with group commit across the partition's sessions.
* ``submit`` (inputs from anyone) uses a separate idempotent, non-transactional producer.
* Reads use read_committed consumers without a group (:mod:`harness.log.kafka.reader`),
  so an aborted batch never happened. A read of a session's whole history starts where
  the session starts, as the partition's checkpoint and the reads since tell
  (:mod:`harness.log.kafka.index`), never at the partition's first offset.
* Followers (``subscribe``, ``tail_partition``) share one tailing consumer per partition
  per process (:mod:`harness.log.kafka.followers`, :mod:`harness.log.kafka.fanout`).
* Owner producers live as long as the log: releasing the last session of a partition
  keeps its producer (no second ``init_transactions``); ``disown_partition`` and
  ``close`` close it (:mod:`harness.log.kafka.owners`).
* Partitions are computed by Kafka's keyed murmur2 partitioner
  (:mod:`harness.log.kafka.partitioner`) and produced explicitly.

Positions: ``LogEntry.seq`` is the record's offset PLUS ONE, i.e. Kafka's "next offset to
consume" convention. So ``read(session, after=seq)`` starts consuming at offset ``seq``,
``after=0`` means "from the beginning" as on every backend, and seqs are comparable
within one partition (all sessions of a one-partition log share one order).

Ownership: Kafka has no leases. ``claim`` never refuses (no ``SessionBusy``); the owner
of a session is whoever last ran ``init_transactions`` for its partition, and within
one process the latest ``claim`` of a session (a local epoch counter) fences earlier
writers of that session. ``lease_info`` reports only what this process knows.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, ClassVar, Self

from confluent_kafka import KafkaError, KafkaException

from harness.errors import CorruptRecord, FencedError, LogClosed, LogUnavailable
from harness.ids import message_key
from harness.log import _check_input, _Codec, _default_codec, _encode_batch, _lease_seconds
from harness.log.base import Checkpoint, LeaseInfo, LogEntry
from harness.log.kafka.blocking import BlockingReads
from harness.log.kafka.checksum import record_headers
from harness.log.kafka.config import DEFAULT_PARTITIONS, SUBMIT_TIMEOUT_S, KafkaSettings, parse_kafka_url
from harness.log.kafka.fanout import Fanout
from harness.log.kafka.followers import Followers
from harness.log.kafka.index import Indexes, KeyObserver
from harness.log.kafka.inputs import (
    DLQ_ERROR_HEADER,
    DLQ_OFFSET_HEADER,
    DLQ_PARTITION_HEADER,
    DLQ_TOPIC_HEADER,
    DeadLetters,
    InputProducer,
)
from harness.log.kafka.own_thread import on_own_thread
from harness.log.kafka.owners import Owners
from harness.log.kafka.partitioner import partition_for
from harness.log.kafka.reader import ConsumerPool, ReadResult, partition_end, read_range, result_seq
from harness.log.kafka.session_writer import KafkaSessionWriter
from harness.log.kafka.snapshots import SnapshotStore
from harness.log.kafka.stats import KafkaLogStats
from harness.log.kafka.topics import ClusterProbe, ensure_topics
from harness.log.kafka.writer import RecordTooLarge
from harness.records import Record

__all__ = [
    "DLQ_ERROR_HEADER",
    "DLQ_OFFSET_HEADER",
    "DLQ_PARTITION_HEADER",
    "DLQ_TOPIC_HEADER",
    "KafkaLog",
    "KafkaLogStats",
    "KafkaSessionWriter",
    "RecordTooLarge",
    "open_kafka_log",
]

log = logging.getLogger("harness.log.kafka")

TAIL_CATCH_UP_S = 0.5
"""How long a whole-history read waits for this process's shared tail of the partition to
reach the partition's end before it reads the log itself."""



def open_kafka_log(url: str, **options: Any) -> KafkaLog:
    """Open the Kafka log of ``kafka://host:port[,host:port][?options]``.

    URL options: ``topic_prefix`` (default ``harness``), ``partitions`` (the existing
    topic's count; 12 for a topic this log creates),
    ``replication_factor`` (1), ``min_insync_replicas``, ``registry_url`` (encode with
    Confluent Schema Registry framing). Keyword ``options`` go to :class:`KafkaLog`
    and win over the URL's.
    """
    kwargs = parse_kafka_url(url)
    registry_url = kwargs.pop("registry_url", None)
    kwargs.update(options)
    if registry_url is not None and kwargs.get("codec") is None:
        from harness.codec import ConfluentRegistryClient, RecordCodec

        prefix = kwargs.get("topic_prefix", "harness")
        client = ConfluentRegistryClient(
            registry_url, subject_prefix=KafkaSettings("-", prefix).sessions_topic
        )
        kwargs["codec"] = RecordCodec(framing="registry", schema_ids=client)
    return KafkaLog(**kwargs)


class KafkaLog:
    """A :class:`~harness.log.base.SessionLog` on a Kafka cluster.

    Args:
        bootstrap: ``host:port[,host:port]``.
        topic_prefix: topics are ``<prefix>.sessions`` and ``<prefix>.dead-letter``;
            also the log's ``namespace`` (part of every idempotency key: never change it).
        partitions: partitions of the sessions topic: validated if it exists, created so
            if not. None (the default): the existing topic's count, read from the broker
            at ``start()``; a topic this log creates gets ``DEFAULT_PARTITIONS``.
        create_topics: create missing topics (workers, hosts). False for clients that
            only submit inputs and read (``HarnessClient``, the ``harness`` session
            commands): a missing sessions topic raises ``TopicNotFound`` at ``start()``.
        replication_factor: for topics this log creates.
        min_insync_replicas: ``min.insync.replicas`` of topics this log creates.
        topic_config: more topic settings for topics this log creates (the defaults are
            ``cleanup.policy=delete``, ``retention.ms=-1``).
        client_config: librdkafka settings (security, ...) for every client; copied.
        codec: the record codec; ``harness.codec.default_codec()`` by default.

    Topics are created (or checked) on first use, or by ``await start()``.
    """

    has_leases: ClassVar[bool] = False
    """Kafka fences by producer epoch, not by lease: ``claim`` never raises ``SessionBusy``."""

    def __init__(
        self,
        *,
        bootstrap: str,
        topic_prefix: str = "harness",
        partitions: int | None = None,
        replication_factor: int = 1,
        min_insync_replicas: int | None = None,
        topic_config: Mapping[str, str] | None = None,
        client_config: Mapping[str, Any] | None = None,
        codec: _Codec | None = None,
        create_topics: bool = True,
    ) -> None:
        self._partitions_known = partitions is not None
        self._create_topics = create_topics
        self.settings = KafkaSettings(
            bootstrap=bootstrap,
            topic_prefix=topic_prefix,
            partitions=partitions if partitions is not None else DEFAULT_PARTITIONS,
            replication_factor=replication_factor,
            min_insync_replicas=min_insync_replicas,
            topic_config=dict(topic_config or {}),
            client_config=dict(client_config or {}),
        )
        self.stats = KafkaLogStats()
        self._codec = codec if codec is not None else _default_codec()
        self._lock = threading.Lock()  # guards the fields below; never held while waiting
        self._start_lock = threading.Lock()
        self._started = False
        self._probe: ClusterProbe | None = None
        self._closed = False
        self._followers = Followers(
            lambda: self.settings,
            decode=self._codec.decode,
            peek=self._codec.framed_type,
            stats=self.stats,
            scan=self._catch_up_read,
            skip_corrupt=self._skip_corrupt,
            dead_letter=self._dead_letter,
            check_open=self._check_open,
            on_covered=self._tail_covered,
        )
        self._owners = Owners(lambda: self.settings, self.stats, on_records=self._followers.own)
        self._inputs: InputProducer | None = None
        self._dead_letters = DeadLetters(self.settings, self.stats, self._input_producer)
        self._pool = ConsumerPool(self.settings)
        self._snapshots: SnapshotStore | None = None
        self._indexes = Indexes(self._latest_checkpoint)
        # partition -> reads waiting for a shared tail to reach an end: (end, waiter)
        self._tail_waiters: dict[int, list[tuple[int, asyncio.Future[None]]]] = {}
        self._reads = BlockingReads()

    @property
    def reads_running(self) -> int:
        """Blocking reads (partitions, checkpoints) on threads and not finished: with the
        broker down each waits up to its timeout, whoever was waiting for it."""
        return self._reads.running

    @property
    def namespace(self) -> str:
        return self.settings.topic_prefix

    def partition_for(self, session_id: str) -> int:
        """The partition of the sessions topic that holds ``session_id``.

        Raises:
            RuntimeError: the partition count is to be read from the broker and
                ``start()`` has not run yet.
        """
        if not self._partitions_known:
            raise RuntimeError("the sessions topic's partition count is read from the broker: await start() first")
        return partition_for(session_id, self.settings.partitions)

    async def start(self) -> None:
        """Create the topics when missing (or check that they exist) and validate them;
        learn the partition count when it was not given. Done lazily otherwise."""
        if not self._started:
            await asyncio.to_thread(self._start_blocking)

    def _start_blocking(self) -> None:
        with self._start_lock:
            self._check_open()
            if not self._started:
                count = ensure_topics(self.settings, create=self._create_topics, adopt=not self._partitions_known)
                if count != self.settings.partitions:
                    self.settings = dataclasses.replace(self.settings, partitions=count)
                self._partitions_known = True
                self._started = True

    async def check_reachable(self, timeout: float) -> None:
        """That the cluster answers now and the sessions topic is there (readiness: once
        started, a log goes on without asking).

        Raises:
            LogUnavailable: no answer within ``timeout`` seconds, or the topic is gone.
        """
        if self._probe is None:
            self._probe = ClusterProbe(self.settings)
        # On a thread of its own: while the broker is down, reads may hold every thread of
        # the default pool until their deadline, and the probe must still answer in time.
        await on_own_thread(self._probe.check, timeout)

    # --- reads ---------------------------------------------------------------------------

    async def read(self, session_id: str, *, after: int | None = None) -> list[LogEntry]:
        """Committed records of ``session_id`` with seq > ``after``; poison records are skipped.

        Without ``after`` (or with one <= 0) the whole history is read from where the
        session starts (see :meth:`history`), not from the partition's first offset.
        A record that cannot be decoded is copied to the dead-letter topic (once per
        process), counted in ``stats`` and skipped: it never stalls the partition.
        """
        held, items = await self._session_items(session_id, after)
        return held + await self._skip_corrupt(items)

    async def _session_items(self, session_id: str, after: int | None) -> tuple[list[LogEntry], list[ReadResult]]:
        partition = self.partition_for(session_id)
        key = message_key(session_id)
        if after is not None and after > 0:
            return [], await self._scan_partition(partition, after, key=key)
        index = await self._indexes.get(partition)
        end = await self._tail_reached_end(partition)
        held, start = index.history(session_id)  # (after the wait: what the tail taught it)
        if end is not None and start >= end:  # every session with a record below ``end`` is known
            self.stats.add(reads_from_tail=1)
            return held, []
        return held, await self._scan_partition(partition, start, key=key)

    async def _tail_reached_end(self, partition: int) -> int | None:
        """The partition's end now, once a shared tail of this process has read up to it
        (the partition's index then knows every session with a record below it).

        None when no tail follows the partition here, its index is not loaded, or the tail
        did not get there within ``TAIL_CATCH_UP_S``: a read of the log does instead. The
        end is asked of the broker (a read must see every commit made before it began);
        waiting for the tail, a few milliseconds behind, costs less than fetching the same
        records again with a consumer of their own.
        """
        index = self._indexes.known(partition)
        if index is None or not self._followers.following(partition):
            return None
        end = await self._reads.run(
            partition_end, self._pool, topic=self.settings.sessions_topic, partition=partition
        )
        end = max(end, self._owners.committed(partition))
        if index.position >= end:
            return end
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._tail_waiters.setdefault(partition, []).append((end, waiter))
        try:
            async with asyncio.timeout(TAIL_CATCH_UP_S):
                await waiter
        except TimeoutError:
            return None
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._tail_waiters.get(partition, []).remove((end, waiter))
        return end

    async def history(self, session_id: str) -> tuple[list[LogEntry], int]:
        """Where the whole history of ``session_id`` starts: ``(records, offset)``.

        ``records`` are those the partition's checkpoint holds (a live session's), the rest
        is read from ``offset`` on. Known from the latest checkpoint of the partition and
        the reads this process made since (:class:`~harness.log.kafka.index.PartitionIndex`);
        without either, 0.
        """
        index = await self._indexes.get(self.partition_for(session_id))
        return index.history(session_id)

    def _tail_covered(self, partition: int, covered: int, ring_start: int, ring: deque[Any]) -> None:
        """A shared tail of this process read ``partition`` up to ``covered``: the index of
        where its sessions start learns the sessions that began since (from the tail's ring
        of recent records), so a read of a session it has not seen starts at ``covered``."""
        index = self._indexes.known(partition)
        if index is None:
            return
        index.follow(covered, ring_start, ((msg.key(), msg.offset()) for msg in reversed(ring)))
        with self._lock:
            waiters = self._tail_waiters.get(partition)
            ready = [w for w in waiters if w[0] <= index.position] if waiters else []
        for _, waiter in ready:
            waiter.get_loop().call_soon_threadsafe(_wake, waiter)

    async def _latest_checkpoint(self, partition: int, have: frozenset[str] = frozenset()) -> Checkpoint | None:
        await self.start()
        return await self.snapshots.read(partition, create=False, have=have)

    async def read_partition(
        self,
        partition: int,
        start_offset: int = 0,
        end_offset: int | None = None,
        *,
        lazy: bool = False,
        on_corrupt: Callable[[CorruptRecord], object] | None = None,
    ) -> list[LogEntry]:
        """Every session's committed records with ``start_offset <= offset < end_offset``.

        Without ``end_offset``, up to the partition's current end. The next read starts
        at ``entries[-1].seq``. Poison records are dead-lettered and skipped. With
        ``lazy`` the entries are :class:`~harness.log.kafka.reader.LazyEntry`: only their
        framing is checked now, their body is decoded on first use (a worker's rebuild
        never decodes most records of sessions that ended); a body that then fails to
        decode raises ``CodecError`` and is for the caller to report (``dead_letter``).
        ``on_corrupt`` is told about every poison record too (a worker parks its session).
        """
        items = await self._scan_partition(partition, start_offset, end=end_offset, lazy=lazy)
        if on_corrupt is not None:
            for item in items:
                if isinstance(item, CorruptRecord):
                    on_corrupt(item)
        return await self._skip_corrupt(items)

    async def scan_partition(
        self, partition: int, start_offset: int = 0, end_offset: int | None = None
    ) -> list[ReadResult]:
        """Like :meth:`read_partition`, but an unreadable record comes back as its
        ``CorruptRecord`` and nothing is dead-lettered: a read that writes nothing."""
        return await self._scan_partition(partition, start_offset, end=end_offset)

    def dead_letter(self, corrupt: CorruptRecord) -> None:
        """Copy an undecodable record to ``<prefix>.dead-letter`` (once per process)."""
        self._dead_letter_all([corrupt])

    async def tail_partition(
        self,
        partition: int,
        start_offset: int = 0,
        *,
        dead_letter: bool = True,
        on_corrupt: Callable[[CorruptRecord], object] | None = None,
    ) -> AsyncIterator[LogEntry]:
        """Every committed record of ``partition`` from ``start_offset`` on, as it commits.

        Never ends by itself; close the iterator (``aclose()``, or leave ``async for``) to
        stop. Served by the partition's shared tail (:attr:`fanout`). Poison records are
        dead-lettered and skipped; ``on_corrupt`` is told about each one too, on the event
        loop (a worker parks its session). ``dead_letter=False`` (a reader that writes
        nothing) skips them quietly.
        """
        await self.start()
        if not 0 <= partition < self.settings.partitions:
            raise ValueError(f"partition {partition} is not in 0..{self.settings.partitions - 1}")
        async for entry in self._followers.tail(
            partition, start_offset, dead_letter=dead_letter, on_corrupt=on_corrupt
        ):
            yield entry

    async def subscribe(
        self,
        session_id: str,
        *,
        after: int | None = None,
        dead_letter: bool = True,
        types: frozenset[str] | None = None,
    ) -> AsyncIterator[LogEntry]:
        """The committed records of ``session_id`` with seq > ``after``, in order, live.

        ``after=None`` (or <= 0): the whole history, from where the session starts (see
        :meth:`history`). Served by the partition's shared tail: however many subscribers,
        one consumer per partition; no gap and no duplicate between the history and the
        live records. Never ends by itself; close the iterator to stop. A poison record is
        dead-lettered and skipped; ``dead_letter=False`` (a reader that writes nothing: a
        client, the gateway) skips it quietly, on a shared tail of its own. ``types``: the
        record types wanted, a hint (records nobody wants are not decoded; others may
        still come).

        Raises:
            LogUnavailable: the partition's tail failed (subscribe again).
        """
        await self.start()
        if after is None or after <= 0:
            held, after = await self.history(session_id)
            for entry in held:
                yield entry
        followed = self._followers.follow(
            self.partition_for(session_id), after=after, session_id=session_id, dead_letter=dead_letter, types=types
        )
        async for entry in followed:
            yield entry

    @property
    def fanout(self) -> Fanout:
        """The shared tails of this process (one consumer per partition followed)."""
        return self._followers.fanout

    @property
    def quiet_fanout(self) -> Fanout:
        """The shared tails of the subscribers that write nothing (``dead_letter=False``:
        clients, the gateway): a poison record is skipped, never dead-lettered."""
        return self._followers.quiet_fanout

    async def _catch_up_read(
        self, partition: int, start: int, end: int, key: bytes | None, limit: int
    ) -> list[ReadResult]:
        """What a follower that starts behind its shared tail reads first: up to ``end``."""
        return await self._scan_partition(partition, start, end=end, key=key, limit=limit, must_reach=end)

    async def scan(
        self, session_id: str | None = None, *, after: int | None = None, limit: int | None = None
    ) -> list[ReadResult]:
        """Like ``read``/``read_all``, but an unreadable record comes back as its ``CorruptRecord``.

        Nothing is dead-lettered. Without ``session_id`` every partition is read and the
        entries are ordered by ``(seq, partition)``: a true log order with one partition,
        an arbitrary interleaving otherwise (use ``read_partition`` per partition).
        """
        start = after or 0
        await self.start()
        if session_id is not None:
            held, items = await self._session_items(session_id, after)
            items = [*held, *items]
            return items[:limit] if limit is not None else items
        per_partition = await asyncio.gather(
            *(self._scan_partition(p, start, limit=limit) for p in range(self.settings.partitions))
        )
        merged = sorted(
            (item for items in per_partition for item in items),
            key=lambda item: (result_seq(item), _partition(item, self)),
        )
        return merged[:limit] if limit is not None else merged

    async def read_all(self, *, after: int | None = None, limit: int | None = None) -> list[LogEntry]:
        """Every session's committed records (see :meth:`scan` for the order); poison skipped."""
        return await self._skip_corrupt(await self.scan(None, after=after, limit=limit))

    async def sessions(self) -> list[str]:
        """Every session with at least one readable record, in order of its first record."""
        seen: dict[str, None] = {}
        for item in await self.scan(None):
            if isinstance(item, LogEntry):
                seen.setdefault(item.session_id, None)
        return list(seen)

    async def lease_info(self, session_id: str) -> LeaseInfo:
        """What this process knows: its live writer's owner (if any) and the local epoch."""
        return self._owners.lease_info(session_id)

    async def _scan_partition(
        self,
        partition: int,
        start: int,
        *,
        end: int | None = None,
        key: bytes | None = None,
        limit: int | None = None,
        lazy: bool = False,
        must_reach: int = 0,
    ) -> list[ReadResult]:
        await self.start()
        if not 0 <= partition < self.settings.partitions:
            raise ValueError(f"partition {partition} is not in 0..{self.settings.partitions - 1}")
        must_reach = max(must_reach, self._owners.committed(partition))
        index = self._indexes.known(partition)
        # A read that starts inside what the index accounts for teaches it the sessions after.
        observe = KeyObserver(start) if index is not None and start <= index.position else None
        self.stats.add(reads=1)
        items = await self._reads.run(
            read_range,
            self._pool,
            self._codec.decode,
            topic=self.settings.sessions_topic,
            partition=partition,
            start=start,
            end=end,
            must_reach=must_reach,
            key=key,
            limit=limit,
            peek=self._codec.peek_type if lazy else None,
            fields=self._codec.decode_fields if lazy else None,
            observe=observe,
        )
        if observe is not None and index is not None:
            index.observe(observe)
        return items

    async def _skip_corrupt(self, items: Sequence[ReadResult]) -> list[LogEntry]:
        corrupt = [item for item in items if isinstance(item, CorruptRecord)]
        if not corrupt:
            return list(items)  # type: ignore[arg-type]  # no CorruptRecord in it
        self.stats.add(corrupt=len(corrupt))
        await asyncio.to_thread(self._dead_letter_all, corrupt)
        return [item for item in items if isinstance(item, LogEntry)]

    def _dead_letter_all(self, corrupt: Sequence[CorruptRecord]) -> None:
        for item in corrupt:
            self._dead_letter(item)

    def _dead_letter(self, corrupt: CorruptRecord) -> None:
        """Copy a poison record to the dead-letter topic, once per process (blocking; never raises)."""
        self._dead_letters.send(corrupt)

    # --- writes --------------------------------------------------------------------------

    async def submit(self, record: Record) -> LogEntry:
        """Append one input record (``IS_INPUT``) for the session's owner; no ownership needed.

        Idempotent producer, acks=all; returns once the partition leader acknowledged it.
        """
        _check_input(record)
        ((record_type, value),) = _encode_batch(self._codec, record.session_id, [record])
        await self.start()
        partition = self.partition_for(record.session_id)
        try:
            future = self._input_producer().produce(
                self.settings.sessions_topic,
                value=value,
                key=message_key(record.session_id),
                partition=partition,
                headers=record_headers(record_type, value),
            )
            offset = await asyncio.wait_for(asyncio.wrap_future(future), SUBMIT_TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise RecordTooLarge(
                    f"input of session {record.session_id!r} is {len(value)} bytes, more than the log accepts "
                    f"({error.str()}): send less, or raise the topic's max.message.bytes and the clients' "
                    "message.max.bytes (HARNESS_KAFKA_CONFIG_MESSAGE_MAX_BYTES) together",
                    session_id=record.session_id,
                    size=len(value),
                ) from exc
            raise LogUnavailable(f"submit to session {record.session_id!r} failed: {error.str()}") from exc
        except TimeoutError as exc:
            raise LogUnavailable(f"submit to session {record.session_id!r} not acknowledged in time") from exc
        self._owners.note_commit(partition, offset + 1)
        self.stats.add(submits=1)
        return LogEntry(offset + 1, record)

    async def claim(self, session_id: str, *, owner: str, lease: timedelta) -> KafkaSessionWriter:
        """Become the writer of ``session_id`` (``lease`` is validated, not used: no leases).

        The first claim of a partition starts its fenced producer (``init_transactions``
        fences any other process's writer of the partition); later claims in this
        process share it, also once every earlier session of the partition was released
        (the producer lives as long as the log). A claim fences this process's earlier
        writer of the session. If another process fenced the partition's producer while
        it sat idle, the first append says so (``FencedError``); the claim after that
        starts a new producer, which fences the other process in turn.

        A worker's log (one that ``own_partition`` was called on) never starts a producer
        in ``claim``: only the group's assignment does (``own_partition``). A claim of a
        partition it was not given, or whose producer stopped (fenced by another writer,
        or dead after a failure), raises ``FencedError``: a new producer there could fence
        the partition's real owner, e.g. when this process was frozen and the group moved
        the partition meanwhile. The worker takes such a partition up again itself once
        the group still says it is its own (``harness.runtime.group``).

        Raises:
            LogUnavailable: the producer could not be started.
            FencedError: another writer fenced this one while it started, or (a worker)
                the partition is not this worker's or its producer stopped.
        """
        _lease_seconds(lease)
        await self.start()
        self._check_open()
        partition = self.partition_for(session_id)
        writer, epoch = self._owners.claim(session_id, partition, owner)
        ready = writer.ready
        started = ready.done() and not ready.cancelled() and ready.exception() is None
        if not started:  # (a producer that started already costs no wait and no hop through a thread)
            await _shared(ready)
        return KafkaSessionWriter(
            self, session_id, owner=owner, epoch=epoch, partition=partition, writer=writer
        )

    @property
    def snapshots(self) -> SnapshotStore:
        """Partition checkpoints (``<prefix>.snapshots``), for workers' bounded rebuilds."""
        if self._snapshots is None:
            self._snapshots = SnapshotStore(self.settings, self._codec, reads=self._reads)
        return self._snapshots

    async def own_partition(self, partition: int) -> None:
        """Start a NEW fenced producer for ``partition`` now (e.g. when a worker is assigned it).

        Fences every other writer of the partition, in any process, and this process's
        earlier session writers of it (their next append raises ``FencedError``).
        """
        await self.start()
        self._check_open()
        await _shared(self._owners.own(partition).ready)

    def partition_stopped(self, partition: int) -> str | None:
        """Why the producer of an owned partition stopped (fenced by another writer, or
        dead after a failure), or None while it can write (or the partition is not owned)."""
        return self._owners.stopped(partition)

    async def disown_partition(self, partition: int) -> None:
        """Give up ``partition`` (revoked from this worker): close its producer.

        This process's session writers of the partition are fenced (their next append
        raises ``FencedError``); queued appends finish first.
        """
        closing = self._owners.disown(partition)
        if closing is not None:
            await _shared(closing)

    @property
    def codec(self) -> _Codec:
        return self._codec

    def check_writer(self, writer: KafkaSessionWriter) -> None:
        self._check_open()
        if not self._owners.is_current(writer.session_id, writer.epoch):
            raise FencedError(
                f"writer epoch {writer.epoch} of session {writer.session_id!r} lost ownership "
                "(claimed again or released)",
                session_id=writer.session_id,
                epoch=writer.epoch,
            )

    async def release_writer(self, writer: KafkaSessionWriter) -> None:
        # The partition's producer stays open, also when this was its last session:
        # the next claim of the partition needs no new init_transactions (~100 ms).
        self._owners.release(writer.session_id, writer.epoch, writer.shared)

    # --- lifecycle -----------------------------------------------------------------------

    def _input_producer(self) -> InputProducer:
        with self._lock:
            self._check_open()
            if self._inputs is None:
                self._inputs = InputProducer(self.settings)
            return self._inputs

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed("the Kafka session log is closed")

    async def close(self) -> None:
        """Finish queued appends, close every producer and consumer. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            inputs, self._inputs = self._inputs, None
        writers = self._owners.close()
        closing = [asyncio.wrap_future(w.close()) for w in writers]
        await asyncio.gather(*closing, return_exceptions=True)
        await self._followers.close()
        await asyncio.to_thread(self._pool.close)
        self._reads.close()  # (reads still waiting for a broker end at their timeout; nobody waits)
        if self._snapshots is not None:
            await asyncio.to_thread(self._snapshots.close)
        if inputs is not None:
            await asyncio.to_thread(inputs.close)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _shared(future: concurrent.futures.Future[Any]) -> asyncio.Future[Any]:
    """Wait for a writer's ``ready``/``closed``, which other callers may wait for too.

    ``asyncio.wrap_future`` cancels the underlying future when its waiter is cancelled:
    one cancelled claim would cancel ``ready`` for every other claim of the partition
    (and make the writer thread fail at ``set_result``, never closing its producer), and
    a cancelled ``disown_partition`` would make the next writer's start fail.
    """
    return asyncio.shield(asyncio.wrap_future(future))


def _partition(item: ReadResult, kafka_log: KafkaLog) -> int:
    if isinstance(item, LogEntry):
        return kafka_log.partition_for(item.session_id)
    return item.partition or 0
