"""The gateway's ASGI app: ``create_app(settings, ...)`` -> a FastAPI application.

A stateless HTTP service over the session log: it appends inputs and reads
committed records; it never drives a turn (``harness serve`` runs a worker next to
it in the same process, as a separate component). Routes:

* ``POST /v1/sessions/{id}/messages|answers|records|cancel`` -> a receipt;
* ``GET /v1/sessions``, ``GET /v1/sessions/{id}``, ``GET /v1/sessions/{id}/events`` (SSE);
* ``GET /v1/harnesses``; ``GET /healthz``, ``GET /readyz``; the web console at ``/``.

Every session id in a URL is the caller's; the log's id is
``harness.ids.tenant_session_id(tenant, id)``, so a tenant only ever reaches its own
sessions, and a foreign id is a 404 like a missing one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from harness.definition import Harness
from harness.errors import MissingExtra
from harness.log import open_log
from harness.log.base import SessionLog
from harness.services.gateway.auth import Authenticator
from harness.services.gateway.metrics import GatewayMetrics, gateway_metrics
from harness.services.gateway.settings import GatewaySettings
from harness.services.gateway.sources import EventSource, SessionCatalog, default_sources
from harness.services.gateway.state import GatewayState

__all__ = ["GatewayState", "create_app"]

try:
    from fastapi import FastAPI
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise MissingExtra("the HTTP gateway", "gateway") from exc

from harness.services.gateway.routes import SafeJSONResponse, install_routes


def _now_ms() -> int:
    return int(time.time() * 1000)


def create_app(
    settings: GatewaySettings,
    *,
    log: SessionLog | None = None,
    harnesses: Sequence[Harness] = (),
    events: EventSource | None = None,
    catalog: SessionCatalog | None = None,
    now_ms: Callable[[], int] | None = None,
    metrics: GatewayMetrics | None = None,
    on_startup: Callable[[GatewayState], Awaitable[None]] | None = None,
    on_shutdown: Callable[[GatewayState], Awaitable[None]] | None = None,
) -> FastAPI:
    """The gateway as an ASGI app.

    Args:
        settings: see :class:`GatewaySettings`.
        log: the session log (default: ``open_log(settings.log)``, closed with the app).
        harnesses: harnesses known here (names and ask schemas; never driven by the gateway).
        events / catalog: the readers (default: :func:`sources.default_sources`).
        metrics: where HTTP requests and SSE subscribers are counted (default: the
            library's metrics facade when it is there).
        on_startup / on_shutdown: run inside the app's lifespan (``harness serve`` starts
            and stops its worker there).

    Raises:
        GatewayConfigError: no authentication and no ``open_access``; unreadable key files.
    """
    auth = Authenticator(settings)  # config errors surface now, not at the first request
    owns_log = log is None
    the_log = log if log is not None else open_log(settings.log)
    default_events, default_catalog = default_sources(the_log)
    state = GatewayState(
        settings=settings,
        log=the_log,
        owns_log=owns_log,
        events=events or default_events,
        catalog=catalog or default_catalog,
        harnesses=harnesses,
        auth=auth,
        metrics=metrics or gateway_metrics(),
        now_ms=now_ms or _now_ms,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.check_ready()
        if on_startup is not None:
            await on_startup(state)
        try:
            yield
        finally:
            state.close_streams()
            if on_shutdown is not None:
                await on_shutdown(state)
            await state.events.close()
            if state.owns_log:
                await state.log.close()

    app = FastAPI(
        title="durable-harness gateway",
        version="1",
        description="Sessions of durable agents over HTTP: send inputs, read state, stream events.",
        lifespan=lifespan,
        default_response_class=SafeJSONResponse,
    )
    app.state.gateway = state
    install_routes(app, state)
    return app

