"""Bounded read_committed reads of one partition, with a small pool of consumers.

A read never joins a consumer group: it ``assign()``s one partition at a start offset
and reads up to the partition's END, which for a read_committed consumer is the last
stable offset (LSO): records of transactions still open (other sessions' group commits
in flight) are not waited for, aborted ones are skipped by the client, and control
records (commit/abort markers) are never delivered. The end is known from
``get_watermark_offsets`` (the LSO under read_committed) and confirmed by the
``_PARTITION_EOF`` event, which librdkafka raises at the LSO even when the partition
holds only aborted records or markers; so a read terminates on an empty partition, on
one with only aborted data, and at the end of a live one.

Read-your-writes: Kafka writes the commit markers just after ``commit_transaction``
returns, so the LSO may lag a commit of this process by a moment. A read therefore
also waits to reach ``must_reach`` (the end of what this process has committed).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from harness.errors import CodecError, CorruptRecord, LogClosed, LogUnavailable
from harness.gcpause import collector_paused
from harness.log.base import LogEntry
from harness.log.kafka.checksum import crc_problem
from harness.log.kafka.config import READ_TIMEOUT_S, KafkaSettings
from harness.log.kafka.index import KeyObserver
from harness.records import AppRecord, entry_data, entry_type, record_data

__all__ = ["ConsumerPool", "LazyEntry", "ReadResult", "decode_message", "lazy_message", "read_range", "result_seq"]

ReadResult = LogEntry | CorruptRecord


def result_seq(item: ReadResult) -> int:
    """The position of a read's item, a readable record or not."""
    return item.seq if isinstance(item, LogEntry) else (item.seq or 0)
Decoder = Callable[[bytes], Any]

# Reported while a partition's leadership moves or a new topic is still being set up.
_TRANSIENT = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
    }
)

_BATCH = 1000
_POLL_S = 0.05


class ConsumerPool:
    """Idle read_committed consumers, reused across reads (creating one costs a connection)."""

    def __init__(self, settings: KafkaSettings, *, size: int = 4) -> None:
        self._settings = settings
        self._size = size
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._closed = False

    def take(self) -> Any:
        with self._lock:
            if self._closed:
                raise LogClosed("the Kafka session log is closed")
            if self._idle:
                return self._idle.pop()
        return Consumer(self._settings.reader_config())

    def give(self, consumer: Any) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._size:
                self._idle.append(consumer)
                return
        consumer.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for consumer in idle:
            consumer.close()


class LazyEntry:
    """A committed record whose body is decoded on first use (``record``).

    Its position, session and type are known without decoding (the key and the
    framing's schema), so a rebuild can classify a session by its few control
    records and never decode the rest of a session that has ended. It stands in
    for a :class:`LogEntry` wherever one is read.
    """

    __slots__ = ("_decode", "_fields", "_raw", "_record", "record_type", "seq", "session_id")

    def __init__(
        self,
        seq: int,
        session_id: str,
        record_type: str,
        raw: bytes,
        decode: Decoder,
        fields: Callable[[bytes], tuple[str, dict[str, Any]]] | None = None,
    ) -> None:
        self.seq = seq
        self.session_id = session_id
        self.record_type = record_type  # the log record's own type, from the framing
        self._raw = raw
        self._decode = decode
        self._fields = fields
        self._record: Any = None

    def fields(self) -> dict[str, Any]:
        """The record's plain fields, read without building it (JSON fields as text)."""
        if self._record is None and self._fields is not None:
            return self._fields(self._raw)[1]
        return record_data(self.record)

    @property
    def raw(self) -> bytes:
        return self._raw

    @property
    def record(self) -> Any:
        """The decoded record; ``CodecError`` if the body is malformed."""
        if self._record is None:
            record = self._decode(self._raw)
            if record.session_id != self.session_id:
                raise CodecError(
                    f"record at seq {self.seq}: its key names session {self.session_id!r} "
                    f"but the record belongs to {record.session_id!r}",
                    raw=self._raw,
                )
            self._record = record
        return self._record

    @property
    def type(self) -> str:
        """What a reader sees (an app record's own type: decodes an app record's body)."""
        if self.record_type == AppRecord.TYPE:
            return entry_type(self.record)
        return self.record_type

    @property
    def data(self) -> dict[str, Any]:
        return entry_data(self.record)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LogEntry, LazyEntry)):
            return self.seq == other.seq and self.record == other.record
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LazyEntry(seq={self.seq}, type={self.record_type!r}, session_id={self.session_id!r})"


def lazy_message(
    peek: Callable[[bytes], str],
    decode: Decoder,
    topic: str,
    partition: int,
    msg: Any,
    fields: Callable[[bytes], tuple[str, dict[str, Any]]] | None = None,
) -> Any:
    """Like :func:`decode_message`, but only the framing is checked now: a
    :class:`LazyEntry`, or a ``CorruptRecord`` for an unknown framing/schema/key."""
    offset: int = msg.offset()
    raw: bytes = msg.value() or b""
    key: bytes | None = msg.key()
    try:
        if key is None:
            raise CodecError("no key: a session record's key is its session id")
        bad_crc = crc_problem(msg.headers(), raw)
        if bad_crc is not None:
            raise CodecError(bad_crc)
        return LazyEntry(offset + 1, key.decode("utf-8"), peek(raw), raw, decode, fields)
    except Exception as exc:  # noqa: BLE001 - this one record is unreadable
        return CorruptRecord(
            f"record at {topic}[{partition}]@{offset} cannot be read: {type(exc).__name__}: {exc}",
            session_id=key.decode("utf-8", "replace") if key is not None else None,
            seq=offset + 1,
            raw=raw,
            topic=topic,
            partition=partition,
            offset=offset,
        )


def decode_message(decode: Decoder, topic: str, partition: int, msg: Any) -> ReadResult:
    """A consumed message as a :class:`LogEntry` (seq = offset + 1), or why it is unreadable."""
    offset: int = msg.offset()
    raw: bytes = msg.value() or b""
    key: bytes | None = msg.key()
    session_id = key.decode("utf-8", "replace") if key is not None else None
    try:
        problem = crc_problem(msg.headers(), raw)
        if problem is not None:
            raise CodecError(problem)
        record = decode(raw)
        if session_id is not None and record.session_id != session_id:
            problem = f"its key names session {session_id!r} but the record belongs to {record.session_id!r}"
    except Exception as exc:  # noqa: BLE001 - any decoder failure makes this one record unreadable
        problem = f"{type(exc).__name__}: {exc}"
    if problem is None:
        return LogEntry(offset + 1, record)
    return CorruptRecord(
        f"record at {topic}[{partition}]@{offset} cannot be read: {problem}",
        session_id=session_id,
        seq=offset + 1,
        raw=raw,
        topic=topic,
        partition=partition,
        offset=offset,
    )


def read_range(
    pool: ConsumerPool,
    decode: Decoder,
    *,
    topic: str,
    partition: int,
    start: int,
    end: int | None = None,
    must_reach: int = 0,
    key: bytes | None = None,
    limit: int | None = None,
    timeout: float = READ_TIMEOUT_S,
    peek: Callable[[bytes], str] | None = None,
    fields: Callable[[bytes], tuple[str, dict[str, Any]]] | None = None,
    observe: KeyObserver | None = None,
) -> list[ReadResult]:
    """Committed records of one partition with ``start <= offset < stop`` (blocking).

    With ``peek`` (the codec's ``peek_type``) records come back as :class:`LazyEntry`.
    With ``observe``, the first offset of every key read (wanted or not) and the offset
    the read covered up to are noted in it (a :class:`~harness.log.kafka.index.PartitionIndex`
    learns from them).

    ``stop`` is the partition's current end (LSO), at least ``must_reach``, at most
    ``end``. Only messages with ``key`` (when given) are decoded and returned.

    Raises:
        LogUnavailable: the broker did not let the read reach ``stop`` in ``timeout``.
    """
    tp = TopicPartition(topic, partition)
    consumer = pool.take()
    try:
        low, lso = _watermarks(consumer, tp, timeout)
        stop = max(lso, must_reach)
        if end is not None:
            stop = min(stop, end)
        start = max(start, low)  # records before ``low`` were deleted by retention
        if start >= stop:
            if observe is not None:
                observe.stop = max(observe.stop, start)
            return []
        consumer.assign([TopicPartition(topic, partition, start)])
        try:
            with collector_paused():
                return _consume(
                    consumer, decode, topic, partition, stop, key, limit, timeout, peek, fields, observe
                )
        finally:
            consumer.unassign()
    except KafkaException as exc:
        raise _unavailable(exc, topic, partition, timeout) from exc
    finally:
        pool.give(consumer)


def partition_end(pool: ConsumerPool, *, topic: str, partition: int, timeout: float = READ_TIMEOUT_S) -> int:
    """The partition's end now (its last stable offset: every committed record is below
    it), asked of the broker (blocking)."""
    consumer = pool.take()
    try:
        return _watermarks(consumer, TopicPartition(topic, partition), timeout)[1]
    except KafkaException as exc:
        raise _unavailable(exc, topic, partition, timeout) from exc
    finally:
        pool.give(consumer)


def _unavailable(exc: KafkaException, topic: str, partition: int, timeout: float) -> LogUnavailable:
    error = exc.args[0]
    if error.retriable() or error.code() in _TRANSIENT:  # retried until the deadline
        # (``Unknown partition`` too: a client that never reached a broker knows no partition)
        return LogUnavailable(
            f"read of {topic}[{partition}] got no answer from the Kafka cluster within {timeout:g} s "
            f"({error.str()})"
        )
    return LogUnavailable(f"read of {topic}[{partition}] failed: {error.str()}")


def _watermarks(consumer: Any, tp: TopicPartition, timeout: float) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                tp, timeout=max(0.1, deadline - time.monotonic()), cached=False
            )
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0]
            if not (error.retriable() or error.code() in _TRANSIENT) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _next_messages(consumer: Any, wait: float) -> list[Any]:
    """What the consumer holds now, else the first message or event within ``wait``.

    ``consume(n, timeout)`` waits the whole timeout unless ``n`` messages arrive, which
    would add ``timeout`` to every read; ``poll`` returns at the first one.
    """
    messages: list[Any] = consumer.consume(_BATCH, 0)
    if messages:
        return messages
    first = consumer.poll(wait)
    return [] if first is None else [first, *consumer.consume(_BATCH, 0)]


def _consume(
    consumer: Any,
    decode: Decoder,
    topic: str,
    partition: int,
    stop: int,
    key: bytes | None,
    limit: int | None,
    timeout: float,
    peek: Callable[[bytes], str] | None = None,
    fields: Callable[[bytes], tuple[str, dict[str, Any]]] | None = None,
    observe: KeyObserver | None = None,
) -> list[ReadResult]:
    out: list[ReadResult] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for msg in _next_messages(consumer, _POLL_S):
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if msg.offset() >= stop:
                        if observe is not None:
                            observe.stop = stop
                        return out
                    continue  # the LSO has not reached our own commit yet: keep going
                if error.fatal() or not (error.retriable() or error.code() in _TRANSIENT):
                    raise KafkaException(error)
                continue  # the consumer retries by itself
            offset = msg.offset()
            if offset >= stop:
                if observe is not None:
                    observe.stop = stop
                return out
            msg_key = msg.key()
            if observe is not None:
                observe.saw(msg_key, offset)
            if key is None or msg_key == key:
                if peek is None:
                    out.append(decode_message(decode, topic, partition, msg))
                else:
                    out.append(lazy_message(peek, decode, topic, partition, msg, fields))
                if limit is not None and len(out) >= limit:
                    if observe is not None:
                        observe.stop = offset + 1
                    return out
            if offset + 1 >= stop:
                if observe is not None:
                    observe.stop = stop
                return out
    raise LogUnavailable(f"read of {topic}[{partition}] did not reach offset {stop} within {timeout}s")
