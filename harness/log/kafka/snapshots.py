"""Partition checkpoints in the compacted topic ``<prefix>.snapshots``.

A checkpoint of sessions partition p lives in snapshots partition p: a few CHUNK
records (keys ``checkpoint/<p>/<i>``: live sessions' records, ended sessions' ids)
followed by one HEADER record (key ``checkpoint/<p>``) naming the checkpoint id,
the position it covers, its chunk count and the offset of its first chunk.
Compaction keeps the latest record of every key, so the latest header and its
chunks survive. To read, take the last record of the partition: if it is a
header whose chunks are all there, that is the checkpoint; otherwise (a writer
died between chunks, or two wrote at once) scan the partition for the last
complete one.

A checkpoint holds only committed log records (as the codec encodes them), so any
checkpoint is true of the log whoever wrote it; an older one only means a longer
tail to read. Deleting the topic loses nothing but speed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from harness import ids
from harness.errors import LogUnavailable
from harness.log.base import Checkpoint
from harness.log.kafka.config import ADMIN_TIMEOUT_S, READ_TIMEOUT_S, KafkaSettings
from harness.log.kafka.reader import _next_messages, _watermarks
from harness.records import LogEntry

__all__ = ["SnapshotStore"]

CHUNK_BYTES = 512 * 1024
"""Largest chunk value: well under the broker's default message.max.bytes (1 MiB)."""
VERSION = 1


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

    def __init__(self, settings: KafkaSettings, codec: Any) -> None:
        self._settings = settings
        self._codec = codec
        self.topic = ids.snapshots_topic(settings.topic_prefix)
        self._producer: Any = None
        self._ready = False

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

    def _encode(self, checkpoint: Checkpoint) -> list[dict[str, Any]]:
        chunks: list[dict[str, Any]] = []
        current: dict[str, Any] = {"sessions": {}, "ended": []}
        size = 0
        for sid, entries in checkpoint.sessions.items():
            items: list[tuple[int, str]] = [
                (e.seq, base64.b64encode(_raw(e) or self._codec.encode(e.record)).decode("ascii"))
                for e in entries
            ]
            cost = sum(len(text) + 16 for _, text in items) + len(sid) + 8
            if size and size + cost > CHUNK_BYTES:
                chunks.append(current)
                current, size = {"sessions": {}, "ended": []}, 0
            current["sessions"][sid] = items
            size += cost
        for sid, first in checkpoint.ended.items():
            if size + len(sid) + 16 > CHUNK_BYTES:
                chunks.append(current)
                current, size = {"sessions": {}, "ended": []}, 0
            current["ended"].append([sid, first])
            size += len(sid) + 16
        chunks.append(current)
        return chunks

    def _write(self, partition: int, checkpoint: Checkpoint) -> None:
        self._ensure_topic()
        if self._producer is None:
            self._producer = Producer(self._settings.input_producer_config())
        cid = uuid.uuid4().hex
        offsets: list[int] = []
        errors: list[Any] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                offsets.append(msg.offset())

        chunks = self._encode(checkpoint)
        for i, chunk in enumerate(chunks):
            value = json.dumps({"v": VERSION, "id": cid, "i": i, **chunk}, separators=(",", ":"))
            self._producer.produce(
                self.topic, key=f"checkpoint/{partition}/{i}".encode(), value=value.encode(),
                partition=partition, on_delivery=delivered,
            )
        # The chunks must be in before the header that points at them.
        if self._producer.flush(READ_TIMEOUT_S) or errors:
            raise LogUnavailable(f"checkpoint chunks of partition {partition} not written: {errors[:1]}")
        header = {"v": VERSION, "id": cid, "covers": checkpoint.covers, "chunks": len(chunks), "first": min(offsets)}
        self._producer.produce(
            self.topic, key=f"checkpoint/{partition}".encode(),
            value=json.dumps(header, separators=(",", ":")).encode(), partition=partition, on_delivery=delivered,
        )
        if self._producer.flush(READ_TIMEOUT_S) or errors:
            raise LogUnavailable(f"checkpoint header of partition {partition} not written: {errors[:1]}")

    async def write(self, partition: int, checkpoint: Checkpoint) -> None:
        await asyncio.to_thread(self._write, partition, checkpoint)

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

    def _decode(self, partition: int, header: dict[str, Any], chunks: list[dict[str, Any]]) -> Checkpoint | None:
        mine = {c["i"]: c for c in chunks if c.get("id") == header["id"]}
        if sorted(mine) != list(range(header["chunks"])):
            return None
        sessions: dict[str, list[LogEntry]] = {}
        ended: dict[str, int] = {}
        for i in range(header["chunks"]):
            chunk = mine[i]
            for sid, items in chunk["sessions"].items():
                sessions[sid] = [LogEntry(seq, self._codec.decode(base64.b64decode(b))) for seq, b in items]
            ended.update((sid, int(first)) for sid, first in chunk["ended"])
        return Checkpoint(covers=int(header["covers"]), sessions=sessions, ended=ended)

    def _exists(self) -> bool:
        if self._ready:
            return True
        admin = AdminClient(self._settings.admin_config())
        metadata: Any = admin.list_topics(topic=self.topic, timeout=ADMIN_TIMEOUT_S)
        topic = metadata.topics.get(self.topic)
        return topic is not None and topic.error is None

    def _read(self, partition: int, create: bool = True) -> Checkpoint | None:
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
            header_key = f"checkpoint/{partition}".encode()
            last = self._messages(consumer, partition, high - 1, high)
            if last and last[-1].key() == header_key:
                header = json.loads(last[-1].value())
                if header.get("v") == VERSION and header["first"] >= low:
                    msgs = self._messages(consumer, partition, header["first"], high - 1)
                    found = self._decode(partition, header, [json.loads(m.value()) for m in msgs])
                    if found is not None:
                        return found
            # The slow path: the last complete checkpoint anywhere in the partition.
            msgs = self._messages(consumer, partition, low, high)
            chunks = [json.loads(m.value()) for m in msgs if m.key() != header_key]
            for m in reversed(msgs):
                if m.key() == header_key:
                    header = json.loads(m.value())
                    if header.get("v") == VERSION:
                        found = self._decode(partition, header, chunks)
                        if found is not None:
                            return found
            return None
        finally:
            consumer.close()

    async def read(self, partition: int, *, create: bool = True) -> Checkpoint | None:
        """The latest complete checkpoint of ``partition`` (None if there is none).

        ``create=False``: a reader that only looks does not create the topic.

        Raises:
            LogUnavailable: the broker did not answer (down, unreachable).
        """
        try:
            return await asyncio.to_thread(self._read, partition, create)
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
