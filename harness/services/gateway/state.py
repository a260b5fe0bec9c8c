"""What the gateway's routes share: the log, the live events, auth, the known harnesses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Sequence
from importlib import resources
from typing import Any

from harness.definition import Harness
from harness.errors import LogError, LogUnavailable
from harness.ids import split_tenant_session_id, tenant_session_id
from harness.live import LiveSource
from harness.log.base import SessionLog
from harness.log.follow import subscribe
from harness.records import LogEntry
from harness.runtime.catalog import KafkaSessionIndex, SessionIndex, scan_session, sort_summaries
from harness.services.gateway.auth import Authenticator, Principal
from harness.services.gateway.authlimit import AuthFailureLimit
from harness.services.gateway.breaker import LogBreaker
from harness.services.gateway.inputs import Inputs
from harness.services.gateway.metrics import GatewayMetrics
from harness.services.gateway.ratelimit import TokenBuckets
from harness.services.gateway.sessions import Sessions
from harness.services.gateway.settings import GatewaySettings
from harness.views import SessionSummary

__all__ = ["READY_TIMEOUT_S", "GatewayState", "TenantSlots", "console_dir"]

log = logging.getLogger("harness.gateway")

READY_TIMEOUT_S = 5.0
"""How long ``/readyz`` waits for the log to answer."""


class TenantSlots:
    """At most ``limit`` of something held at once per tenant (open streams, waiting POSTs),
    so that one tenant cannot take a gateway's memory, sockets and tasks from the others.

    Only the event loop touches it (no lock). :meth:`take` gives the release function, which
    may be called more than once (a stream's end and its response's cleanup both call it).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: Counter[str | None] = Counter()

    def take(self, tenant: str | None) -> Callable[[], None] | None:
        """A slot for ``tenant`` (its release), or None when it holds ``limit`` already."""
        if self.held[tenant] >= self.limit:
            return None
        self.held[tenant] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.held[tenant] -= 1
                if self.held[tenant] <= 0:
                    del self.held[tenant]

        return release


class GatewayState:
    """What the routes share: the log, the live events, the auth, the harnesses known here.

    Records are read with :func:`harness.runtime.catalog.scan_session` (read-only: an
    unreadable record is skipped, never dead-lettered, and its session noted in ``unreadable``) through :class:`Sessions` (the
    sessions read lately, caught up per request) and followed with
    :func:`harness.log.follow.subscribe` (one shared reader per log, or per partition
    on Kafka); live text deltas come from ``live``. Reads go through ``breaker``: within
    ``settings.read_timeout_s``, and at once refused while the log is known to be down.
    """

    def __init__(
        self,
        *,
        settings: GatewaySettings,
        log: SessionLog,
        owns_log: bool,
        live: LiveSource,
        harnesses: Sequence[Harness],
        auth: Authenticator,
        metrics: GatewayMetrics,
        now_ms: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.log = log
        self.owns_log = owns_log
        self.live = live
        self.harnesses = {h.name: h for h in harnesses}
        self.auth = auth
        self.metrics = metrics
        self.now_ms = now_ms
        self.breaker = LogBreaker(self._probe, timeout=settings.read_timeout_s)
        # On Kafka a POST's read-back of its own input comes from the shared tail.
        self.sessions = Sessions(self.read, follow=self.follow if hasattr(log, "subscribe") else None,
                                 follow_timeout=settings.read_timeout_s, watch=self.follow,
                                 max_bytes=settings.session_cache_mb * 1024 * 1024)
        self.inputs = Inputs(log, self.sessions, harness_names=self.harnesses, now_ms=now_ms)
        self.streams: set[asyncio.Queue[Any]] = set()
        self.stopping = asyncio.Event()
        """Set when the server begins to stop: every ``?wait`` answers ``running`` at once (``waits``)."""
        self.stream_slots = TenantSlots(settings.max_streams_per_tenant)
        self.wait_slots = TenantSlots(settings.max_waits_per_tenant)
        # --rate-limit: a burst of twice the rate (at least one request) per caller.
        self.rate_limits = (TokenBuckets(rate=settings.rate_limit, burst=max(1.0, 2 * settings.rate_limit),
                                         clock=clock) if settings.rate_limit > 0 else None)
        # --auth-failure-limit: failed authentications per client address, checked before them.
        self.auth_failures = (AuthFailureLimit(settings.auth_failure_limit, clock=clock)
                              if settings.auth_failure_limit > 0 else None)
        # A listing reads only what was appended since the previous one (on Kafka: per
        # partition, the first time from its latest checkpoint).
        self._index = KafkaSessionIndex(log) if hasattr(log, "scan_partition") else SessionIndex(log)
        self.unreadable: set[str] = set()
        """Sessions a read found an unreadable record of: their view says so (``unreadable``),
        never what the readable rest would seem to say (a record stays unreadable until it
        is repaired; a repaired one is shown so after a restart)."""
        self.ready = False
        self.not_ready: str | None = "not started"
        self.warming: asyncio.Task[None] | None = None
        """The first listing, started once the log answers (see :meth:`warm`)."""
        self._stopped = False

    async def read(self, session_id: str, *, after: int | None = None) -> list[LogEntry]:
        """The session's committed records after ``after`` (all if None), read-only."""
        entries, unreadable = await self.breaker.call(lambda: scan_session(self.log, session_id, after=after))
        if unreadable:
            self.unreadable.add(session_id)
        return entries

    def follow(self, session_id: str, *, after: int | None = None) -> AsyncGenerator[LogEntry, None]:
        """The session's committed records after ``after`` (all if None), live, read-only."""
        return subscribe(self.log, session_id, after=after, dead_letter=False)

    async def list_sessions(self) -> list[SessionSummary]:
        """Every session of the log (every tenant's), most recently active first."""
        index = self._index
        return sort_summaries(await self.breaker.call(lambda: index.summaries(now_ms=self.now_ms())))

    def warm(self) -> None:
        """Start the index's first listing now, in the background: on a big Kafka log it
        reads every partition's checkpoint and tail (seconds at 100k sessions), which the
        first ``GET /v1/sessions`` would otherwise wait for. A request that comes while it
        runs waits for it and reads only what came after. A failure (the log is down) is
        logged in one line; the next listing tries again."""
        if self.warming is None and self.ready and not self._stopped:
            self.warming = asyncio.ensure_future(self._warm())

    async def _warm(self) -> None:
        started = time.monotonic()
        try:
            sessions = await self._index.summaries(now_ms=self.now_ms())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - logged; the next listing reads again
            log.warning("gateway: the first listing of the sessions failed (%s); the next one reads again",
                        " ".join(str(exc).split()) or type(exc).__name__)
            return
        count = len(sessions)
        log.info("gateway: %d %s indexed in %.1f s", count, "session" if count == 1 else "sessions",
                 time.monotonic() - started)

    async def stop_warming(self) -> None:
        self._stopped = True
        if self.warming is not None and not self.warming.done():
            self.warming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.warming

    def log_id(self, principal: Principal, session_id: str) -> str:
        return tenant_session_id(principal.tenant, session_id)

    def owns(self, principal: Principal, log_session_id: str) -> str | None:
        """The caller's own id of a log session, or None if it is not the caller's."""
        tenant, session_id = split_tenant_session_id(log_session_id)
        return session_id if tenant == principal.tenant else None

    def register_stream(self, queue: asyncio.Queue[Any]) -> Callable[[], None]:
        self.streams.add(queue)
        self.metrics.sse_subscribers(1)

        def unregister() -> None:
            if queue in self.streams:
                self.streams.discard(queue)
                self.metrics.sse_subscribers(-1)

        return unregister

    def begin_shutdown(self) -> None:
        """The server stops: open ``?wait`` requests answer now and SSE streams end, so that
        no request holds the shutdown (and, in ``harness serve``, the worker's drain) up."""
        self.stopping.set()
        self.close_streams()

    def close_streams(self) -> None:
        for queue in list(self.streams):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(("close", None))

    async def check_ready(self) -> bool:
        """Whether the log answers (on Kafka: the broker answers now and the sessions topic
        exists); ``not_ready`` says why not."""
        start = getattr(self.log, "start", None)
        reachable = getattr(self.log, "check_reachable", None)  # Kafka: the broker answers now
        try:
            if start is not None:
                await asyncio.wait_for(start(), READY_TIMEOUT_S)
            if reachable is not None:
                await reachable(READY_TIMEOUT_S)
            self.ready, self.not_ready = True, None
            self.breaker.close()
            self.warm()
        except LogError as exc:  # TopicNotFound says which topic and how to make it
            self.ready, self.not_ready = False, " ".join(str(exc).split())
        except (TimeoutError, OSError) as exc:
            self.ready = False
            self.not_ready = f"the session log did not answer within {READY_TIMEOUT_S:.0f} s ({type(exc).__name__})"
        return self.ready

    async def _probe(self) -> None:
        """The breaker's question: raises unless the log answers now."""
        if not await self.check_ready():
            raise LogUnavailable(self.not_ready or "not ready")


def console_dir() -> Any:
    """The web console's static files, shipped in the package."""
    return resources.files("harness.services.gateway") / "console"
