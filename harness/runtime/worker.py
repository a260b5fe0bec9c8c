"""A worker: drives every session of the partitions it owns until stopped.

Stateless: everything it knows it reads from the log. On Kafka it joins the
consumer group ``<prefix>.workers`` and owns the partitions the group gives it
(see ``harness.runtime.group``); on SQLite or memory it owns the whole log
and polls it for new records. Either way each owned partition is a
``PartitionRuntime``: rebuild from the log, go live, route new records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from harness.clock import Clock
from harness.definition import Harness
from harness.errors import CorruptRecord, DefinitionError, LogError
from harness.log.base import SessionLog
from harness.records import LogEntry
from harness.runtime.host import DEFAULT_SYNC_THREADS, HarnessHost
from harness.runtime.partition import PartitionRuntime, SecretsFor

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("harness.worker")

SWEEP_EVERY_S = 1.0
"""How often failed sessions are restarted and ended ones forgotten."""
SCAN_CHUNK = 2000


@dataclass
class WorkerStats:
    partitions: int = 0
    sessions: int = 0
    records_ingested: int = 0
    corrupt_records: int = 0
    parked_sessions: int = 0
    rebuilds: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Worker:
    """Runs the sessions of ``harnesses`` found in ``log``.

    Args:
        log: the session log (``open_log(url)``).
        harnesses: the harnesses this worker can run, matched by name.
        lease: ownership lease of a session (SQLite/memory).
        instance_id: Kafka static membership (``group.instance.id``).
        secrets_for: gives a session's secrets from (session id, harness name).
        sync_threads: how many sync step functions and sync tools run at once (a
            bounded thread pool, never the event loop; see ``HarnessHost``).
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
        sync_threads: int = DEFAULT_SYNC_THREADS,
    ) -> None:
        by_name: dict[str, Harness] = {}
        for h in harnesses:
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
        self.stats = WorkerStats()
        self.runtimes: dict[int, PartitionRuntime] = {}
        self.ready = asyncio.Event()  # set once the first rebuild went live

    def runtime(self, partition: int) -> PartitionRuntime:
        rt = self.runtimes.get(partition)
        if rt is None:
            rt = self.runtimes[partition] = PartitionRuntime(
                host=self.host, harnesses=self.harnesses, partition=partition, secrets_for=self.secrets_for
            )
        return rt

    async def run(self, stop: asyncio.Event) -> None:
        """Drive sessions until ``stop`` is set; then stop them recoverably."""
        try:
            if hasattr(self.log, "own_partition"):  # partitioned log (Kafka): join the group
                from harness.runtime.group import run_group_worker

                await run_group_worker(self, stop)
            else:
                await self._run_polling(stop)
        finally:
            for rt in list(self.runtimes.values()):
                await rt.stop()
            self.runtimes.clear()

    # -- SQLite / memory: one partition, polled -------------------------------------------

    async def _scan(self, after: int) -> tuple[list[LogEntry], int]:
        items: list[Any] = await self.log.scan(None, after=after, limit=SCAN_CHUNK)  # type: ignore[attr-defined]
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
        rt = self.runtime(0)
        position = 0
        while True:  # rebuild: read everything, drive nothing
            entries, new_position = await self._scan(position)
            rt.rebuild(entries)
            if new_position == position:
                break
            position = new_position
        await rt.go_live()
        self.stats.rebuilds += 1
        self.stats.partitions = 1
        self.ready.set()
        loop = asyncio.get_running_loop()
        next_sweep = loop.time() + SWEEP_EVERY_S
        poll = self.host.poll_interval
        while not stop.is_set():
            try:
                entries, position = await self._scan(position)
            except LogError as exc:
                log.warning("reading the log failed: %s", exc)
                entries = []
            if entries:
                self.stats.records_ingested += len(entries)
                await rt.ingest(entries)
            if loop.time() >= next_sweep:
                await rt.sweep()
                rt.forget_idle()
                next_sweep = loop.time() + SWEEP_EVERY_S
            self.stats.sessions = len(rt.sessions)
            if not entries:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), poll)
