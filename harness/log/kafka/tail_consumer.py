"""The one tailing consumer of a process's shared tails, and its thread
(:mod:`harness.log.kafka.fanout` routes what it reads).

A read_committed consumer that never joins a group: the followed partitions are
``incremental_assign``ed to it as tails open and leave as they close. Its thread waits
for records (``WAIT_S``: it returns at the first one) and hands them to the event loop in
batches grouped by partition, at most ``IN_FLIGHT`` batches ahead of the loop
(back-pressure). Every other call on the consumer (watermarks, assignment changes) runs
on that thread too, between two waits, in the order asked for: librdkafka's consumer
calls wait for each other, so an ``incremental_assign`` from another thread would wait
for the poll loop forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, TopicPartition

from harness.errors import LogUnavailable
from harness.log.kafka.config import READ_TIMEOUT_S, KafkaSettings
from harness.log.kafka.reader import _TRANSIENT, _next_messages, _watermarks

__all__ = ["JOIN_WINDOW", "Followed", "TailConsumer"]

POLL_S = 0.5
"""How long the tail thread waits for its first assignment, or for room to hand a batch on;
it only bounds how fast a stopped tail notices."""
WAIT_S = 0.02
"""The tail thread's blocking wait for the next records. It returns at the first one (not
a poll interval on any path); it bounds how long a new tail waits for the thread to add its
partition to the assignment (done between two waits)."""
IN_FLIGHT = 4
"""Batches handed to the loop and not yet dispatched; the thread waits beyond (back-pressure)."""
JOIN_WINDOW = 1000
"""A new tail starts at its first subscriber's position if that is at most this far behind."""


class Followed(Protocol):
    """A followed partition, as the consumer sees it (on the loop)."""

    @property
    def live(self) -> bool:
        """Its position is set and its partition assigned: it takes batches."""
        ...

    def dispatch(self, batch: list[Any]) -> None:
        """Records read from its partition, in offset order."""
        ...

    def reached(self, offset: int) -> None:
        """The consumer reached the partition's end at ``offset`` (its last stable offset):
        every committed record below it was in the batches dispatched before."""
        ...

    def failed(self, exc: BaseException) -> None:
        """Its partition (or the whole consumer) failed."""
        ...


class TailConsumer:
    """The process's one tailing consumer and its thread (see the module doc).

    Args:
        settings: the log's settings (topic, reader config).
        loop: the event loop its batches and failures go to.
        on_failed: told (on the loop) when the consumer failed for good, before its
            tails are.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        loop: asyncio.AbstractEventLoop,
        *,
        on_failed: Callable[[TailConsumer], None],
    ) -> None:
        self.topic = settings.sessions_topic
        self.loop = loop
        self.tails: dict[int, Followed] = {}
        self.idle_polls = 0  # blocking waits that ended with nothing (counter, for tests)
        # partition -> the offset its last end-of-partition event came at: every record
        # before it was read (transaction markers included, which are never handed out)
        self.ends: dict[int, int] = {}
        self._on_failed = on_failed
        self.consumer: Any = Consumer(settings.reader_config(tail=True))
        self._assigned: set[int] = set()  # (the thread's)
        self._ops: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], concurrent.futures.Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._stop = threading.Event()
        self._in_flight = threading.Semaphore(IN_FLIGHT)
        self._thread = threading.Thread(target=self._run, name="harness-kafka-fanout", daemon=True)
        self._thread.start()

    # -- calls on the consumer (run by the thread) ------------------------------------------------

    async def op(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the reader's thread, after every op asked for before it."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self._stop.is_set():
            raise LogUnavailable("the shared tail stopped")
        self._ops.put((fn, args, future))
        return await asyncio.wrap_future(future)

    def op_nowait(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` on the reader's thread, in order; nobody waits for it."""
        self._ops.put((fn, args, concurrent.futures.Future()))

    def start_offset(self, partition: int, hint: int) -> tuple[int, int]:
        """Where a new tail of ``partition`` starts (``hint`` if close to the end, else the
        end), and the end (last stable offset) now."""
        tp = TopicPartition(self.topic, partition)
        low, end = _watermarks(self.consumer, tp, READ_TIMEOUT_S)
        return (hint if low <= hint <= end and end - hint <= JOIN_WINDOW else end), end

    def assign(self, partition: int, start: int) -> None:
        self.consumer.incremental_assign([TopicPartition(self.topic, partition, start)])
        self._assigned.add(partition)

    def unassign(self, partition: int) -> None:
        if partition in self._assigned:
            self._assigned.discard(partition)
            self.consumer.incremental_unassign([TopicPartition(self.topic, partition)])

    def _serve_ops(self, wait: float) -> None:
        """Run the ops asked for; with nothing assigned, wait up to ``wait`` for the first."""
        while not self._stop.is_set():
            try:
                fn, args, future = self._ops.get(timeout=wait) if wait > 0 else self._ops.get_nowait()
            except queue.Empty:
                return
            wait = 0
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - the caller's to handle
                    future.set_exception(exc)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        topic = self.topic
        try:
            while not self._stop.is_set():
                self._serve_ops(0 if self._assigned else POLL_S)
                if not self._assigned:
                    continue
                batches: dict[int, list[Any]] = {}
                reached: dict[int, int] = {}
                messages = _next_messages(self.consumer, WAIT_S)
                if not messages:
                    self.idle_polls += 1
                for msg in messages:
                    error = msg.error()
                    if error is None:
                        batch = batches.get(msg.partition())
                        if batch is None:
                            batches[msg.partition()] = [msg]
                        else:
                            batch.append(msg)
                    elif error.code() == KafkaError._PARTITION_EOF:
                        self.ends[msg.partition()] = reached[msg.partition()] = msg.offset()
                    elif (
                        error.fatal() or not (error.retriable() or error.code() in _TRANSIENT)
                    ):
                        failure = LogUnavailable(f"tail of {topic}[{msg.partition()}] failed: {error.str()}")
                        if error.fatal() or msg.partition() is None or msg.partition() < 0:
                            raise failure
                        self._call(self._tail_failed, msg.partition(), failure)  # that partition only
                if batches or reached:
                    while not self._in_flight.acquire(timeout=POLL_S):
                        if self._stop.is_set():
                            return
                    self._call(self._dispatch, batches, reached)
        except BaseException as exc:  # noqa: BLE001 - reported to every subscriber
            self._call(self._failed, exc)
        finally:
            self._stop.set()
            while True:
                try:
                    _fn, _args, future = self._ops.get_nowait()
                except queue.Empty:
                    break
                if future.set_running_or_notify_cancel():
                    future.set_exception(LogUnavailable("the shared tail stopped"))
            with contextlib.suppress(Exception):
                self.consumer.close()

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stop.set()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- on the loop ------------------------------------------------------------------------

    def _dispatch(self, batches: dict[int, list[Any]], reached: dict[int, int]) -> None:
        self._in_flight.release()
        for partition, batch in batches.items():
            tail = self.tails.get(partition)
            if tail is not None and tail.live:  # else: fetched for a tail that closed since
                tail.dispatch(batch)
        # (librdkafka drops an end event of an earlier assignment as it drops its records)
        for partition, offset in reached.items():
            tail = self.tails.get(partition)
            if tail is not None and tail.live:
                tail.reached(offset)

    def _tail_failed(self, partition: int, exc: LogUnavailable) -> None:
        tail = self.tails.get(partition)
        if tail is not None:
            tail.failed(exc)

    def _failed(self, exc: BaseException) -> None:
        if isinstance(exc, LogUnavailable):
            error = exc
        else:
            error = LogUnavailable(f"the shared tail of {self.topic} failed: {exc}")
            error.__cause__ = exc
        self._on_failed(self)
        for tail in list(self.tails.values()):
            tail.failed(error)
