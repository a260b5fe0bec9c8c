"""The live topic on Kafka: ``<prefix>.live``, text deltas for other processes.

Workers publish each :class:`~harness.live.LiveEvent` of the sessions they drive with a
plain producer (not transactional, not idempotent, ``acks=1``: a lost delta costs
nothing, the committed response holds the whole text), keyed by session id, to the
same partition number the session has in ``<prefix>.sessions`` (the live topic is
created with the same partition count). Readers assign that one partition from its
end at the moment they subscribe and keep the events of their session:
:func:`kafka_live_events` with a consumer of its own (a client's one stream), or
:class:`KafkaLiveTails`, one consumer per partition per process shared by every
subscriber (the gateway's SSE streams).

The topic is short-lived: ``retention.ms`` one hour, segments of ten minutes. It is
not part of the published record contract (values are compact JSON, see
``LiveEvent.encode``); never rely on it for anything but showing progress.

Needs the ``[kafka]`` extra (confluent-kafka), like the Kafka log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from harness.ids import live_topic, message_key
from harness.live.events import LiveEvent
from harness.live.hub import LiveRouter, LiveSubscription
from harness.log.kafka.client_log import ClientLog

__all__ = ["LIVE_RETENTION_MS", "LIVE_SEGMENT_MS", "KafkaLivePublisher", "KafkaLiveTails", "kafka_live_events"]

log = logging.getLogger("harness.live")

LIVE_RETENTION_MS = 3_600_000
"""``retention.ms`` of the live topic: deltas matter for seconds; an hour bounds the disk."""
LIVE_SEGMENT_MS = 600_000
"""``segment.ms``: retention deletes whole segments, so they must roll often."""
ADMIN_TIMEOUT_S = 30.0
POLL_S = 0.1
"""How long one consumer poll blocks (in the reader's own thread)."""
TAIL_LINGER_S = 30.0
"""A shared live tail without subscribers stays open this long (a reconnecting stream reuses it)."""
TAIL_BATCH = 500
"""Messages a shared live tail takes per poll."""
READ_BACK_S = 30.0
"""How far back a stream that came half-way through an answer reads its start (as
``harness.live.sofar.KEEP_S``: an answer quiet longer than that is over)."""
READ_BACK_MAX_S = 5.0
"""A read back gives up after this long (a busy partition: the stream shows the gap)."""


live_client_log = ClientLog(logging.getLogger("harness.live.client"))
"""librdkafka's lines of the live clients, each kind at most once a minute: the live
producer is polled only when it publishes, so a broker outage came out at the next
publish (or at shutdown) as one line per failed connect, all stamped with that moment."""


def _base_config(bootstrap: str, client_config: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "logger": live_client_log, **(client_config or {})}


def ensure_live_topic(
    bootstrap: str,
    topic_prefix: str,
    partitions: int,
    *,
    replication_factor: int = 1,
    client_config: Mapping[str, Any] | None = None,
) -> int:
    """Create ``<prefix>.live`` if missing; returns its partition count. Blocking."""
    admin = AdminClient(_base_config(bootstrap, client_config))
    topic = live_topic(topic_prefix)
    metadata = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    existing = metadata.topics.get(topic)
    if existing is not None and existing.error is None:
        return len(existing.partitions)
    config = {"cleanup.policy": "delete", "retention.ms": str(LIVE_RETENTION_MS), "segment.ms": str(LIVE_SEGMENT_MS)}
    new = NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor, config=config)
    future = admin.create_topics([new], operation_timeout=ADMIN_TIMEOUT_S, request_timeout=ADMIN_TIMEOUT_S)[topic]
    try:
        future.result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    return partitions


class KafkaLivePublisher:
    """Publishes live events of the sessions this process drives (never blocks a caller).

    Args:
        bootstrap, topic_prefix, client_config: as the session log's.
        partitions: of the sessions topic; the live topic gets as many.
        partition_for: session id -> its partition in the sessions topic.
    """

    def __init__(
        self,
        *,
        bootstrap: str,
        topic_prefix: str,
        partitions: int,
        partition_for: Callable[[str], int],
        replication_factor: int = 1,
        client_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.topic = live_topic(topic_prefix)
        self._bootstrap = bootstrap
        self._prefix = topic_prefix
        self._partitions = partitions
        self._partition_for = partition_for
        self._replication_factor = replication_factor
        self._client_config = dict(client_config or {})
        self._producer: Producer | None = None
        self.published = 0
        self.dropped = 0

    @classmethod
    def for_log(cls, kafka_log: Any) -> KafkaLivePublisher:
        """The publisher next to a Kafka session log (same cluster, prefix, partitions)."""
        settings = kafka_log.settings
        return cls(
            bootstrap=settings.bootstrap,
            topic_prefix=settings.topic_prefix,
            partitions=settings.partitions,
            partition_for=kafka_log.partition_for,
            replication_factor=settings.replication_factor,
            client_config=settings.client_config,
        )

    def start(self) -> None:
        """Create the topic if missing and the producer. Blocking: call it from a thread.

        A live topic of another partition count than the sessions topic is not used
        (readers would look in the wrong partition): the publisher stays off, and says so.
        """
        count = ensure_live_topic(
            self._bootstrap, self._prefix, self._partitions,
            replication_factor=self._replication_factor, client_config=self._client_config,
        )
        if count != self._partitions:
            log.error(
                "%s has %d partitions, not %d like the sessions topic: live events are off "
                "(delete the topic; workers make it again)", self.topic, count, self._partitions,
            )
            return
        self._producer = Producer(
            {
                **_base_config(self._bootstrap, self._client_config),
                "acks": 1,
                "enable.idempotence": False,
                "linger.ms": 5,
                "message.timeout.ms": 10_000,
                "queue.buffering.max.messages": 100_000,
            }
        )

    def publish(self, event: LiveEvent) -> None:
        producer = self._producer
        if producer is None:
            return
        try:
            producer.produce(
                self.topic, value=event.encode(), key=message_key(event.session_id),
                partition=self._partition_for(event.session_id),
            )
            self.published += 1
        except (BufferError, KafkaException):
            self.dropped += 1  # best effort: the committed response holds the whole text
        producer.poll(0)  # serve delivery callbacks without waiting

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (bounded), then drop the producer. Blocking."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(timeout)


async def kafka_live_events(
    *,
    bootstrap: str,
    topic_prefix: str,
    partition: int,
    session_id: str,
    since_ms: int,
    client_config: Mapping[str, Any] | None = None,
) -> AsyncIterator[LiveEvent]:
    """The live events of one session published at or after ``since_ms`` (ms since the epoch).

    Anchored to a time, not to the moment the consumer is ready, so a caller that takes
    ``since_ms`` before it sends a message misses none of its answer's deltas. If the
    topic does not exist yet (no worker ever published), reading starts at its
    beginning once it appears. Runs one consumer in a thread of its own; closing the
    iterator stops it.
    """
    topic = live_topic(topic_prefix)
    key = message_key(session_id)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[LiveEvent | BaseException] = asyncio.Queue(1024)
    stop = threading.Event()
    consumer = Consumer(
        {
            **_base_config(bootstrap, client_config),
            "group.id": f"{topic_prefix}.live-readers",  # assign() only: never joined or committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "latest",
        }
    )

    def put(item: LiveEvent | BaseException) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(item)  # a reader far behind misses deltas

    def run() -> None:
        try:
            while not stop.is_set():
                message = consumer.poll(POLL_S)
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART):
                        continue
                    if error.fatal():
                        loop.call_soon_threadsafe(put, KafkaException(error))
                        return
                    continue
                if message.key() != key:
                    continue
                try:
                    event = LiveEvent.decode(message.value() or b"")
                except ValueError:
                    continue  # not ours to judge: skip it
                loop.call_soon_threadsafe(put, event)
        finally:
            consumer.close()

    offset = await asyncio.to_thread(_tail_start_offset, consumer, topic, partition, since_ms)
    consumer.assign([TopicPartition(topic, partition, offset)])
    thread = threading.Thread(target=run, name=f"live:{session_id}", daemon=True)
    thread.start()
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 5.0)


# --- one consumer per partition, shared by every subscriber of the process ----------------------


def _tail_start_offset(consumer: Any, topic: str, partition: int, since_ms: int) -> int:
    """The first offset with a timestamp >= ``since_ms`` (the end if none). Blocking.

    The end is read *before* the time lookup: read after it, a message published between
    the two (the first delta of an answer to a message sent just after the call) was
    counted in the end and never read, though its timestamp is >= ``since_ms``. Read
    before, a message published between the two is read whatever its timestamp.
    """
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=ADMIN_TIMEOUT_S)
        [found] = consumer.offsets_for_times([TopicPartition(topic, partition, since_ms)], timeout=ADMIN_TIMEOUT_S)
        if found.error is None and found.offset >= 0:
            return int(found.offset)
        return int(high)  # nothing that recent yet: from the end as it was before the lookup
    except KafkaException:
        return OFFSET_BEGINNING  # no topic yet: everything it will hold is new


def _next_messages(consumer: Any) -> list[Any]:
    """What the consumer holds now, else the first message within ``POLL_S`` and what came
    with it (``consume(n, timeout)`` would wait the whole timeout for ``n`` messages)."""
    messages: list[Any] = consumer.consume(TAIL_BATCH, 0)
    if messages:
        return messages
    first = consumer.poll(POLL_S)
    return [] if first is None else [first, *consumer.consume(TAIL_BATCH, 0)]


class _LiveTail:
    """One consumer of one partition of the live topic, on a thread of its own."""

    def __init__(self, owner: KafkaLiveTails, partition: int, loop: asyncio.AbstractEventLoop) -> None:
        self.owner = owner
        self.partition = partition
        self.loop = loop
        self.users = 0
        self.linger: asyncio.TimerHandle | None = None
        self.stop = threading.Event()
        self.since_ms = int(time.time() * 1000)
        self.thread = threading.Thread(target=self._run, name=f"harness-live-tail-{partition}", daemon=True)

    def _run(self) -> None:
        owner = self.owner
        consumer: Any = None
        try:
            consumer = Consumer(
                {
                    **_base_config(owner.bootstrap, owner.client_config),
                    "group.id": f"{owner.topic_prefix}.live-readers",  # assign() only: never joined or committed
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "auto.offset.reset": "latest",
                }
            )
            offset = _tail_start_offset(consumer, owner.topic, self.partition, self.since_ms)
            consumer.assign([TopicPartition(owner.topic, self.partition, offset)])
            wants = owner.router.wants
            while not self.stop.is_set():
                events = []
                for message in _next_messages(consumer):
                    error = message.error()
                    if error is not None:
                        if error.fatal():
                            raise KafkaException(error)
                        continue  # end of partition, no topic yet, transient: keep reading
                    try:
                        session_id = (message.key() or b"").decode("utf-8")
                    except UnicodeDecodeError:
                        continue
                    if not wants(session_id):
                        continue  # only the events somebody here follows are decoded
                    try:
                        events.append(LiveEvent.decode(message.value() or b""))
                    except ValueError:
                        continue  # not ours to judge: skip it
                if events:
                    try:
                        self.loop.call_soon_threadsafe(owner.router.publish_many, events)
                    except RuntimeError:  # the loop is closed: nobody listens any more
                        return
        except Exception as exc:  # noqa: BLE001 - live events are best effort: say so once, stop
            log.warning("reading %s[%d] stopped: %s", owner.topic, self.partition, exc)
        finally:
            if consumer is not None:
                consumer.close()


class KafkaLiveTails:
    """The live topic for every live subscriber of a process: one consumer per partition.

    ``subscribe(session_id)`` gives a :class:`~harness.live.LiveSubscription` of the
    session's events published from then on (best effort, like every live event):
    the partition's shared tail starts at the time its first subscriber came (by the
    messages' timestamps, so the time it takes to assign is no gap) and every later
    subscriber gets what the tail reads after it registered. A tail with no
    subscriber closes after ``TAIL_LINGER_S``. Used on one event loop.

    Args:
        bootstrap, topic_prefix, client_config: as the session log's.
        partition_for: session id -> its partition in the sessions topic.
    """

    def __init__(
        self,
        *,
        bootstrap: str,
        topic_prefix: str,
        partition_for: Callable[[str], int],
        client_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic_prefix = topic_prefix
        self.topic = live_topic(topic_prefix)
        self.client_config = dict(client_config or {})
        self._partition_for = partition_for
        self.router = LiveRouter()
        self._tails: dict[int, _LiveTail] = {}
        self._reading_back: set[asyncio.Task[None]] = set()
        self.tails_opened = 0  # consumers started (for tests: one per partition followed)
        self.read_backs = 0  # answers read back for a stream that came half-way through

    @classmethod
    def for_log(cls, kafka_log: Any) -> KafkaLiveTails:
        """The live tails next to a Kafka session log (same cluster, prefix and partitioning)."""
        settings = kafka_log.settings
        return cls(bootstrap=settings.bootstrap, topic_prefix=settings.topic_prefix,
                   partition_for=kafka_log.partition_for, client_config=settings.client_config)

    @property
    def consumers(self) -> int:
        """Consumers open now (one per partition somebody follows, or did within the linger)."""
        return len(self._tails)

    def subscribe(
        self, session_id: str, *, so_far: bool = False, after: int | None = None, running: bool = False
    ) -> LiveSubscription:
        """The session's live events from now on; ``so_far``: first the answer being
        streamed as far as this process read it (see ``LiveRouter.subscribe``). With
        ``running`` (the reader saw the session's turn running) and no answer of it here
        (this process was not following it), the answer's start is read back from the
        topic (``READ_BACK_S`` of it) and given as soon as it is read."""
        partition = self._partition_for(session_id)
        loop = asyncio.get_running_loop()
        tail = self._tails.get(partition)
        if tail is not None and tail.loop is not loop:  # moved to another event loop
            tail.stop.set()
            tail = None
        if tail is None:
            tail = self._tails[partition] = _LiveTail(self, partition, loop)
            tail.thread.start()
            self.tails_opened += 1
        if tail.linger is not None:
            tail.linger.cancel()
            tail.linger = None
        tail.users += 1
        the_tail = tail
        missing = so_far and running and self.router.so_far(session_id, after) is None
        sub = self.router.subscribe(session_id, on_close=lambda: self._release(the_tail), so_far=so_far, after=after)
        if missing:
            task = loop.create_task(self._read_back(sub, partition, after))
            self._reading_back.add(task)
            task.add_done_callback(self._reading_back.discard)
        return sub

    async def _read_back(self, sub: LiveSubscription, partition: int, after: int | None) -> None:
        """Read the session's deltas of the last ``READ_BACK_S`` back into the router and
        give the subscription its answer so far (with what the tail read meanwhile)."""
        try:
            events = await asyncio.to_thread(self._read_back_blocking, sub.session_id, partition)
        except Exception as exc:  # noqa: BLE001 - best effort: the stream goes on without its start
            log.warning("reading back %s[%d] failed: %s", self.topic, partition, exc)
            return
        self.router.remember(events)
        event = self.router.so_far(sub.session_id, after)
        if event is not None:
            sub.push(event)
        self.read_backs += 1

    def _read_back_blocking(self, session_id: str, partition: int) -> list[LiveEvent]:
        """The session's deltas on the live topic from ``READ_BACK_S`` ago to its end now."""
        key = message_key(session_id)
        consumer = Consumer(
            {
                **_base_config(self.bootstrap, self.client_config),
                "group.id": f"{self.topic_prefix}.live-readers",  # assign() only: never joined or committed
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "latest",
            }
        )
        events: list[LiveEvent] = []
        try:
            _, end = consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=ADMIN_TIMEOUT_S)
            start = _tail_start_offset(consumer, self.topic, partition, int((time.time() - READ_BACK_S) * 1000))
            if start < 0 or start >= end:
                return events
            consumer.assign([TopicPartition(self.topic, partition, start)])
            deadline = time.monotonic() + READ_BACK_MAX_S
            offset = start
            while offset < end - 1 and time.monotonic() < deadline:
                for message in _next_messages(consumer):
                    if message.error() is not None:
                        continue
                    offset = max(offset, message.offset())
                    if message.key() != key:
                        continue
                    with contextlib.suppress(ValueError):
                        events.append(LiveEvent.decode(message.value() or b""))
            return events
        finally:
            consumer.close()

    def _release(self, tail: _LiveTail) -> None:
        tail.users -= 1
        if tail.users <= 0 and self._tails.get(tail.partition) is tail:
            tail.linger = tail.loop.call_later(TAIL_LINGER_S, self._close_idle, tail)

    def _close_idle(self, tail: _LiveTail) -> None:
        tail.linger = None
        if tail.users <= 0 and self._tails.get(tail.partition) is tail:
            del self._tails[tail.partition]
            tail.stop.set()

    async def close(self) -> None:
        """Stop every tail and end every subscription."""
        for task in list(self._reading_back):
            task.cancel()
        tails, self._tails = list(self._tails.values()), {}
        for tail in tails:
            if tail.linger is not None:
                tail.linger.cancel()
            tail.stop.set()
        await self.router.close()
        for tail in tails:
            await asyncio.to_thread(tail.thread.join, 5.0)
