"""The idempotent, non-transactional producer of submitted inputs and dead letters."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException, Producer

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


class DeadLetters:
    """Copies poison records to ``<prefix>.dead-letter``, each once per process.

    Args:
        settings: where the dead-letter topic is.
        stats: counts the records sent (``dead_lettered``).
        producer: the log's input producer (made on first use).
    """

    def __init__(self, settings: KafkaSettings, stats: KafkaLogStats, producer: Callable[[], InputProducer]) -> None:
        self._topic = settings.dead_letter_topic
        self._stats = stats
        self._producer = producer
        self._lock = threading.Lock()
        self._sent: set[tuple[int, int]] = set()  # (partition, offset) sent or in flight

    def send(self, corrupt: CorruptRecord) -> None:
        """Copy one poison record (blocking; never raises: a failure is retried by a later read)."""
        where = (corrupt.partition or 0, corrupt.offset or 0)
        with self._lock:
            if where in self._sent:
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
