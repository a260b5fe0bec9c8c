"""What the gateway's routes share: the log, the readers, auth, the known harnesses."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

from harness.definition import Harness
from harness.errors import LogError
from harness.ids import split_tenant_session_id, tenant_session_id
from harness.log.base import SessionLog
from harness.services.gateway.auth import Authenticator, Principal
from harness.services.gateway.inputs import Inputs
from harness.services.gateway.metrics import GatewayMetrics
from harness.services.gateway.settings import GatewaySettings
from harness.services.gateway.sources import EventSource, SessionCatalog

__all__ = ["GatewayState", "console_dir"]


class GatewayState:
    """What the routes share: the log, the readers, the auth, the harnesses known here."""

    def __init__(
        self,
        *,
        settings: GatewaySettings,
        log: SessionLog,
        owns_log: bool,
        events: EventSource,
        catalog: SessionCatalog,
        harnesses: Sequence[Harness],
        auth: Authenticator,
        metrics: GatewayMetrics,
        now_ms: Callable[[], int],
    ) -> None:
        self.settings = settings
        self.log = log
        self.owns_log = owns_log
        self.events = events
        self.catalog = catalog
        self.harnesses = {h.name: h for h in harnesses}
        self.auth = auth
        self.metrics = metrics
        self.now_ms = now_ms
        self.inputs = Inputs(log, catalog, harness_names=self.harnesses, now_ms=now_ms)
        self.streams: set[asyncio.Queue[Any]] = set()
        self.ready = False

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

    def close_streams(self) -> None:
        for queue in list(self.streams):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(("close", None))

    async def check_ready(self) -> bool:
        start = getattr(self.log, "start", None)
        try:
            if start is not None:
                await asyncio.wait_for(start(), 5)
            self.ready = True
        except (LogError, TimeoutError, OSError):
            self.ready = False
        return self.ready


def console_dir() -> Any:
    """The web console's static files, shipped in the package."""
    return resources.files("harness.services.gateway") / "console"
