"""Partition checkpoints in the compacted topic ``<prefix>.snapshots``.

A checkpoint of sessions partition p lives in snapshots partition p: new directory
parts of the ended sessions (written once, never again), a few chunks (live sessions'
records, the ended sessions in no part yet) and one header naming the checkpoint id,
the position it covers, its chunks and every directory part (the records:
``checkpoint_format``). Compaction keeps the latest record of every key, so the latest
header, its chunks and every part survive. To read, take the last record of the
partition: if it is a header whose chunks and parts are all there, that is the
checkpoint; otherwise (a writer died between records, or two wrote at once) scan the
partition for the last complete one.

A checkpoint holds only committed log records (as the codec encodes them) and first
positions, which never change, so any checkpoint is true of the log whoever wrote it;
an older one only means a longer tail to read. Deleting the topic loses nothing but
speed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Collection, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from harness import ids
from harness.errors import LogUnavailable
from harness.log.base import Checkpoint, CheckpointWritten
from harness.log.kafka import checkpoint_format as fmt
from harness.log.kafka.blocking import BlockingReads
from harness.log.kafka.config import ADMIN_TIMEOUT_S, READ_TIMEOUT_S, KafkaSettings
from harness.log.kafka.reader import _next_messages, _watermarks
from harness.records import LogEntry

__all__ = ["SnapshotStore"]

CHUNK_BYTES = fmt.CHUNK_BYTES


def _topic_config() -> dict[str, str]:
    return {
        "cleanup.policy": "compact",
        "segment.ms": "600000",  # roll segments so old checkpoints become cleanable
        "min.cleanable.dirty.ratio": "0.1",
        "max.message.bytes": str(2 * CHUNK_BYTES),
    }


def _raw(entry: Any) -> bytes | None:
    """The bytes a lazily read entry came with (no need to decode and encode again)."""
    raw = getattr(entry, "raw", None)
    return raw if isinstance(raw, bytes) else None


class SnapshotStore:
    """Writes and reads partition checkpoints (blocking calls run on threads)."""

    def __init__(self, settings: KafkaSettings, codec: Any, *, reads: BlockingReads | None = None) -> None:
        self._settings = settings
        self._codec = codec
        self._reads = reads or BlockingReads()
        self.topic = ids.snapshots_topic(settings.topic_prefix)
        self._producer: Any = None
        self._ready = False
        self._chunks: dict[int, int] = {}  # partition -> chunks of its checkpoint last read or written here

    # -- topic -----------------------------------------------------------------------------

    def ensure_topic(self) -> None:
        """Create ``<prefix>.snapshots`` if it is missing (blocking)."""
        self._ensure_topic()

    def _ensure_topic(self) -> None:
        if self._ready:
            return
        admin = AdminClient(self._settings.admin_config())
        metadata: Any = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
        if self.topic not in metadata.topics:
            new = NewTopic(
                self.topic,
                num_partitions=self._settings.partitions,
                replication_factor=self._settings.replication_factor,
                config=_topic_config(),
            )
            for future in admin.create_topics([new], operation_timeout=ADMIN_TIMEOUT_S).values():
                try:
                    future.result(ADMIN_TIMEOUT_S)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise LogUnavailable(f"cannot create {self.topic!r}: {exc.args[0].str()}") from exc
            deadline = time.monotonic() + ADMIN_TIMEOUT_S
            while True:
                topic = admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics.get(self.topic)
                if topic is not None and topic.error is None and all(p.leader >= 0 for p in topic.partitions.values()):
                    break
                if time.monotonic() > deadline:
                    raise LogUnavailable(f"{self.topic!r} has no leader")
                time.sleep(0.05)
        self._ready = True

    # -- write -----------------------------------------------------------------------------

    def _encode_entry(self, entry: LogEntry) -> bytes:
        return _raw(entry) or self._codec.encode(entry.record)

    def _write(self, partition: int, checkpoint: Checkpoint) -> CheckpointWritten:
        self._ensure_topic()
        if self._producer is None:
            self._producer = Producer(self._settings.input_producer_config())
        cid = uuid.uuid4().hex
        plan = fmt.plan(partition, checkpoint, cid, self._encode_entry, lambda: uuid.uuid4().hex[:12])
        offsets: dict[bytes, int] = {}
        errors: list[Any] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                offsets[msg.key()] = msg.offset()

        for _part_id, key, value in plan.parts:
            self._producer.produce(self.topic, key=key, value=value, partition=partition, on_delivery=delivered)
        for key, value in plan.chunks:
            self._producer.produce(self.topic, key=key, value=value, partition=partition, on_delivery=delivered)
        # The parts and chunks must be in before the header that points at them.
        if self._producer.flush(READ_TIMEOUT_S) or errors:
            raise LogUnavailable(f"checkpoint chunks of partition {partition} not written: {errors[:1]}")
        directory = (*checkpoint.directory, *((part_id, offsets[key]) for part_id, key, _ in plan.parts))
        first = offsets[plan.chunks[0][0]]
        header = fmt.header_value(cid, checkpoint.covers, len(plan.chunks), first, directory, checkpoint.reread)
        self._producer.produce(self.topic, key=fmt.header_key(partition), value=header, partition=partition,
                               on_delivery=delivered)
        if self._producer.flush(READ_TIMEOUT_S) or errors:
            raise LogUnavailable(f"checkpoint header of partition {partition} not written: {errors[:1]}")
        # Chunk keys the last checkpoint used and this one does not: tombstones, so that
        # compaction drops what they held (a version-1 checkpoint's ended map, a burst of
        # live sessions) instead of keeping it for ever under keys nobody writes again.
        for i in range(len(plan.chunks), self._chunks.get(partition, 0)):
            self._producer.produce(self.topic, key=fmt.chunk_key(partition, i), value=None, partition=partition)
        self._chunks[partition] = len(plan.chunks)
        self._producer.flush(READ_TIMEOUT_S)  # (best effort: a tombstone lost only keeps garbage)
        return CheckpointWritten(directory=directory, sealed=plan.sealed)

    async def write(self, partition: int, checkpoint: Checkpoint) -> CheckpointWritten:
        """Write ``checkpoint`` of ``partition``; what it sealed (the writer's next
        checkpoint names these parts and leaves the sealed entries out of ``unsealed``).

        The checkpoint's ``unsealed`` entries (or, without them, its whole ``ended``) are
        taken here, on the caller's loop, so the caller may go on changing its maps."""
        if checkpoint.unsealed is None:
            checkpoint = Checkpoint(checkpoint.covers, dict(checkpoint.sessions), ended={},
                                    directory=checkpoint.directory, unsealed=tuple(checkpoint.ended.items()),
                                    reread=tuple(checkpoint.reread))
        else:
            checkpoint = Checkpoint(checkpoint.covers, dict(checkpoint.sessions), ended={},
                                    directory=checkpoint.directory, unsealed=checkpoint.unsealed,
                                    reread=tuple(checkpoint.reread))
        return await asyncio.to_thread(self._write, partition, checkpoint)

    # -- read ------------------------------------------------------------------------------

    def _consumer(self) -> Any:
        config = dict(self._settings.reader_config())
        config["group.id"] = f"{self._settings.topic_prefix}.snapshot-readers"
        return Consumer(config)

    def _messages(self, consumer: Any, partition: int, start: int, stop: int) -> list[Any]:
        out: list[Any] = []
        consumer.assign([TopicPartition(self.topic, partition, start)])
        deadline = time.monotonic() + READ_TIMEOUT_S
        while time.monotonic() < deadline:
            for msg in _next_messages(consumer, 0.2):
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        return out
                    continue
                if msg.offset() >= stop:
                    return out
                out.append(msg)
                if msg.offset() + 1 >= stop:
                    return out
        raise LogUnavailable(f"read of {self.topic}[{partition}] timed out")

    def _exists(self) -> bool:
        if self._ready:
            return True
        admin = AdminClient(self._settings.admin_config())
        metadata: Any = admin.list_topics(topic=self.topic, timeout=ADMIN_TIMEOUT_S)
        topic = metadata.topics.get(self.topic)
        return topic is not None and topic.error is None

    def _values(self, consumer: Any, partition: int, start: int, stop: int) -> dict[tuple[bytes, int], bytes]:
        return {
            (m.key(), m.offset()): m.value()
            for m in self._messages(consumer, partition, start, stop)
            if m.key() is not None and m.value() is not None  # (a tombstone holds nothing)
        }

    def _decode(
        self, partition: int, header: Mapping[str, Any], values: Mapping[tuple[bytes, int], bytes],
        have: frozenset[str],
    ) -> Checkpoint | None:
        return fmt.decode(partition, header, values, self._codec.decode, have)

    def _read(self, partition: int, create: bool, have: frozenset[str]) -> Checkpoint | None:
        if create:
            self._ensure_topic()
        elif not self._exists():
            return None  # nobody wrote a checkpoint of this log yet
        consumer = self._consumer()
        try:
            # Retries the transient errors of a topic just created (no leader yet, ...).
            low, high = _watermarks(consumer, TopicPartition(self.topic, partition), READ_TIMEOUT_S)
            if high <= low:
                return None
            header_key = fmt.header_key(partition)
            last = self._messages(consumer, partition, high - 1, high)
            if last and last[-1].key() == header_key and last[-1].value() is not None:
                header = json.loads(last[-1].value())
                # Read from the first record it names that is not held already.
                named = [header.get("first", -1)] + [
                    int(offset) for part_id, offset in header.get("directory", ()) if part_id not in have
                ]
                if min(named) >= low:
                    values = self._values(consumer, partition, min(named), high - 1)
                    found = self._decode(partition, header, values, have)
                    if found is not None:
                        self._chunks[partition] = max(self._chunks.get(partition, 0), int(header["chunks"]))
                        return found
            # The slow path: the last complete checkpoint anywhere in the partition.
            values = self._values(consumer, partition, low, high)
            for (key, _offset), value in sorted(values.items(), key=lambda kv: -kv[0][1]):
                if key == header_key:
                    header = json.loads(value)
                    found = self._decode(partition, header, values, have)
                    if found is not None:
                        self._chunks[partition] = max(self._chunks.get(partition, 0), int(header["chunks"]))
                        return found
            return None
        finally:
            consumer.close()

    async def read(
        self, partition: int, *, create: bool = True, have: Collection[str] = ()
    ) -> Checkpoint | None:
        """The latest complete checkpoint of ``partition`` (None if there is none).

        ``create=False``: a reader that only looks does not create the topic.
        ``have``: ids of directory parts the caller took in from an earlier read: they
        are not read again, and their entries are not in the checkpoint's ``ended``.

        Raises:
            LogUnavailable: the broker did not answer (down, unreachable).
        """
        try:
            return await self._reads.run(self._read, partition, create, frozenset(have))
        except KafkaException as exc:
            raise LogUnavailable(
                f"reading the checkpoint of partition {partition} failed: {exc.args[0].str()} (is the broker up?)"
            ) from exc

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(READ_TIMEOUT_S)
            self._producer = None

    @staticmethod
    def describe(checkpoint: Checkpoint) -> Mapping[str, int]:
        return {
            "covers": checkpoint.covers,
            "live": len(checkpoint.sessions),
            "records": sum(len(entries) for entries in checkpoint.sessions.values()),
            "ended": len(checkpoint.ended),
        }
