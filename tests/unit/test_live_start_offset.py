"""Where a live-topic reader starts (``harness.live.kafka._tail_start_offset``, used by a
client's ``events(live=True)`` and the gateway's shared tails): the first message at or
after the reader's time, with no gap when a message is published while it looks."""

from __future__ import annotations

from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException

from harness.live.kafka import _tail_start_offset


class Partition:
    """One partition of the live topic: message timestamps, in offset order."""

    def __init__(self, stamps: list[int]) -> None:
        self.stamps = stamps


class FakeConsumer:
    """The two broker lookups the start needs; ``publish_between`` lands one message (stamped
    ``at``) right after the first lookup, as a worker's delta can."""

    def __init__(self, part: Partition, publish_between: int | None = None, missing: bool = False) -> None:
        self.part = part
        self.publish_between = publish_between
        self.missing = missing
        self.calls: list[str] = []

    def _after_lookup(self) -> None:
        if self.publish_between is not None and len(self.calls) == 1:
            self.part.stamps.append(self.publish_between)

    def offsets_for_times(self, partitions: list[Any], timeout: float) -> list[Any]:
        self.calls.append("times")
        if self.missing:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        [tp] = partitions
        found = next((i for i, ts in enumerate(self.part.stamps) if ts >= tp.offset), -1)
        self._after_lookup()
        return [type("TP", (), {"error": None, "offset": found})()]

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        self.calls.append("watermarks")
        if self.missing:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        high = len(self.part.stamps)
        self._after_lookup()
        return 0, high


def test_a_message_published_while_the_reader_looks_is_read() -> None:
    # Older deltas (before the reader's time) in the partition; the answer's first delta
    # (stamped after it) lands between the start's two lookups: it must be read.
    part = Partition([10, 20, 30])
    consumer = FakeConsumer(part, publish_between=1_000)
    offset = _tail_start_offset(consumer, "p.live", 0, since_ms=500)
    assert offset == 3, (consumer.calls, offset)  # offset 3 is the new delta: not skipped, nothing older read


def test_start_at_the_first_message_of_the_reader_time_or_the_end() -> None:
    assert _tail_start_offset(FakeConsumer(Partition([10, 20, 600, 700])), "p.live", 0, since_ms=500) == 2
    assert _tail_start_offset(FakeConsumer(Partition([10, 20])), "p.live", 0, since_ms=500) == 2
    assert _tail_start_offset(FakeConsumer(Partition([])), "p.live", 0, since_ms=500) == 0


def test_no_topic_yet_reads_from_its_beginning() -> None:
    assert _tail_start_offset(FakeConsumer(Partition([]), missing=True), "p.live", 0, since_ms=500) == OFFSET_BEGINNING
