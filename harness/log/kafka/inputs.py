"""The idempotent, non-transactional producer of submitted inputs and dead letters."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from harness.errors import CorruptRecord, LogUnavailable
from harness.log.kafka.config import SUBMIT_TIMEOUT_S, KafkaSettings
from harness.log.kafka.stats import KafkaLogStats

__all__ = [
    "DLQ_ERROR_HEADER",
    "DLQ_OFFSET_HEADER",
    "DLQ_PARTITION_HEADER",
    "DLQ_TOPIC_HEADER",
    "DeadLetters",
    "InputProducer",
]

log = logging.getLogger("harness.log.kafka")

# Headers of a dead letter: where the poison record was and why it could not be read.
# Part of the dead-letter topic's contract for other tools: never rename one.
DLQ_TOPIC_HEADER = "harness.dlq.topic"
DLQ_PARTITION_HEADER = "harness.dlq.partition"
DLQ_OFFSET_HEADER = "harness.dlq.offset"
DLQ_ERROR_HEADER = "harness.dlq.error"


class InputProducer:
    """The idempotent, non-transactional producer of ``submit`` and dead letters.

    A small thread serves its delivery reports, so callers just wait on a future.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self._producer = Producer(settings.input_producer_config())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="harness-kafka-inputs", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.1)

    def produce(
        self,
        topic: str,
        *,
        value: bytes,
        key: bytes | None,
        headers: list[tuple[str, bytes]],
        partition: int | None = None,
    ) -> concurrent.futures.Future[int]:
        """Produce one message; the future holds its offset (or the ``KafkaException``)."""
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        # Running from the start, so it cannot be cancelled: a caller that stops waiting
        # (Ctrl-C, a timeout: asyncio.wrap_future cancels what it wraps) would otherwise make
        # the delivery report's set_result raise InvalidStateError, out of poll() (killing
        # the thread that serves every later report) or out of close()'s flush.
        future.set_running_or_notify_cancel()

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                future.set_exception(KafkaException(err))
            else:
                future.set_result(msg.offset())

        kwargs: dict[str, Any] = {"value": value, "key": key, "headers": headers, "on_delivery": on_delivery}
        if partition is not None:
            kwargs["partition"] = partition
        for _ in range(200):  # ~10 s: the queue drains as the broker acknowledges
            try:
                self._producer.produce(topic, **kwargs)
                return future
            except BufferError:
                self._stop.wait(0.05)
        raise LogUnavailable("the input producer's queue stays full: is the cluster reachable?")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.flush(5.0)
        self._producer.close()


DLQ_READ_TIMEOUT_S = 10.0
"""How long a look at the dead-letter topic may take before a record is sent anyway."""


class DeadLetters:
    """Copies poison records to ``<prefix>.dead-letter``, each once.

    Once per process by memory, and once across processes by the topic itself: before a
    record this process has not sent is sent, the dead-letter topic is read from where
    the last look ended up to its end, and a letter there for the same record (its
    ``harness.dlq.topic`` / ``.partition`` / ``.offset`` headers) means it is not sent
    again, nor counted. Without that every takeover of a partition re-read its parked
    sessions and dead-lettered their unreadable records again (a duplicate letter and
    ``HarnessDeadLetters`` firing again each time). Dead letters are rare, so the look
    costs little; if the topic cannot be read in time, the record is sent (a duplicate
    rather than a lost letter).

    Args:
        settings: where the dead-letter topic is.
        stats: counts the records sent (``dead_lettered``).
        producer: the log's input producer (made on first use).
    """

    def __init__(self, settings: KafkaSettings, stats: KafkaLogStats, producer: Callable[[], InputProducer]) -> None:
        self._settings = settings
        self._topic = settings.dead_letter_topic
        self._stats = stats
        self._producer = producer
        self._lock = threading.Lock()
        self._sent: set[tuple[int, int]] = set()  # (partition, offset) sent, in flight, or in the topic
        self._look = threading.Lock()  # one look at the topic at a time
        self._looked_upto = 0  # the dead-letter topic's offset the next look starts at

    def send(self, corrupt: CorruptRecord) -> None:
        """Copy one poison record (blocking; never raises: a failure is retried by a later read)."""
        where = (corrupt.partition or 0, corrupt.offset or 0)
        with self._look:
            with self._lock:
                if where in self._sent:
                    return
            self._look_at_the_topic()
            with self._lock:
                if where in self._sent:
                    log.info("poison record %s[%s]@%s is in %s already (an earlier owner sent it): not sent again",
                             corrupt.topic, where[0], where[1], self._topic)
                    return
                self._sent.add(where)
        log.error("skipping poison record %s[%s]@%s: %s", corrupt.topic, where[0], where[1], corrupt)
        headers = [
            (DLQ_TOPIC_HEADER, (corrupt.topic or "").encode()),
            (DLQ_PARTITION_HEADER, str(where[0]).encode()),
            (DLQ_OFFSET_HEADER, str(where[1]).encode()),
            (DLQ_ERROR_HEADER, str(corrupt)[:4000].encode()),
        ]
        key = corrupt.session_id.encode() if corrupt.session_id is not None else None
        try:
            future = self._producer().produce(self._topic, value=corrupt.raw, key=key, headers=headers)
            future.result(timeout=SUBMIT_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a failed dead letter must not fail the read
            log.warning(
                "could not dead-letter %s[%s]@%s (will retry on a later read): %s", corrupt.topic, *where, exc
            )
            with self._lock:
                self._sent.discard(where)
            return
        self._stats.add(dead_lettered=1)

    def _look_at_the_topic(self) -> None:
        """Learn the letters of the dead-letter topic since the last look (of this log's
        sessions topic); on a failure, learn nothing (the record is sent)."""
        try:
            found, upto = read_dead_letters(
                self._settings, self._looked_upto, self._settings.sessions_topic, DLQ_READ_TIMEOUT_S
            )
        except Exception as exc:  # noqa: BLE001 - a look that fails sends the letter (never loses one)
            log.warning("could not read %s to see what is dead-lettered already (%s); sending anyway", self._topic, exc)
            return
        self._looked_upto = upto
        with self._lock:
            self._sent.update(found)


def read_dead_letters(
    settings: KafkaSettings, start: int, source_topic: str, timeout: float
) -> tuple[set[tuple[int, int]], int]:
    """Where the letters of ``<prefix>.dead-letter`` from offset ``start`` to its end came
    from (``(partition, offset)`` of ``source_topic``), and the offset the next read starts at.

    Raises:
        LogUnavailable: the topic could not be read to its end within ``timeout``.
    """
    topic = settings.dead_letter_topic
    consumer = Consumer(settings.reader_config())
    try:
        tp = TopicPartition(topic, 0)
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
        start = max(start, int(low))  # (older letters are past the topic's retention)
        found: set[tuple[int, int]] = set()
        if start >= high:
            return found, max(start, int(high))
        consumer.assign([TopicPartition(topic, 0, start)])
        deadline = time.monotonic() + timeout
        upto = start
        while upto < high:
            if time.monotonic() > deadline:
                raise LogUnavailable(f"{topic} was not read to its end within {timeout:g} s")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    break
                raise LogUnavailable(f"reading {topic} failed: {error.str()}")
            offset = msg.offset()
            upto = upto + 1 if offset is None else offset + 1
            headers: dict[str, Any] = dict(msg.headers() or ())
            try:
                if bytes(headers.get(DLQ_TOPIC_HEADER) or b"").decode() == source_topic:
                    found.add((int(headers[DLQ_PARTITION_HEADER]), int(headers[DLQ_OFFSET_HEADER])))
            except (KeyError, ValueError, TypeError, UnicodeDecodeError):
                continue  # a letter some other tool wrote: not ours to count
        return found, upto
    finally:
        consumer.close()
