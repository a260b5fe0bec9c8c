"""``HarnessHost``: opens durable sessions on a session log."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from pydantic import SecretStr

from harness.clock import Clock, SystemClock, duration_seconds
from harness.definition import Harness
from harness.errors import DefinitionError, HostClosed
from harness.ids import check_id
from harness.live import LivePublisher
from harness.log import check_log, open_log
from harness.log.base import SessionLog
from harness.replay import fold
from harness.runtime.core import SessionCore
from harness.runtime.ownership import Ownership
from harness.runtime.poller import HostPoller
from harness.runtime.session import Session
from harness.secrets import SecretScrubber, given_secrets
from harness.sync_pool import SyncPool

__all__ = ["DEFAULT_SYNC_THREADS", "HarnessHost"]

DEFAULT_SYNC_THREADS = 16
"""Threads that run sync step functions and sync tools of one host at once."""

QUICK_SYNC_S = 0.0003
"""How long a loop with nothing else ready waits, blocked, for a quick sync call (a sync
step fn) to end on its thread before it awaits the call like any other (a quick one, e.g.
a ``lambda`` that builds a dict, then costs no wake-up of the loop through its self-pipe:
~80 -> ~45 us a call here). No longer than an inline SQLite commit keeps it; never with
a task ready."""


def _positive_duration(value: object, name: str) -> timedelta:
    """``value`` (a timedelta or a number of seconds) as a positive timedelta."""
    try:
        seconds = duration_seconds(value, f"HarnessHost({name}=)")
    except ValueError as exc:
        raise DefinitionError(f"{exc}, e.g. {name}=timedelta(seconds=30) or {name}=30") from None
    if seconds <= 0:
        raise DefinitionError(f"HarnessHost({name}=) must be a positive duration, not {value!r}")
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


class HarnessHost:
    """Runs durable sessions of one or more harnesses on a session log.

    Args:
        log: a ``SessionLog`` or a URL for ``open_log``.
        lease: how long an owner's claim on a session lasts without renewal (a
            ``timedelta`` or a number of seconds); another process may take a session
            over once it expired.
        clock: the time source (a ``FakeClock`` in tests).
        owner_id: this host's name in ownership records (default host:pid:random).
        poll_interval: how often the host's one poller renews the leases it holds and
            looks for records other processes put in the log for its open sessions
            (answers, records, messages). Idle sessions cost nothing on their own. A
            ``timedelta`` or a number of seconds; a quarter of the lease at most (a
            longer one is shortened to that, so leases are renewed in time).
        sync_threads: how many sync step functions and sync tools may run at once (a
            bounded thread pool; more wait for a thread; a sync tool waiting in
            ``step.sleep`` / ``step.ask`` does not count meanwhile). They never run on the
            event loop, so a blocking call stops neither lease renewals nor other sessions.
        live: where text deltas of streamed model answers go for other processes
            (a ``KafkaLivePublisher``; workers on Kafka set one). In-process
            subscribers (``session.events(live=True)``) get them in any case.

    Raises:
        TypeError: ``log`` is neither a session log nor a URL.
        DefinitionError: ``lease`` or ``poll_interval`` is not a positive duration,
            ``sync_threads`` not a whole number of at least 1, ``clock`` not a ``Clock`` or
            ``owner_id`` not a string.
    """

    def __init__(
        self,
        *,
        log: SessionLog | str,
        lease: timedelta | float = timedelta(seconds=30),
        clock: Clock | None = None,
        owner_id: str | None = None,
        poll_interval: timedelta | float = timedelta(milliseconds=200),
        live: LivePublisher | None = None,
        sync_threads: int = DEFAULT_SYNC_THREADS,
    ) -> None:
        if isinstance(sync_threads, bool) or not isinstance(sync_threads, int) or sync_threads < 1:
            raise DefinitionError(f"sync_threads must be a whole number of at least 1, not {sync_threads!r}")
        self.lease: timedelta = _positive_duration(lease, "lease")
        self.poll_interval = _positive_duration(poll_interval, "poll_interval").total_seconds()
        self.log: SessionLog = open_log(log) if isinstance(log, str) else check_log(log)
        self._owns_log = isinstance(log, str)
        if clock is not None and not isinstance(clock, Clock):
            raise DefinitionError(
                f"HarnessHost takes clock= as a Clock (now() and async sleep_until()), e.g. FakeClock(), "
                f"not {type(clock).__name__}"
            )
        if owner_id is not None and (not isinstance(owner_id, str) or not owner_id.strip()):
            raise DefinitionError(f"HarnessHost(owner_id=) takes a non-empty string or None, not {owner_id!r}")
        self.clock: Clock = clock or SystemClock()
        self.owner_id = owner_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.live = live
        self.sync_threads = sync_threads
        # (a stall worth a warning: a third of the lease, when a renewal falls due; the
        # watchdog notices a stall within two looks, well inside the two thirds of a lease
        # left when a renewal falls due, however short the lease)
        # (renewals fall due every third of the lease: a pass at least every quarter of it
        # renews each in time, whatever poll_interval says)
        self._poller = HostPoller(self.log, interval=min(self.poll_interval, self.lease.total_seconds() / 4),
                                  stall_warning=min(10.0, self.lease.total_seconds() / 3),
                                  watch_every=max(0.02, min(0.5, self.lease.total_seconds() / 6)))
        self._pool: SyncPool | None = None
        self._sync_calls: set[concurrent.futures.Future[Any]] = set()  # submitted to the pool, not done
        self._cores: dict[str, SessionCore] = {}
        self._handles: dict[str, set[Session]] = {}
        self._closed = False

    async def open(
        self,
        harness: Harness,
        *,
        session_id: str,
        secrets: Mapping[str, str | SecretStr] | None = None,
    ) -> Session:
        """A handle on the session, its state rebuilt from the log.

        Opening claims nothing: the first write does. Handles of one session in one host
        share their state and ownership (their calls are queued in log order).

        Raises:
            InvalidId: the session id is not a usable id (``harness.ids.check_id``).
            SecretInName: the session id holds one of the secrets.
            DefinitionError: ``harness`` is not a Harness, ``secrets`` not a mapping of
                names to str or SecretStr values, the session's log says it runs another
                harness (the name its first message gave), or the session is open here
                with another harness or secrets.
            HostClosed: this host was closed.
        """
        if self._closed:
            raise HostClosed()
        if not isinstance(harness, Harness):
            raise DefinitionError(
                f"host.open() takes a Harness made by define_harness(), not {type(harness).__name__}"
            )
        plain = given_secrets(secrets, "host.open()")
        check_id(session_id, "session id")
        SecretScrubber(plain).check_name("session id", session_id, session_id=None)
        core = self._cores.get(session_id)
        if core is not None and (core.closed or core.fatal is not None):
            await self._drop_core(core)
            core = None
        if core is None:
            core = SessionCore(
                host=self, harness=harness, session_id=session_id, secrets=plain, state=fold(session_id, [])
            )
            self._cores[session_id] = core  # watched from here on: then read the log
            try:
                await core.refresh()
                runs = core.state.harness
                if runs is not None and runs != harness.name:
                    raise DefinitionError(
                        f"session {session_id!r} runs harness {runs!r}, not {harness.name!r}: open it with "
                        f"the harness named {runs!r}, or use another session id for {harness.name!r}"
                    )
            except BaseException:
                await self._drop_core(core)
                raise
        elif core.harness.name != harness.name or dict(core.secrets) != dict(plain):
            raise DefinitionError(
                f"session {session_id!r} is already open in this host with harness {core.harness.name!r} "
                "and other secrets; close that handle first"
                if core.harness.name == harness.name
                else f"session {session_id!r} is already open in this host with harness {core.harness.name!r}"
            )
        handle = Session(core, on_close=self._handle_closed)
        self._handles.setdefault(session_id, set()).add(handle)
        return handle

    async def _handle_closed(self, handle: Session) -> None:
        sid = handle.session_id
        handles = self._handles.get(sid)
        if handles is not None:
            handles.discard(handle)
            if handles:
                return
            del self._handles[sid]
        core = self._cores.get(sid)
        if core is not None and core is handle._core:
            await self._drop_core(core)

    async def _drop_core(self, core: SessionCore) -> None:
        if self._cores.get(core.session_id) is core:
            del self._cores[core.session_id]
        await core.close()

    @property
    def open_sessions(self) -> int:
        """Sessions with an open handle in this host."""
        return len(self._cores)

    # -- what sessions need from their host (SessionHost) ----------------------------------------

    def hold(self, ownership: Ownership) -> None:
        self._poller.hold(ownership)

    def drop(self, ownership: Ownership) -> None:
        self._poller.drop(ownership)

    def watch(self, core: SessionCore) -> None:
        self._poller.watch(core)

    def unwatch(self, core: SessionCore) -> None:
        self._poller.unwatch(core)

    def watch_the_loop(self, on: bool = True) -> None:
        """Start (or stop) the loop watchdog now rather than with the first held lease or
        watched session: a worker on Kafka holds neither, and still wants to hear where
        blocking code stopped its loop (``harness.runtime.watchdog``)."""
        if on:
            self._poller.watchdog.start(asyncio.get_running_loop())
        else:
            self._poller.watchdog.stop()

    async def run_sync(self, fn: Callable[[], Any], *, quick: bool = False) -> Any:
        """``fn()`` on the host's bounded thread pool. ``quick`` (a sync step fn: usually
        over at once, never needing the loop meanwhile): a loop with no other task ready
        waits for it, blocked, up to ``QUICK_SYNC_S``. Not for a sync tool: its steps go
        through the loop, which would not run them while it waits."""
        if self._pool is None:
            self._pool = SyncPool(self.sync_threads, thread_name_prefix="harness-sync")
        future = self._pool.submit(fn)
        self._sync_calls.add(future)  # until its thread is done with it (a cancelled waiter does not end it)
        future.add_done_callback(self._sync_calls.discard)
        if quick and not getattr(asyncio.get_running_loop(), "_ready", True):  # (see QUICK_SYNC_S)
            try:
                return future.result(timeout=QUICK_SYNC_S)
            except (TimeoutError, concurrent.futures.CancelledError):
                pass  # still running (or dropped by stop_sync_calls): awaited as before
        return await asyncio.wrap_future(future)

    def stop_sync_calls(self) -> int:
        """Start no more sync calls (queued ones are dropped) and return how many still run
        on a thread: a thread cannot be stopped, so a process that exits should not wait
        for them (their steps were cut: nothing of them is recorded)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        return sum(1 for f in list(self._sync_calls) if not f.done())

    # -- lifecycle ---------------------------------------------------------------------------------

    async def close(self) -> None:
        self._closed = True
        for handles in list(self._handles.values()):
            for handle in list(handles):
                await handle.close()
        for core in list(self._cores.values()):
            await self._drop_core(core)
        await self._poller.close()
        self.stop_sync_calls()
        if self._owns_log:
            await self.log.close()

    async def __aenter__(self) -> HarnessHost:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
