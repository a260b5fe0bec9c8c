"""Owner writes on Kafka: one fenced transactional producer per owned partition.

A :class:`PartitionWriter` owns the producer whose ``transactional.id`` is
``ids.owner_transactional_id(prefix, partition)``; its ``init_transactions`` fences the
partition's previous owner (in this process or any other). Every session of that
partition that this log claims appends through it. Its dedicated thread runs every
blocking librdkafka call (the event loop never blocks) and does GROUP COMMIT: the
appends queued while a transaction commits all go into the next transaction together,
so N concurrent sessions pay for one commit round trip, not N.

All transaction discipline lives in :meth:`PartitionWriter._commit`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from harness.errors import FencedError, LogError, LogUnavailable, RecordTooLarge
from harness.ids import message_key
from harness.log.kafka.checksum import record_headers
from harness.log.kafka.config import (
    COMMIT_DEADLINE_S,
    GROUP_COMMIT_LINGER_S,
    INIT_TIMEOUT_S,
    MAX_ABORT_RETRIES,
    MAX_APPENDS_PER_TRANSACTION,
    PREVIOUS_CLOSE_TIMEOUT_S,
    KafkaSettings,
    Verdict,
    classify,
)
from harness.log.kafka.stats import KafkaLogStats
from harness.observability import metrics
from harness.records import InputSettled, Record

__all__ = ["Append", "PartitionWriter", "RecordTooLarge", "linger_for", "returning_sessions", "wake"]

log = logging.getLogger("harness.log.kafka")

# confluent-kafka warns when a producer's close cannot abort its open transaction (the
# broker is down): nothing of that transaction is visible, and the partition's next
# owner aborts it with its init_transactions. Not a warning for a person reading the log.
warnings.filterwarnings("ignore", message="Producer abort_transaction failed during close", category=RuntimeWarning)

_TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})


@dataclass(slots=True, eq=False)
class Append:
    """One ``SessionWriter.append``: encoded records, resolved with their offsets.

    ``future`` is the outcome (thread-safe; the writer marks it running when its
    transaction begins, so a cancel after that changes nothing). ``waiter``, an asyncio
    future of ``loop``, is what the appender awaits: the writer wakes every waiter of a
    group commit with ONE call into each loop, not one per append (:func:`wake`).
    """

    session_id: str
    epoch: int
    values: Sequence[tuple[str, bytes]]  # (record type, encoded value)
    future: concurrent.futures.Future[list[int]]
    records: Sequence[Record] = ()  # what was encoded (told to ``on_records`` as each is delivered)
    loop: asyncio.AbstractEventLoop | None = None
    waiter: asyncio.Future[list[int]] | None = None


def wake(appends: Sequence[Append]) -> None:
    """Hand the outcomes of ``appends`` (resolved ones) to their waiters: one call per
    event loop (any thread)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Append]] = {}
    for append in appends:
        if append.loop is not None and append.waiter is not None and append.future.done():
            by_loop.setdefault(append.loop, []).append(append)
    for loop, woken in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_settle_waiters, woken)


def _settle_waiters(appends: list[Append]) -> None:
    """(On the appenders' loop.) Copy each outcome to its waiter."""
    for append in appends:
        waiter, future = append.waiter, append.future
        if waiter is None or waiter.done():
            continue  # its appender was cancelled meanwhile
        if future.cancelled():
            waiter.cancel()
        elif (error := future.exception()) is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(future.result())


class _Rejected(Exception):
    """Internal: one append must fail alone; the transaction is aborted and retried without it."""

    def __init__(self, append: Append, error: LogError) -> None:
        super().__init__(str(error))
        self.append = append
        self.error = error


_TURN_END = InputSettled.TYPE


def returning_sessions(batch: Sequence[Append]) -> set[str]:
    """The sessions of a committed batch that will be back with their next append a
    moment after the commit: all but those whose append settled their input (they have
    nothing more to write until somebody sends them another)."""
    ended = {a.session_id for a in batch if any(t == _TURN_END for t, _v in a.values)}
    return {a.session_id for a in batch} - ended


def linger_for(returning: set[str], batch: Sequence[Append]) -> int:
    """How many distinct sessions the next transaction should wait for (0: commit now).

    Group commit under load: the sessions of the last transaction that still have work
    come back with their next append a moment after it committed. Without waiting for
    them they would start the next-but-one transaction, and the partition's sessions
    would alternate between two half-full transactions. Only when several sessions are
    active (a lone session never waits) and one of them is not in yet; the wait never
    exceeds ``GROUP_COMMIT_LINGER_S``.
    """
    if len(returning) < 2:
        return 0
    present = {a.session_id for a in batch}
    expected = returning | present
    return len(expected) if len(present) < len(expected) else 0


class PartitionWriter:
    """The fenced producer of one partition and the thread that group-commits into it.

    Args:
        settings: the log's settings.
        partition: the owned partition of the sessions topic.
        stats: counters to update.
        is_current: ``(session_id, epoch) -> bool``: False once the session was
            claimed again or released in this process (local fencing).
        on_commit: called with ``(partition, next_offset)`` after every commit.
        on_records: called (on the writer thread) with ``(partition, [(offset, record)])``
            for each record of an append that carried its records, as its delivery is
            acknowledged and before its transaction commits (so before any read_committed
            reader can see it): this process's tails of the partition need not decode it
            again. A record whose transaction then aborts is never read at that offset
            (offsets are not reused), so what was told of it is simply passed by.
        previous: this partition's earlier writer, still closing; waited for first so
            its last transaction is not fenced in flight.
    """

    def __init__(
        self,
        *,
        settings: KafkaSettings,
        partition: int,
        stats: KafkaLogStats,
        is_current: Callable[[str, int], bool],
        on_commit: Callable[[int, int], None],
        previous: PartitionWriter | None = None,
        on_records: Callable[[int, list[tuple[int, Record]]], None] | None = None,
    ) -> None:
        self.partition = partition
        self.sessions: set[str] = set()  # sessions whose current writer uses this one (log's lock)
        self.ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.closed: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._settings = settings
        self._topic = settings.sessions_topic
        self._stats = stats
        self._is_current = is_current
        self._on_commit = on_commit
        self._on_records = on_records
        self._previous = previous
        self._queue: queue.SimpleQueue[Append | None] = queue.SimpleQueue()
        self._dead: LogError | None = None
        self._closing = False
        self._producer: Any = None
        self._thread = threading.Thread(
            target=self._run, name=f"harness-kafka-owner-{partition}", daemon=True
        )

    # --- called from any thread ----------------------------------------------------------

    @property
    def dead(self) -> bool:
        """Fenced or broken: every append fails; a new claim needs a new writer."""
        return self._dead is not None

    @property
    def dead_reason(self) -> str:
        """What stopped the writer ("" while it can write)."""
        return "" if self._dead is None else str(self._dead)

    @property
    def fenced(self) -> bool:
        """Dead because another producer of the partition fenced it (or a fatal error)."""
        return isinstance(self._dead, FencedError)

    @property
    def closing(self) -> bool:
        """Released (or closing with the log): a new claim needs a new writer."""
        return self._closing

    def start(self) -> concurrent.futures.Future[None]:
        self._thread.start()
        return self.ready

    def enqueue(self, append: Append) -> None:
        """Queue an append for the next transaction (raises at once if the writer is dead)."""
        if self._dead is not None:
            raise self._dead_error(append.session_id)
        if self._closing:
            raise FencedError(
                f"session {append.session_id!r} was released; claim it again to write",
                session_id=append.session_id,
                epoch=append.epoch,
            )
        self._queue.put(append)

    def close(self) -> concurrent.futures.Future[None]:
        """Finish the queued appends, then close the producer; ``closed`` resolves after."""
        self._closing = True
        self._queue.put(None)
        if not self._thread.is_alive() and not self.closed.done():
            self.closed.set_result(None)  # never started
        return self.closed

    # --- the writer thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self._previous is not None:
                try:
                    self._previous.closed.result(timeout=PREVIOUS_CLOSE_TIMEOUT_S)
                except concurrent.futures.TimeoutError:
                    log.warning(
                        "partition %d: the previous producer of this process did not close within %.0f s; "
                        "starting the new one anyway (it fences the old one)", self.partition,
                        PREVIOUS_CLOSE_TIMEOUT_S,
                    )
            self._producer = Producer(self._settings.owner_producer_config(self.partition))
            self._call(self._producer.init_transactions, time.monotonic() + INIT_TIMEOUT_S)
        except KafkaException as exc:
            self._die(self._error_for(exc.args[0], "init_transactions"))
            self.ready.set_exception(self._dead_error(None))
            self._finish()
            return
        except Exception as exc:  # noqa: BLE001 - a bad client_config and the like: report, do not hang
            self._die(LogUnavailable(f"cannot start the owner producer of partition {self.partition}: {exc}"))
            self.ready.set_exception(self._dead_error(None))
            self._finish()
            return
        self.ready.set_result(None)
        stop = False
        returning: set[str] = set()  # sessions of the last transaction with more to write
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            stop = self._drain(batch, None)
            expected = linger_for(returning, batch)
            if not stop and expected:
                stop = self._drain(batch, (time.monotonic() + GROUP_COMMIT_LINGER_S, expected))
            returning = returning_sessions(batch)
            try:
                self._commit(batch)
            except Exception as exc:  # a bug must fail the appends, not hang them
                log.exception("group commit of partition %d failed unexpectedly", self.partition)
                self._die(LogUnavailable(f"owner writer of partition {self.partition} failed: {exc}"))
                self._fail(batch, self._dead_error)
            wake(batch)
        self._finish()

    def _drain(self, batch: list[Append], linger: tuple[float, int] | None) -> bool:
        """Add queued appends to ``batch``; with ``linger`` (deadline, sessions), wait for
        more until ``sessions`` distinct sessions are in or the deadline passed.
        True if the close sentinel was met (the batch still commits first)."""
        while len(batch) < MAX_APPENDS_PER_TRANSACTION:
            try:
                if linger is None:
                    item = self._queue.get_nowait()
                else:
                    deadline, sessions = linger
                    if len({a.session_id for a in batch}) >= sessions:
                        return False
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    item = self._queue.get(timeout=remaining)
            except queue.Empty:
                return False
            if item is None:
                return True
            batch.append(item)
        return False

    def _finish(self) -> None:
        """Fail whatever is still queued, close the producer, resolve ``closed``."""
        self._closing = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self._fail([item], self._dead_error if self._dead else self._released_error)
                wake([item])
        if self._producer is not None:
            with contextlib.suppress(Exception):  # a fenced producer may refuse; it is gone anyway
                self._producer.flush(1.0)
            with contextlib.suppress(Exception):
                self._producer.close()  # (its RuntimeWarning when it cannot abort: see the filter above)
            self._producer = None
        if not self.closed.done():
            self.closed.set_result(None)

    def _commit(self, batch: list[Append]) -> None:
        """Commit one group of appends in as few transactions as possible; resolve each.

        This is the only place that begins, commits or aborts a transaction.

        1. Drop appends that must not land: cancelled by their caller before the
           transaction began, or whose session was claimed again / released in this
           process since they were queued (-> ``FencedError``, local fencing).
        2. ``begin_transaction()``.
        3. ``produce()`` every record of every append, in queue order, to
           (sessions topic, this partition), key = session id, header ``harness.type``.
           A delivery callback keeps each record's offset. A record the client refuses
           as too large fails ITS append alone with :class:`RecordTooLarge`: abort
           (step 6) and go back to 2 without it.
        4-5. ``commit_transaction()``: it flushes (every record acknowledged by the
           partition leader, acks=all; the delivery callbacks run meanwhile, so each
           record's offset is known when it returns), then commits. A delivery report
           of a too-large record is handled like in 3; any other delivery error makes
           the commit fail as abortable (step 6). Only now are the records visible to read_committed
           readers, and only now does any append of the batch return, each with its
           records' offsets (contiguous for one append: this producer is the only
           transactional writer of the partition, and it produces them back to back).
        6. On a ``KafkaError`` at any step, by :func:`~harness.log.kafka.config.classify`:

           - FENCED (another owner's ``init_transactions`` bumped the epoch, or a fatal
             error): every append of the batch fails with ``FencedError`` and this writer
             is dead. Nothing of the batch is visible: the transaction never committed,
             and the coordinator aborts it when the new owner fences us.
           - ABORT (``txn_requires_abort()``): ``abort_transaction()`` and retry the
             whole batch from 2 in a new transaction, at most ``MAX_ABORT_RETRIES``
             times. Safe: read_committed readers never see aborted records.
           - RETRY (``retriable()``): the same call again (inside :meth:`_call`) until
             ``COMMIT_DEADLINE_S``; past it the batch FAILs.
           - FAIL: abort, and the batch fails with ``LogUnavailable`` (nothing visible).
             If even the abort fails the outcome is unknown: the writer dies, so the
             owner must claim again and re-read the log before writing more.
        """
        pending = [a for a in batch if a.future.set_running_or_notify_cancel()]
        if self._dead is not None:  # queued before the writer died
            self._fail(pending, self._dead_error)
            return
        for append in [a for a in pending if not self._is_current(a.session_id, a.epoch)]:
            pending.remove(append)
            append.future.set_exception(self._released_error(append))
        deadline = time.monotonic() + COMMIT_DEADLINE_S
        aborts = 0
        while pending:
            try:
                offsets = self._transaction(pending, deadline)
            except _Rejected as rejected:
                self._stats.add(too_large=1)
                pending.remove(rejected.append)
                rejected.append.future.set_exception(rejected.error)
                if not self._abort(deadline, pending):
                    return
                continue
            except KafkaException as exc:
                error = exc.args[0]
                verdict = classify(error)
                if verdict is Verdict.FENCED:
                    self._stats.add(fenced=1)
                    self._die(self._error_for(error, "a transaction"))
                    self._fail(pending, self._dead_error)
                    return
                if verdict is Verdict.ABORT and aborts < MAX_ABORT_RETRIES:
                    aborts += 1
                    log.warning(
                        "partition %d: aborting and retrying a transaction: %s", self.partition, error.str()
                    )
                    if not self._abort(deadline, pending):
                        return
                    continue
                log.error("partition %d: transaction failed: %s", self.partition, error.str())
                if self._abort(deadline, pending):
                    reason = f"append to partition {self.partition} failed: {error.str()}"

                    def unavailable(_append: Append, reason: str = reason) -> LogError:
                        return LogUnavailable(reason)

                    self._fail(pending, unavailable)
                return
            metrics.group_commit(len(pending))
            self._stats.add(
                transactions=1,
                appends=len(pending),
                records=sum(len(a.values) for a in pending),
                aborts=aborts,
            )
            self._on_commit(self.partition, max(max(o) for o in offsets if o) + 1)
            for append, append_offsets in zip(pending, offsets, strict=True):
                append.future.set_result(append_offsets)
            return

    def _transaction(self, pending: list[Append], deadline: float) -> list[list[int]]:
        """Steps 2-5 of :meth:`_commit`: the records' offsets, per append."""
        producer = self._producer
        producer.begin_transaction()
        reports: list[list[tuple[Any, int]]] = [[] for _ in pending]
        tell = self._on_records
        partition = self.partition
        for i, append in enumerate(pending):
            sink = reports[i]
            key = message_key(append.session_id)
            records = append.records if len(append.records) == len(append.values) else None

            def on_delivery(
                err: Any, msg: Any, sink: list[tuple[Any, int]] = sink, records: Any = records
            ) -> None:
                offset = msg.offset()
                if err is None and records is not None and tell is not None:
                    # Told here, before the commit marker exists (delivery reports are
                    # served by commit_transaction's flush, before it sends EndTxn), so no
                    # tail of this process can read the record before it is told.
                    tell(partition, [(offset, records[len(sink)])])
                sink.append((err, offset))

            for record_type, value in append.values:
                self._produce(producer, append, key, record_type, value, on_delivery, deadline)
        # No flush() first: commit_transaction flushes, and delivery reports are served
        # while it does, so the offsets are known when it returns (one wake-up fewer).
        try:
            self._call(producer.commit_transaction, deadline)
        except KafkaException:
            for i, append in enumerate(pending):
                for err, _offset in reports[i]:
                    if err is not None and err.code() in _TOO_LARGE:
                        raise _Rejected(append, self._too_large(append, err.str())) from None
            raise
        except SystemError as exc:
            # confluent-kafka (2.16) surfaces a fatal error (e.g. _FENCED) raised while
            # serving delivery callbacks as a SystemError caused by the KafkaException.
            if isinstance(exc.__cause__, KafkaException):
                raise exc.__cause__ from None
            raise
        if any(len(r) < len(a.values) for r, a in zip(reports, pending, strict=True)):
            producer.flush(max(0.1, deadline - time.monotonic()))  # serve any report still queued
        return [[offset for _err, offset in r] for r in reports]

    def _produce(
        self,
        producer: Any,
        append: Append,
        key: bytes,
        record_type: str,
        value: bytes,
        on_delivery: Any,
        deadline: float,
    ) -> None:
        while True:
            try:
                producer.produce(
                    self._topic,
                    value=value,
                    key=key,
                    partition=self.partition,
                    headers=record_headers(record_type, value),
                    on_delivery=on_delivery,
                )
                return
            except BufferError:  # local queue full: let deliveries drain it
                if time.monotonic() > deadline:
                    raise KafkaException(
                        KafkaError(KafkaError._QUEUE_FULL, "producer queue full", retriable=True)
                    ) from None
                producer.poll(0.05)
            except KafkaException as exc:
                if exc.args[0].code() in _TOO_LARGE:
                    raise _Rejected(append, self._too_large(append, exc.args[0].str())) from exc
                raise

    def _call(self, op: Callable[[float], Any], deadline: float) -> Any:
        """``op(timeout)`` again while it fails with a retriable error and time remains."""
        while True:
            try:
                return op(max(0.1, deadline - time.monotonic()))
            except KafkaException as exc:
                error = exc.args[0]
                if classify(error) is not Verdict.RETRY or time.monotonic() >= deadline:
                    raise
                self._stats.add(retries=1)
                time.sleep(0.01)

    def _abort(self, deadline: float, pending: list[Append]) -> bool:
        """Abort the open transaction; False (writer dead, ``pending`` failed) if that fails."""
        try:
            self._call(self._producer.abort_transaction, max(deadline, time.monotonic() + 5.0))
            return True
        except KafkaException as exc:
            error = exc.args[0]
            if classify(error) is Verdict.FENCED:
                self._stats.add(fenced=1)
                self._die(self._error_for(error, "abort_transaction"))
            else:
                self._die(
                    LogUnavailable(
                        f"partition {self.partition}: abort failed ({error.str()}); the last batch's outcome is "
                        "unknown: claim the session again and read the log before writing"
                    )
                )
            self._fail(pending, self._dead_error)
            return False

    # --- errors ---------------------------------------------------------------------------

    def _die(self, error: LogError) -> None:
        if self._dead is None:
            self._dead = error
            log.warning("owner writer of partition %d stopped: %s", self.partition, error)

    def _error_for(self, error: Any, during: str) -> LogError:
        if classify(error) is Verdict.FENCED:
            return FencedError(
                f"partition {self.partition} is owned by another writer now ({during}: {error.str()})",
            )
        return LogUnavailable(f"partition {self.partition}: {during} failed: {error.str()}")

    def _dead_error(self, append: Append | str | None) -> LogError:
        dead = self._dead or LogUnavailable(f"owner writer of partition {self.partition} stopped")
        session_id = append.session_id if isinstance(append, Append) else append
        if isinstance(dead, FencedError):
            return FencedError(str(dead), session_id=session_id, epoch=getattr(append, "epoch", None))
        return LogUnavailable(str(dead))

    def _released_error(self, append: Append) -> FencedError:
        return FencedError(
            f"session {append.session_id!r} writer epoch {append.epoch} lost ownership (claimed again or released)",
            session_id=append.session_id,
            epoch=append.epoch,
        )

    def _too_large(self, append: Append, reason: str) -> RecordTooLarge:
        size = max(len(v) for _t, v in append.values)
        return RecordTooLarge(
            f"an append of session {append.session_id!r} holds a {size}-byte record that partition "
            f"{self.partition} refuses ({reason}); nothing of it was written",
            session_id=append.session_id,
            size=size,
        )

    @staticmethod
    def _fail(appends: Sequence[Append], error: Callable[[Append], BaseException]) -> None:
        for append in appends:
            if not append.future.done():
                append.future.set_exception(error(append))
