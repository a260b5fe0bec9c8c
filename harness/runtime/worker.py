"""A worker: drives every session of the partitions it owns until stopped.

Stateless: everything it knows it reads from the log. On Kafka it joins the
consumer group ``<prefix>.workers`` and owns the partitions the group gives it
(see ``harness.runtime.group``) and follows each through the log's shared tail; on
SQLite or memory it owns the whole log and reads it again whenever it changed
(``harness.log.follow.watch_changes``: an in-process signal, or SQLite's
``PRAGMA data_version`` checked every few ms), so a new input is picked up within
milliseconds of its commit, with no poll interval on the way. Either way each owned
partition is a ``PartitionRuntime``: rebuild from the log, go live, route new records.

A restart reads the log's latest checkpoint and only what came after it, on either log:
on SQLite the ``checkpoint`` row (``harness.log.sqlite_checkpoint``), written by this
loop's sweep every ``CHECKPOINT_EVERY_RECORDS`` records or ``CHECKPOINT_EVERY_S``
(never with a step's commit); without a usable one, the whole file, as before. On
SQLite the same sweep stores the summaries of sessions gone quiet, a batch at a time
(``harness.runtime.stored_summaries``), so a listing need not read their records.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from harness.clock import Clock, duration_seconds
from harness.definition import Harness, parameter_list
from harness.errors import CorruptRecord, DefinitionError, LogError
from harness.log.base import Checkpoint, CheckpointWritten, SessionLog
from harness.log.follow import ChangeSource, watch_changes
from harness.observability import Observation, metrics
from harness.records import LogEntry
from harness.runtime.gate import SessionGate
from harness.runtime.host import DEFAULT_SYNC_THREADS, HarnessHost
from harness.runtime.observe import WorkerHealth, observe_runtimes
from harness.runtime.partition import (
    CHECKPOINT_EVERY_RECORDS,
    CHECKPOINT_EVERY_S,
    PartitionRuntime,
    SecretsFor,
    drain_all,
)
from harness.runtime.stored_summaries import SummaryWriter

__all__ = ["DEFAULT_DRAIN_TIMEOUT", "Worker", "WorkerStats"]

log = logging.getLogger("harness.worker")

SWEEP_EVERY_S = 1.0
"""How often failed sessions are restarted and ended ones forgotten."""
SCAN_CHUNK = 2000
GATE_EVERY_S = 0.05
"""With ``max_sessions``: how often slots of sessions that stopped running are given to
waiting ones."""
DEFAULT_DRAIN_TIMEOUT = timedelta(seconds=20)
"""How long a hand-over lets running tool and model calls finish (see ``Worker``); below
the chart's terminationGracePeriodSeconds (60) with room to close producers."""
BEAT_EVERY_S = 1.0
"""The loop's heartbeat for ``/healthz`` (see ``harness.runtime.observe``)."""


@dataclass
class WorkerStats:
    partitions: int = 0
    sessions: int = 0
    records_ingested: int = 0
    corrupt_records: int = 0
    parked_sessions: int = 0
    rebuilds: int = 0
    scans: int = 0  # reads of the log for new records (SQLite / memory)
    extra: dict[str, Any] = field(default_factory=dict)


def _check_secrets_for(secrets_for: object) -> None:
    """Refuse a ``secrets_for`` the worker could not call as ``secrets_for(session_id,
    harness_name)`` (the message shows its type, never what it holds)."""
    if secrets_for is None:
        return
    if not callable(secrets_for):
        raise DefinitionError(
            f"Worker(secrets_for=) takes a function (session_id, harness_name) -> {{name: value}}, not "
            f"{type(secrets_for).__name__}: for the same secrets in every session, "
            "secrets_for=lambda session_id, harness_name: secrets"
        )
    if inspect.iscoroutinefunction(secrets_for) or inspect.iscoroutinefunction(
        getattr(secrets_for, "__call__", None)  # noqa: B004 - an object with an async __call__
    ):
        raise DefinitionError(
            "Worker(secrets_for=) must be a plain function, not 'async def': the worker calls it as it "
            "starts each session; fetch the secrets ahead (or cache them) and return them from a plain function"
        )
    try:
        signature = inspect.signature(secrets_for)
    except (TypeError, ValueError):
        return  # (a builtin without a signature: called as it is)
    try:
        signature.bind("session-id", "harness-name")
    except TypeError:
        raise DefinitionError(
            "Worker(secrets_for=) is called as secrets_for(session_id, harness_name); this one takes "
            f"{parameter_list(signature)}"
        ) from None


def _drain_seconds(drain_timeout: object) -> float:
    """``drain_timeout`` (a timedelta or a number of seconds, zero or more) in seconds."""
    try:
        seconds = duration_seconds(drain_timeout, "Worker(drain_timeout=)")
    except ValueError as exc:
        raise DefinitionError(f"{exc}, e.g. drain_timeout=timedelta(seconds=20) or drain_timeout=20") from None
    if seconds < 0:
        raise DefinitionError(f"Worker(drain_timeout=) must be zero or more (zero: no drain), not {seconds:g} s")
    return seconds


class Worker:
    """Runs the sessions of ``harnesses`` found in ``log``.

    Args:
        log: the session log (``open_log(url)``).
        harnesses: the harnesses this worker can run, matched by name.
        lease: ownership lease of a session (SQLite/memory).
        poll_interval: SQLite/memory logs with no change source only: how often the log
            is read for new records (a memory or SQLite log signals its commits instead).
        instance_id: Kafka static membership (``group.instance.id``).
        live: on Kafka, publish text deltas of streamed model answers to ``<prefix>.live``
            for other processes (``HarnessClient.events(sid, live=True)``); default True.
        secrets_for: ``secrets_for(session_id, harness_name) -> {name: value}``: the
            secrets of a session's tools (``ctx.secrets``), asked for each session when
            the worker starts to drive it: a plain (not async) function returning a
            mapping of str names to str or ``SecretStr`` values, or None. Values never
            reach the log (SPEC 2.9) nor a log line (they are registered with
            ``harness.logs.SECRETS``). When it raises or returns anything else for a
            session, that session is held (not driven, nothing written, one WARNING
            line) and it is asked again each sweep; the other sessions go on.
        max_sessions: at most this many sessions running at once (None: no limit);
            the others wait in order. A session parked on a person or a sleep gives its
            slot back (see ``harness.runtime.gate``).
        sync_threads: how many sync step functions and sync tools run at once (a
            bounded thread pool, never the event loop; see ``HarnessHost``).
        drain_timeout: a hand-over (stopping; on Kafka also a revoked partition) first
            drains: nothing new starts, a running tool call goes on to its result and a
            model call to its logged answer, for at most this long; what still runs then
            is cut (its next owner recovers it, as after a crash). A ``timedelta`` or a
            number of seconds; zero: no drain.

    Raises:
        DefinitionError: ``harnesses`` is not a list of harnesses (or is empty, or two
            share a name), ``secrets_for`` is not a plain function of (session_id,
            harness_name), ``max_sessions`` not a whole number of at least 1,
            ``drain_timeout`` not a duration of zero or more, ``owner_id`` or
            ``instance_id`` not a string; the host's own checks (``HarnessHost``) too.
    """

    def __init__(
        self,
        *,
        log: SessionLog,
        harnesses: Sequence[Harness],
        clock: Clock | None = None,
        lease: timedelta = timedelta(seconds=30),
        owner_id: str | None = None,
        poll_interval: timedelta = timedelta(milliseconds=100),
        instance_id: str | None = None,
        secrets_for: SecretsFor | None = None,
        live: bool = True,
        max_sessions: int | None = None,
        sync_threads: int = DEFAULT_SYNC_THREADS,
        drain_timeout: timedelta | float = DEFAULT_DRAIN_TIMEOUT,
    ) -> None:
        _check_secrets_for(secrets_for)
        drain_s = _drain_seconds(drain_timeout)
        if max_sessions is not None and (
            isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1
        ):
            raise DefinitionError(f"max_sessions must be a whole number of at least 1 or None, not {max_sessions!r}")
        if not isinstance(live, bool):
            raise DefinitionError(f"Worker(live=) takes True or False, not {live!r}")
        for option, value in (("owner_id", owner_id), ("instance_id", instance_id)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise DefinitionError(f"Worker({option}=) takes a non-empty string or None, not {value!r}")
        if isinstance(harnesses, Harness | str | bytes | Mapping) or not isinstance(harnesses, Iterable):
            alone = "; one harness goes in a list too: harnesses=[harness]" if isinstance(harnesses, Harness) else ""
            raise DefinitionError(
                f"Worker takes harnesses= as a list of harnesses made by define_harness(), not "
                f"{type(harnesses).__name__}{alone}"
            )
        by_name: dict[str, Harness] = {}
        for h in harnesses:
            if not isinstance(h, Harness):
                raise DefinitionError(
                    f"Worker(harnesses=): {h!r} is not a harness (make one with define_harness())"
                )
            if h.name in by_name:
                raise DefinitionError(f"two harnesses are named {h.name!r}")
            by_name[h.name] = h
        if not by_name:
            raise DefinitionError("a worker needs at least one harness")
        self.log = log
        self.harnesses = by_name
        self.owner_id = owner_id or f"worker:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.host = HarnessHost(
            log=log,
            lease=lease,
            clock=clock,
            owner_id=self.owner_id,
            poll_interval=poll_interval,
            sync_threads=sync_threads,
        )
        self.instance_id = instance_id
        self.secrets_for = secrets_for
        self.gate = SessionGate(max_sessions)
        self.stats = WorkerStats()
        self.runtimes: dict[int, PartitionRuntime] = {}
        self.ready = asyncio.Event()  # set once the first rebuild went live
        self.health = WorkerHealth(needs_broker=hasattr(log, "own_partition"))
        self.observation = Observation()  # published by the loop, read by the metrics thread
        self._live = live
        self._drain_timeout = drain_s
        self._hurry = asyncio.Event()  # set: a drain under way ends at once
        self._summaries = SummaryWriter(log) if hasattr(log, "summary_sources") else None

    @property
    def drain_timeout(self) -> float:
        """Seconds a hand-over lets running work reach its next boundary (0: none)."""
        return self._drain_timeout

    @property
    def hurry(self) -> asyncio.Event:
        """Set it (e.g. on a second SIGTERM) to end a drain under way at once."""
        return self._hurry

    def observe(self) -> Observation:
        """The latest published snapshot (``ObservationSource`` of the metrics facade)."""
        return self.observation

    def publish(
        self,
        owned: Iterable[int],
        *,
        uncovered_since: Mapping[int, float] | None = None,
        input_lag: Mapping[int, int] | None = None,
    ) -> None:
        """Publish a new snapshot of what this worker drives (called by its loop)."""
        self.health.beat()
        self.observation = observe_runtimes(
            self.runtimes, owned, uncovered_since=uncovered_since or {}, input_lag=input_lag or {},
            now_ms=int(self.host.clock.now() * 1000),
        )

    def runtime(self, partition: int) -> PartitionRuntime:
        rt = self.runtimes.get(partition)
        if rt is None:
            rt = self.runtimes[partition] = PartitionRuntime(
                host=self.host, harnesses=self.harnesses, partition=partition, secrets_for=self.secrets_for,
                gate=self.gate,
            )
        return rt

    async def run(self, stop: asyncio.Event) -> None:
        """Drive sessions until ``stop`` is set; then stop them recoverably."""
        self._warn_of_models_that_cannot_work()
        self.host.watch_the_loop()
        pump = asyncio.create_task(self._pump_gate(), name="gate") if self.gate.limited else None
        metrics.add_source(self)
        for name in self.harnesses:
            metrics.harness_served(name)
        beat = asyncio.create_task(self._beat(), name="worker-beat")
        publisher = await self._start_live()
        try:
            if hasattr(self.log, "own_partition"):  # partitioned log (Kafka): join the group
                from harness.runtime.group import run_group_worker

                await run_group_worker(self, stop)
            else:
                await self._run_polling(stop)
        except Exception as exc:
            self.health.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.health.stopping = True
            self.host.watch_the_loop(False)
            beat.cancel()
            metrics.remove_source(self)
            if pump is not None:
                pump.cancel()
                with contextlib.suppress(BaseException):
                    await pump
            # (on Kafka the group already drained and stopped its partitions: nothing to do)
            await drain_all(list(self.runtimes.values()), self._drain_timeout, "stopping", self._hurry)
            for rt in list(self.runtimes.values()):
                await rt.stop()
            self.runtimes.clear()
            if publisher is not None:
                self.host.live = None
                await asyncio.to_thread(publisher.close)

    def _warn_of_models_that_cannot_work(self) -> None:
        """A model that no call can work with (no API key anywhere) fails every turn; say
        so once at start rather than only in each turn's ``model_error``."""
        for name, harness in self.harnesses.items():
            check = getattr(harness.model, "config_problem", None)
            problem = check() if callable(check) else None
            if problem:
                log.warning("harness %s: every turn will fail (model_error) until its model can be called: %s",
                            name, problem)

    async def _start_live(self) -> Any:
        """On Kafka: the publisher of live text deltas (best effort: a failure only logs)."""
        if not self._live or not hasattr(self.log, "own_partition") or not hasattr(self.log, "settings"):
            return None
        from harness.live.kafka import KafkaLivePublisher

        publisher = KafkaLivePublisher.for_log(self.log)
        try:
            await asyncio.to_thread(publisher.start)
        except Exception as exc:  # noqa: BLE001 - live deltas are optional; sessions run without them
            log.warning("live events are off: %s", exc)
            return None
        self.host.live = publisher
        return publisher

    async def _pump_gate(self) -> None:
        while True:
            try:
                await self.gate.pump()
            except Exception as exc:  # noqa: BLE001 - a session that cannot start now is retried by the sweep
                log.warning("starting a waiting session failed: %s", exc)
            await asyncio.sleep(GATE_EVERY_S)

    async def _beat(self) -> None:
        while True:
            self.health.beat()
            await asyncio.sleep(BEAT_EVERY_S)

    # -- SQLite / memory: one partition, polled -------------------------------------------

    async def _scan(self, after: int) -> tuple[list[LogEntry], int]:
        items: list[Any] = await self.log.scan(None, after=after, limit=SCAN_CHUNK)  # type: ignore[attr-defined]
        self.stats.scans += 1
        entries: list[LogEntry] = []
        position = after
        rt = self.runtime(0)
        for item in items:
            if isinstance(item, CorruptRecord):
                # Its session is parked (never driven); the others go on.
                self.stats.corrupt_records += 1
                rt.report_corrupt(item)
                self.stats.parked_sessions = len(rt.parked)
                position = max(position, item.seq or position)
                continue
            entries.append(item)
            position = max(position, item.seq)
        return entries, position

    async def _run_polling(self, stop: asyncio.Event) -> None:
        changes = watch_changes(self.log)
        if changes is not None:
            changes.acquire()
        try:
            await self._follow(stop, changes)
        finally:
            if changes is not None:
                changes.release()

    async def _load_checkpoint(self, rt: PartitionRuntime) -> int | None:
        """Start ``rt`` from the log's checkpoint, if it has a usable one; its position."""
        read = getattr(self.log, "read_checkpoint", None)
        if read is None:
            return None
        try:
            found = await read()
        except LogError as exc:  # an optimisation only: read it all instead
            log.warning("the log's checkpoint cannot be read (%s); reading the whole log", exc)
            return None
        if not isinstance(found, tuple):
            level = logging.WARNING if found.damaged else logging.INFO
            log.log(level, "not starting from a checkpoint: %s; reading the whole log", found.why)
            return None
        checkpoint: Checkpoint = found[0]
        corrupt: list[CorruptRecord] = found[1]
        rt.load_checkpoint(checkpoint)
        for item in corrupt:  # a live session's unreadable record: parked, as by a full read
            self.stats.corrupt_records += 1
            rt.report_corrupt(item)
        self.stats.parked_sessions = len(rt.parked)
        return checkpoint.covers

    async def _write_checkpoint(self, rt: PartitionRuntime) -> None:
        """The log's checkpoint as of ``rt.position`` (SQLite: the sessions not ended)."""
        write = getattr(self.log, "write_checkpoint", None)
        if write is None or not rt.live or rt.stopped:
            return
        checkpoint = rt.checkpoint()
        try:
            await write(checkpoint.covers, {*checkpoint.sessions, *rt.parked})
        except LogError as exc:  # an optimisation only: try again later
            log.warning("checkpoint not written: %s", exc)
            return
        rt.checkpoint_written(CheckpointWritten(directory=(), sealed=len(checkpoint.unsealed or ())))
        rt.records_since_checkpoint = 0
        if self._summaries is not None:
            self._summaries.more = True  # sessions went quiet since the last one: the sweep stores them

    async def _store_summaries(self, rt: PartitionRuntime) -> None:
        """One batch of quiet sessions' stored summaries, if some may be missing (SQLite)."""
        if self._summaries is None or not self._summaries.more or not rt.live or rt.stopped:
            return
        await self._summaries.batch(rt.not_ended())

    async def _follow(self, stop: asyncio.Event, changes: ChangeSource | None) -> None:
        rt = self.runtime(0)
        started = time.monotonic()
        covers = await self._load_checkpoint(rt)
        position = rt.position
        records = 0
        while True:  # rebuild: read everything after the checkpoint, drive nothing
            entries, new_position = await self._scan(position)
            rt.rebuild(entries)
            records += len(entries)
            if new_position == position:
                break
            position = new_position
        await rt.go_live()
        since = f"after its checkpoint at position {covers}" if covers is not None else "from its start"
        log.info("log read: %d records %s, %d live sessions", records, since, len(rt.sessions))
        if rt.records_since_checkpoint >= CHECKPOINT_EVERY_RECORDS:
            await self._write_checkpoint(rt)
        last_checkpoint = time.monotonic()
        metrics.rebuild(time.monotonic() - started, records)
        self.stats.rebuilds += 1
        self.stats.partitions = 1
        self.ready.set()
        self.health.live = True
        loop = asyncio.get_running_loop()
        next_sweep = loop.time() + SWEEP_EVERY_S
        seen = -1  # the change version last read at
        more = True  # the last read may have left records behind
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                if more or changes is None or changes.version != seen:
                    if changes is not None:
                        seen = changes.version  # before reading: a commit during the read reads again
                    try:
                        entries, position = await self._scan(position)
                    except LogError as exc:
                        log.warning("reading the log failed: %s", exc)
                        entries = []
                    more = len(entries) >= SCAN_CHUNK
                    if entries:
                        self.stats.records_ingested += len(entries)
                        await rt.ingest(entries)
                if loop.time() >= next_sweep:
                    await rt.sweep()
                    rt.forget_idle()
                    due = time.monotonic() - last_checkpoint >= CHECKPOINT_EVERY_S
                    if rt.records_since_checkpoint >= CHECKPOINT_EVERY_RECORDS or (
                        due and rt.records_since_checkpoint > 0
                    ):
                        await self._write_checkpoint(rt)
                        last_checkpoint = time.monotonic()
                    await self._store_summaries(rt)  # a batch a sweep while some are missing
                    next_sweep = loop.time() + SWEEP_EVERY_S
                    self.publish([0])
                self.stats.sessions = len(rt.sessions)
                if more:
                    continue
                # Wait for a commit (or the next sweep); without a change source, poll.
                wait_s = max(0.0, next_sweep - loop.time())
                if changes is None:
                    wait_s = min(wait_s, self.host.poll_interval)
                    waiter: asyncio.Future[Any] = asyncio.ensure_future(asyncio.sleep(wait_s))
                else:
                    waiter = asyncio.ensure_future(changes.wait(seen))
                try:
                    await asyncio.wait({waiter, stopping}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
            if rt.records_since_checkpoint > 0:
                # A stop leaves one too: a worker that never runs CHECKPOINT_EVERY_S (a
                # script's, a test's, one restarted often) would have its file read whole
                # at every start otherwise. What runs on is the next start's tail.
                await self._write_checkpoint(rt)
        finally:
            stopping.cancel()
