"""The idempotent, non-transactional producer of submitted inputs and dead letters."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

from confluent_kafka import KafkaException, Producer

from harness.errors import LogUnavailable
from harness.log.kafka.config import KafkaSettings

__all__ = [
    "DLQ_ERROR_HEADER",
    "DLQ_OFFSET_HEADER",
    "DLQ_PARTITION_HEADER",
    "DLQ_TOPIC_HEADER",
    "InputProducer",
]

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
