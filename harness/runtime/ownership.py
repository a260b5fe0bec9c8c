"""Who writes a session: claiming it once, renewing its lease, giving it up.

One ``Ownership`` per session core. Claims are serialised by a lock, so concurrent
first writes of one session in one host make ONE claim (two claims would fence each
other: issue 13). Appends in flight are counted, so a release never pulls the writer
from under an append. Renewals are not done here: the host's poller renews every
held lease in one pass (see ``harness.runtime.poller``), so a held session costs no
task of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

from harness.clock import Clock
from harness.log.base import SessionLog, SessionWriter

__all__ = ["Ownership", "RenewalHost"]


class RenewalHost(Protocol):
    """Where a held ownership is registered for lease renewal (the host's poller)."""

    def hold(self, ownership: Ownership) -> None: ...

    def drop(self, ownership: Ownership) -> None: ...


class Ownership:
    """The writer of one session, if this process holds it."""

    def __init__(
        self,
        *,
        log: SessionLog,
        session_id: str,
        owner_id: str,
        lease: timedelta,
        clock: Clock,
        renewals: RenewalHost | None,
        on_lost: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.log = log
        self.session_id = session_id
        self.owner_id = owner_id
        self.lease = lease
        self.clock = clock
        self._renewals = renewals
        self.on_lost = on_lost  # told when a renewal finds the lease lost (FencedError)
        self.writer: SessionWriter | None = None
        self.inflight = 0  # appends under way with ``writer``
        self.next_renewal = 0.0
        self._lock = asyncio.Lock()
        self._releasing: asyncio.Future[None] | None = None
        self._releasing_writer: SessionWriter | None = None
        # Logs with leases (SQLite, memory) need renewals and are given up when idle;
        # Kafka fences by producer epoch: a held writer costs nothing there.
        self.has_leases: bool = bool(getattr(log, "has_leases", True))

    @property
    def held(self) -> bool:
        return self.writer is not None

    async def acquire(self) -> SessionWriter:
        """The writer, claiming the session first if needed (one claim at a time).

        Raises:
            SessionBusy: another owner's lease is live.
        """
        writer = self.writer
        if writer is not None:
            return writer
        async with self._lock:
            if self.writer is None:
                self.writer = await self.log.claim(self.session_id, owner=self.owner_id, lease=self.lease)
                self.next_renewal = self.clock.now() + self.lease.total_seconds() / 3
                if self.has_leases and self._renewals is not None:
                    self._renewals.hold(self)
            return self.writer

    def lost(self) -> None:
        """Forget the writer without releasing it (fenced, or a dying process's view)."""
        self.writer = None
        if self._renewals is not None:
            self._renewals.drop(self)

    async def release(self) -> None:
        """Give the session up so another owner can claim at once (best effort).

        The release runs to its end even if the caller is cancelled (a driver closed
        while it gives the session up), and a second call waits for the same one.
        """
        async with self._lock:
            writer, self.writer = self.writer, None
            if self._renewals is not None:
                self._renewals.drop(self)
            if writer is not None:
                self._releasing, self._releasing_writer = asyncio.ensure_future(writer.release()), writer
            elif self._releasing is not None and self._releasing.cancelled() and self._releasing_writer is not None:
                # That release never ran: its loop ended first (``asyncio.run`` cancels the
                # tasks left at its end). Give the session up now, on this loop.
                self._releasing = asyncio.ensure_future(self._releasing_writer.release())
            releasing = self._releasing
        if releasing is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(releasing)

    async def renew_if_due(self) -> None:
        """Renew the lease when a third of it has passed (``FencedError`` if lost)."""
        writer = self.writer
        now = self.clock.now()
        if writer is None or now < self.next_renewal:
            return
        self.next_renewal = now + self.lease.total_seconds() / 3
        await writer.renew()
