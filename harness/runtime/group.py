"""A worker's membership of the consumer group ``<prefix>.workers``, and what it does
with the partitions the group gives it.

The group consumer only decides ownership: it subscribes to ``<prefix>.sessions``
with cooperative-sticky assignment and keeps every assigned partition PAUSED, so it
never fetches. Its blocking ``poll`` runs on one private thread; rebalance callbacks
hand the work to the event loop and wait for it:

* assigned p: (1) ``own_partition(p)``: a new transactional producer whose
  ``init_transactions`` fences the previous owner and aborts its open transaction;
  (2) read p's committed records from the start to the end (after the fencing, so
  nothing of the zombie is pending); (3) rebuild the sessions and go live; (4) tail
  p from there and route each new record to its session.
* revoked p: drain p's sessions (nothing new starts; a running tool call goes on to
  its result, a model call to its logged answer, for at most the worker's
  ``drain_timeout``), then cancel the tail, stop p's sessions without writing anything
  more, close p's producer. The next owner continues at once. A worker told to stop
  (SIGTERM) drains every partition the same way before it leaves the group.
* lost p (this worker was silent past the session timeout: another member may own p
  already): no drain, stopped at once (its writes would be fenced anyway).

Timeouts: ``SESSION_TIMEOUT_MS`` bounds how long partitions of a SIGKILLed worker
wait before the group moves them; ``transaction.timeout.ms`` of the owner producer
(10 s, see kafka_config) never delays a takeover, because the new owner's
``init_transactions`` aborts the old owner's open transaction at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

from confluent_kafka import Consumer, KafkaError, TopicPartition

from harness import ids
from harness.errors import ConfigError, HarnessError, LogError, LogUnavailable
from harness.observability import metrics
from harness.runtime.broker_silence import BrokerSilence
from harness.runtime.observe import WorkerHealth
from harness.runtime.partition import (
    CHECKPOINT_EVERY_RECORDS,
    CHECKPOINT_EVERY_S,
    PartitionRuntime,
    drain_all,
)

if TYPE_CHECKING:
    from harness.log.kafka.log import KafkaLog

__all__ = ["GroupMember", "GroupWorker", "run_group_worker"]


class _Stats(Protocol):
    partitions: int
    sessions: int
    records_ingested: int
    rebuilds: int


class GroupWorker(Protocol):
    """What the group membership needs from the worker that runs it (``Worker``)."""

    @property
    def log(self) -> Any: ...  # a KafkaLog

    @property
    def runtimes(self) -> MutableMapping[int, PartitionRuntime]: ...

    @property
    def stats(self) -> _Stats: ...

    @property
    def ready(self) -> asyncio.Event: ...

    @property
    def instance_id(self) -> str | None: ...

    @property
    def health(self) -> WorkerHealth: ...

    @property
    def drain_timeout(self) -> float: ...

    @property
    def hurry(self) -> asyncio.Event: ...

    def runtime(self, partition: int) -> PartitionRuntime: ...

    def publish(
        self,
        owned: Iterable[int],
        *,
        uncovered_since: Mapping[int, float] | None = None,
        input_lag: Mapping[int, int] | None = None,
    ) -> None: ...

log = logging.getLogger("harness.worker")

SESSION_TIMEOUT_MS = 6000
"""How long the group waits for a silent member (SIGKILL, SIGSTOP) before moving its
partitions; the broker's group.min.session.timeout.ms (6 s by default) is the floor."""
HEARTBEAT_INTERVAL_MS = 1000
MAX_POLL_INTERVAL_MS = 300_000
"""The poll thread polls every POLL_S, so this only trips if the process hangs."""
POLL_S = 0.2
CALLBACK_TIMEOUT_S = 60.0
"""How long a rebalance callback waits for the loop to take up or drop partitions."""
SWEEP_EVERY_S = 1.0
RETAKE_GRACE_S = SESSION_TIMEOUT_MS / 1000
"""How long an owned partition whose producer stopped (another writer fenced it, or it
died after a failure) waits before this worker takes it up again, if the group still
gives it here. A worker that was frozen (SIGSTOP, a VM pause) and lost the partition
meanwhile hears so from the group within a heartbeat or two of waking up, long before
this: only a real owner takes a partition up again, never a zombie."""
PROBE_EVERY_S = 5.0
"""How often the owned partitions' log ends are asked for (input lag; the broker answers:
readiness)."""
PROBE_TIMEOUT_S = 5.0
DISOWN_TIMEOUT_S = 30.0
"""How long dropping a partition waits for its producer to close: a close that hangs
(librdkafka aborting a transaction the broker lost in a restart) must not freeze the
worker's sweep, and with it every partition of this worker."""


class GroupMember:
    """The group consumer on its own thread; calls back into the loop on rebalances."""

    def __init__(
        self,
        *,
        log_: KafkaLog,
        loop: asyncio.AbstractEventLoop,
        on_assigned: Callable[[list[int]], Any],
        on_revoked: Callable[[list[int]], Any],
        on_lost: Callable[[list[int]], Any],
        instance_id: str | None,
        callback_timeout: float = CALLBACK_TIMEOUT_S,
    ) -> None:
        settings = log_.settings
        config: dict[str, Any] = {
            **settings.admin_config(),
            "group.id": ids.workers_group(settings.topic_prefix),
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
            "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
        }
        if instance_id:
            config["group.instance.id"] = instance_id
        self._consumer = Consumer(config)
        # Log ends are asked by a consumer of their own: asking the group consumer while
        # its thread polls blocks until the query times out.
        self._probe = Consumer(settings.reader_config())
        self._probe_lock = threading.Lock()  # a probe in flight finishes before the close
        self._topic = settings.sessions_topic
        self._loop = loop
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._on_lost = on_lost
        self._callback_timeout = callback_timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="harness-group", daemon=True)
        self.error: BaseException | None = None
        self.joined = False  # a rebalance gave this member its first assignment (maybe empty)

    def start(self) -> None:
        self._consumer.subscribe([self._topic], on_assign=self._assign, on_revoke=self._revoke, on_lost=self._lost)
        self._thread.start()

    def _call(self, fn: Callable[[list[int]], Any], partitions: list[int]) -> None:
        future = asyncio.run_coroutine_threadsafe(fn(partitions), self._loop)
        try:
            future.result(self._callback_timeout)
        except Exception as exc:  # noqa: BLE001 - logged; the group goes on
            log.error("rebalance callback for partitions %s failed: %s", partitions, exc)

    def _assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        if partitions:
            consumer.pause(partitions)  # ownership only: data is read by each partition's tail
            self._call(self._on_assigned, sorted(tp.partition for tp in partitions))
        self.joined = True  # after the callback: what was given has been taken up (or is pending)

    def _revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        if partitions:
            self._call(self._on_revoked, sorted(tp.partition for tp in partitions))
        consumer.incremental_unassign(partitions)

    def _lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        log.warning("partitions %s were lost (this worker was silent too long)", [tp.partition for tp in partitions])
        if partitions:
            self._call(self._on_lost, sorted(tp.partition for tp in partitions))
        consumer.incremental_unassign(partitions)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                msg = self._consumer.poll(POLL_S)
                err = msg.error() if msg is not None else None
                if err is not None:
                    # (a fatal error polled comes as _FATAL, whose own fatal() is False)
                    if err.fatal() or err.code() == KafkaError._FATAL:
                        raise _fatal_error(err.str())
                    if err.code() != KafkaError._PARTITION_EOF:
                        log.warning("group consumer: %s", err.str())
        except BaseException as exc:  # noqa: BLE001 - reported to the worker
            self.error = exc
            log.error("group consumer stopped: %s", exc)
        finally:
            # Leaving the group revokes every partition (callbacks run here) and lets
            # the group move them at once instead of after the session timeout.
            with contextlib.suppress(Exception):
                self._consumer.close()
            with self._probe_lock, contextlib.suppress(Exception):
                self._probe.close()

    def log_ends(self, partitions: list[int], timeout: float) -> dict[int, int]:
        """Each partition's end as a read_committed reader sees it (blocking; any thread).

        With no partition, asks for the topic's metadata instead: either way a return
        means the broker answered. Raises ``KafkaException`` when it does not.
        """
        with self._probe_lock:
            if self._stop.is_set():
                raise LogError("the group member is stopping")
            if not partitions:
                self._probe.list_topics(self._topic, timeout=timeout)
                return {}
            ends: dict[int, int] = {}
            for p in partitions:
                _low, high = self._probe.get_watermark_offsets(
                    TopicPartition(self._topic, p), timeout=timeout, cached=False
                )
                ends[p] = int(high)
            return ends

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _fatal_error(error: str) -> HarnessError:
    """What a fatal error of the group consumer tells the operator (the worker exits on it)."""
    if "same group.instance.id" in error:  # FENCED_INSTANCE_ID: a second member took our static id
        return ConfigError("another worker joined the group with this worker's --instance-id (HARNESS_INSTANCE_ID): "
                           "give each worker its own (a StatefulSet's pod name); this one stops",
                           setting="--instance-id")
    return LogUnavailable(f"the worker's group consumer failed for good: {error}")


class _Owned:
    """One owned partition: its tail task."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.tail: asyncio.Task[None] | None = None


async def run_group_worker(worker: GroupWorker, stop: asyncio.Event) -> None:
    """Own the partitions the group gives ``worker`` until ``stop``; see the module doc."""
    klog: KafkaLog = worker.log
    await klog.start()
    loop = asyncio.get_running_loop()
    owned: dict[int, _Owned] = {}
    lock = asyncio.Lock()  # assignments and revocations one at a time

    async def tail(partition: int, start: int) -> None:
        rt = worker.runtime(partition)
        while True:
            try:
                async for entry in klog.tail_partition(partition, start, on_corrupt=rt.report_corrupt):
                    worker.stats.records_ingested += 1
                    await rt.ingest([entry])
                    start = entry.seq
            except LogError as exc:
                log.warning("tail of partition %s failed (%s); reopening", partition, exc)
                await asyncio.sleep(1.0)

    unowned: set[int] = set()  # assigned by the group, not yet taken up (retried by the sweep)

    async def take(p: int) -> None:
        """Steps 2-4 of the module doc for one fenced partition."""
        started = time.monotonic()
        rt = worker.runtime(p)
        checkpoint = None
        try:
            checkpoint = await klog.snapshots.read(p)
        except Exception as exc:  # noqa: BLE001 - an optimisation only: read it all instead
            log.warning("checkpoint of partition %s unreadable (%s); reading the whole partition", p, exc)
        if checkpoint is not None:
            rt.load_checkpoint(checkpoint)
        rt.on_corrupt = lambda corrupt: loop.run_in_executor(None, klog.dead_letter, corrupt)
        entries = await klog.read_partition(p, rt.position, lazy=True, on_corrupt=rt.report_corrupt)
        rt.rebuild(entries)
        await rt.go_live()
        if rt.records_since_checkpoint >= CHECKPOINT_EVERY_RECORDS:
            await write_checkpoint(p, rt)
        worker.stats.rebuilds += 1
        metrics.rebuild(time.monotonic() - started, len(entries))
        worker.health.broker_answered()
        own = owned[p] = _Owned(p)
        own.tail = asyncio.create_task(tail(p, max(rt.position, 0)), name=f"tail:{p}")
        since = f"after its checkpoint at offset {checkpoint.covers}" if checkpoint is not None else "from its start"
        log.info("owning partition %s: %d records read %s, %d live sessions", p, len(entries), since, len(rt.sessions))

    async def assigned(partitions: list[int]) -> None:
        async with lock:
            new = [p for p in partitions if p not in owned]
            unowned.update(new)
            # Fence every new partition first, then take them up side by side.
            fenced = await asyncio.gather(*(klog.own_partition(p) for p in new), return_exceptions=True)
            ready = [p for p, r in zip(new, fenced, strict=True) if not isinstance(r, BaseException)]
            for p, r in zip(new, fenced, strict=True):
                if isinstance(r, BaseException):
                    log.warning("cannot fence partition %s yet (%s); will retry", p, r)
            taken = await asyncio.gather(*(take(p) for p in ready), return_exceptions=True)
            for p, r in zip(ready, taken, strict=True):
                if isinstance(r, BaseException):
                    log.warning("cannot take up partition %s yet (%s); will retry", p, r)
                    rt = worker.runtimes.pop(p, None)
                    if rt is not None:
                        await rt.stop()
                else:
                    unowned.discard(p)
            worker.stats.partitions = len(owned)
            worker.ready.set()

    last_checkpoint: dict[int, float] = {}

    uncovered_since: dict[int, float] = {}  # partition -> wall time its first uncovered record was seen
    input_lag: dict[int, int] = {}

    async def write_checkpoint(p: int, rt: PartitionRuntime) -> None:
        try:
            rt.checkpoint_written(await klog.snapshots.write(p, rt.checkpoint()))
            rt.records_since_checkpoint = 0
            uncovered_since.pop(p, None)
        except Exception as exc:  # noqa: BLE001 - an optimisation only: try again later
            log.warning("checkpoint of partition %s not written: %s", p, exc)
        last_checkpoint[p] = loop.time()

    stopped_since: dict[int, float] = {}  # owned partition -> loop time its producer was seen stopped

    async def drop(p: int) -> None:
        """Stop partition ``p`` here without writing anything (called with ``lock`` held)."""
        own = owned.pop(p, None)
        if own is not None and own.tail is not None:
            own.tail.cancel()
            with contextlib.suppress(BaseException):
                await own.tail
        rt = worker.runtimes.pop(p, None)
        if rt is not None:
            await rt.stop()
        uncovered_since.pop(p, None)
        input_lag.pop(p, None)
        stopped_since.pop(p, None)
        try:
            await asyncio.wait_for(asyncio.shield(klog.disown_partition(p)), DISOWN_TIMEOUT_S)
        except TimeoutError:
            log.warning("partition %s: its producer did not close within %.0f s; going on without waiting "
                        "(a new producer of the partition fences it)", p, DISOWN_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - closing a producer that already failed: nothing to do
            pass

    async def drain(partitions: list[int], why: str) -> None:
        """Let the sessions of ``partitions`` reach their next boundary (module doc)."""
        runtimes = [rt for p in sorted(set(partitions)) if p in owned and (rt := worker.runtimes.get(p)) is not None]
        where = f"{why} (partitions {', '.join(map(str, partitions))})"
        await drain_all(runtimes, worker.drain_timeout, where, worker.hurry)

    async def revoked(partitions: list[int], *, lost: bool = False) -> None:
        async with lock:
            if not lost:
                await drain(partitions, "partitions revoked")
            for p in partitions:
                unowned.discard(p)
                await drop(p)
                log.info("gave up partition %s", p)
            worker.stats.partitions = len(owned)

    async def lost(partitions: list[int]) -> None:
        await revoked(partitions, lost=True)

    async def retake_stopped() -> None:
        """Take up again, from the log, each owned partition whose producer stopped
        ``RETAKE_GRACE_S`` ago while the group still gives it here (see that constant)."""
        now = loop.time()
        for p in sorted(owned):
            reason = klog.partition_stopped(p)
            if reason is None:
                stopped_since.pop(p, None)
                continue
            first = stopped_since.setdefault(p, now)
            if now - first < RETAKE_GRACE_S:
                continue
            async with lock:
                if p not in owned or klog.partition_stopped(p) is None:
                    continue  # revoked (or taken up) meanwhile
                log.warning(
                    "partition %s: its producer stopped (%s) and the group still gives it to this "
                    "worker; taking it up again from the log", p, reason,
                )
                await drop(p)
                unowned.add(p)  # taken up by the sweep below, unless revoked first
            worker.stats.partitions = len(owned)

    member = GroupMember(
        log_=klog, loop=loop, on_assigned=assigned, on_revoked=revoked, on_lost=lost,
        instance_id=worker.instance_id, callback_timeout=CALLBACK_TIMEOUT_S + max(worker.drain_timeout, 0.0),
    )
    silence = BrokerSilence(klog.settings.bootstrap)

    async def probe() -> None:
        """Ask for the owned partitions' ends: input lag, and proof the broker answers."""
        parts = sorted(owned)
        try:
            ends = await asyncio.to_thread(member.log_ends, parts, PROBE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - readiness reports it; the worker goes on
            line = silence.failed(exc)
            if line is not None:
                log.warning("%s", line)
            return
        worker.health.broker_answered()
        back = silence.answered()
        if back is not None:
            log.info("%s", back)
        for p, end in ends.items():
            rt = worker.runtimes.get(p)
            if rt is not None and p in owned:
                # The tail's position, when the runtime folded all it handed out: past the
                # last record's commit marker, so an idle partition's lag is 0, not 1.
                tail = klog.fanout.read_upto(p)
                position = rt.position
                if tail is not None and rt.position >= tail[0]:  # (all it handed out is folded)
                    position = max(position, tail[1])
                input_lag[p] = max(end - position, 0)

    dead_lettered = 0
    next_probe = 0.0
    member.start()
    try:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), SWEEP_EVERY_S)
            if member.error is not None:
                raise member.error
            await retake_stopped()
            if unowned:
                await assigned(sorted(unowned))
            if loop.time() >= next_probe:
                next_probe = loop.time() + PROBE_EVERY_S
                await probe()
            for p, rt in list(worker.runtimes.items()):
                if p not in owned or worker.runtimes.get(p) is not rt:
                    continue  # revoked (or being taken up) while this sweep ran
                if rt.records_since_checkpoint > 0:
                    uncovered_since.setdefault(p, time.time())
                await rt.sweep()
                rt.forget_idle()
                due = loop.time() - last_checkpoint.get(p, 0.0) >= CHECKPOINT_EVERY_S
                if rt.live and p in owned and (
                    rt.records_since_checkpoint >= CHECKPOINT_EVERY_RECORDS
                    or (due and rt.records_since_checkpoint > 0)
                ):
                    await write_checkpoint(p, rt)
            worker.stats.sessions = sum(len(rt.sessions) for rt in worker.runtimes.values())
            total = klog.stats.snapshot()["dead_lettered"]
            metrics.dead_letters(total - dead_lettered)
            dead_lettered = total
            worker.health.pending = len(unowned)
            worker.health.live = member.joined or worker.ready.is_set()
            worker.publish(owned, uncovered_since=uncovered_since, input_lag=input_lag)
    finally:
        # Drain (the tails still run), stop the sessions (nothing more written), then
        # leave the group: the poll thread's close() revokes what is left through the
        # same callback.
        if member.error is None:
            with contextlib.suppress(Exception):
                await drain(sorted(owned), "stopping")
        async with lock:
            for p in list(owned):
                own = owned.pop(p)
                if own.tail is not None:
                    own.tail.cancel()
            for rt in list(worker.runtimes.values()):
                await rt.stop()
        member.stop()
        await asyncio.to_thread(member.join, CALLBACK_TIMEOUT_S + max(worker.drain_timeout, 0.0))
