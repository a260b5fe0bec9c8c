"""One task per host that keeps its sessions' leases and tells them about new records.

A session handle does not poll the log itself (a thousand idle handles would wake a
thousand times per interval). Instead, while the host has sessions that hold a lease
or that are open for reading, this poller wakes every ``poll_interval`` and

1. renews every held lease that is due (one pass; on SQLite the renewals queued in
   one pass share one transaction);
2. asks the log which watched sessions have new records, and hints each of them
   with the positions of those records: the session reads its log only then.

Where new records are found: ``positions_since(after, session_ids)`` on the embedded logs
(SQLite, memory: one query over the positions, no record decoded); on Kafka, the
partitions of the watched sessions, read lazily from where the poller last was (a
session with no record yet is watched from its first one); any other log: every
watched session is hinted every time.

A worker's sessions are fed by the worker itself and are never watched; their leases
(SQLite) are renewed here too. While blocking code holds the event loop, the poller's
watchdog thread renews them instead and says where the loop is stuck
(``harness.runtime.watchdog``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol

from harness.errors import FencedError, LogError
from harness.log.base import SessionLog
from harness.runtime.ownership import Ownership
from harness.runtime.watchdog import LoopWatchdog

__all__ = ["HostPoller", "Watched"]

log = logging.getLogger("harness.host")


class Watched(Protocol):
    """A session open for reading: it is told about new records of its own."""

    @property
    def session_id(self) -> str: ...

    @property
    def last_seq(self) -> int: ...

    def hint(self, seqs: Sequence[int]) -> None:
        """New committed records of the session are at these positions."""
        ...


class HostPoller:
    def __init__(
        self, log_: SessionLog, *, interval: float, stall_warning: float = 10.0, watch_every: float = 0.5
    ) -> None:
        self._log = log_
        self._interval = interval
        self._held: set[Ownership] = set()
        self._watched: dict[str, set[Watched]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self._position: int | None = None  # embedded logs: every record <= position was seen
        self._partitions: dict[int, int] = {}  # Kafka: partition -> next offset to read
        self._closed = False
        self._watchdog = LoopWatchdog(lambda: self._held, warn_after=stall_warning, check_every=watch_every)

    # -- registration -----------------------------------------------------------------------

    def hold(self, ownership: Ownership) -> None:
        self._held.add(ownership)
        self._ensure_running()

    def drop(self, ownership: Ownership) -> None:
        self._held.discard(ownership)

    def watch(self, session: Watched) -> None:
        self._watched[session.session_id].add(session)
        self._ensure_running()

    def unwatch(self, session: Watched) -> None:
        watchers = self._watched.get(session.session_id)
        if watchers is not None:
            watchers.discard(session)
            if not watchers:
                del self._watched[session.session_id]

    @property
    def watching(self) -> int:
        return len(self._watched)

    def _ensure_running(self) -> None:
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="harness-host-poller")
        self._watchdog.start(loop)

    @property
    def watchdog(self) -> LoopWatchdog:
        return self._watchdog

    async def close(self) -> None:
        self._closed = True
        self._watchdog.stop()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    # -- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        while self._held or self._watched:
            try:
                await self._renew()
                if self._watched:
                    await self._hint()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                log.warning("host poller: %s", exc)
            await asyncio.sleep(self._interval)

    async def _renew(self) -> None:
        if not self._held:
            return
        now = next(iter(self._held)).clock.now()
        due = [o for o in self._held if now >= o.next_renewal]  # (a thousand held: no coroutine each)
        if not due:
            return
        outcomes = await asyncio.gather(*(o.renew_if_due() for o in due), return_exceptions=True)
        for ownership, outcome in zip(due, outcomes, strict=True):
            if isinstance(outcome, FencedError):
                ownership.lost()
                if ownership.on_lost is not None:
                    ownership.on_lost(outcome)
            elif isinstance(outcome, BaseException) and not isinstance(outcome, LogError):
                raise outcome

    async def _hint(self) -> None:
        found = await self._changes()
        for sid, seqs in found.items():
            for session in list(self._watched.get(sid, ())):
                session.hint(seqs)

    async def _changes(self) -> dict[str, list[int]]:
        changes = getattr(self._log, "positions_since", None)
        if callable(changes):
            if self._position is None:
                self._position, _ = await changes(None, ())
                # Sessions read their log when they open: from here on, hints cover the rest.
                return {sid: [] for sid in self._watched}
            self._position, new = await changes(self._position, set(self._watched))
            return dict(new)
        if callable(getattr(self._log, "read_partition", None)) and callable(getattr(self._log, "partition_for", None)):
            return await self._partition_changes()
        return {sid: [] for sid in self._watched}  # no way to tell: every session looks itself

    async def _partition_changes(self) -> dict[str, list[int]]:
        klog: Any = self._log
        starts: dict[int, int] = {}
        for sid, sessions in self._watched.items():
            p = klog.partition_for(sid)
            known = [s.last_seq for s in sessions if s.last_seq > 0]
            if p in self._partitions:
                starts[p] = self._partitions[p]
            elif known:
                starts[p] = min(starts.get(p, min(known)), min(known))
        found: dict[str, list[int]] = defaultdict(list)
        for p, start in starts.items():
            entries = await klog.read_partition(p, start, lazy=True)
            for entry in entries:
                if entry.session_id in self._watched:
                    found[entry.session_id].append(entry.seq)
            self._partitions[p] = entries[-1].seq if entries else start
        return found
