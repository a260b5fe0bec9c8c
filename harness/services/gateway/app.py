"""The gateway's ASGI app: ``create_app(settings, ...)`` -> a FastAPI application.

A stateless HTTP service over the session log: it appends inputs and reads
committed records; it never drives a turn (``harness serve`` runs a worker next to
it in the same process, as a separate component). Routes:

* ``POST /v1/sessions/{id}/messages|answers|records|cancel`` -> a receipt;
* ``GET /v1/sessions``, ``GET /v1/sessions/{id}``, ``GET /v1/sessions/{id}/events`` (SSE);
* ``GET /v1/harnesses``; ``GET /healthz``, ``GET /readyz``; the web console at ``/``; the API
  reference at ``/docs`` (Swagger UI served offline: :mod:`~harness.services.gateway.apidocs`).

Every session id in a URL is the caller's; the log's id is
``harness.ids.tenant_session_id(tenant, id)``, so a tenant only ever reaches its own
sessions, and a foreign id is a 404 like a missing one.

Everything it shows comes from the library's shared parts: sessions are listed by
``harness.runtime.catalog.list_sessions`` and read by ``read_session``, shown with
``harness.views`` (as ``harness sessions`` / ``harness show`` do), and followed with
``harness.log.follow.subscribe``; live text deltas come from a ``harness.live``
source (:func:`default_live`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

from harness.definition import Harness
from harness.errors import ConfigError, MissingExtra
from harness.live import LiveRouter, LiveSource
from harness.log import open_log
from harness.log.base import SessionLog
from harness.services.gateway.auth import Authenticator
from harness.services.gateway.metrics import GatewayMetrics, gateway_metrics
from harness.services.gateway.settings import GatewaySettings
from harness.services.gateway.state import GatewayState, console_dir

__all__ = ["GatewayState", "create_app", "default_live", "new_sqlite_file", "open_gateway_log"]

try:
    from fastapi import FastAPI
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise MissingExtra("the HTTP gateway", "gateway") from exc

from harness.services.gateway.apidocs import install_docs
from harness.services.gateway.problems import SafeJSONResponse
from harness.services.gateway.routes import install_head, install_routes


def _now_ms() -> int:
    return int(time.time() * 1000)


def open_gateway_log(settings: GatewaySettings, *, client: bool = True) -> SessionLog:
    """The log of ``settings.log``, opened as the gateway uses it.

    On Kafka with ``client`` (``harness gateway``) the log never creates a topic: a
    missing sessions topic is ``TopicNotFound`` (``/readyz`` says so) until a worker or
    ``harness topics create`` makes it. ``harness serve`` opens it for its worker
    (``client=False``). ``settings.kafka_config`` goes to every Kafka client.
    """
    try:
        if settings.log.startswith("kafka://"):
            return open_log(settings.log, client_config=dict(settings.kafka_config), create_topics=not client)
        return open_log(settings.log)
    except ValueError as exc:  # a malformed URL (an unknown option ...): the caller's to fix
        raise ConfigError(str(exc), setting="--log") from exc


def new_sqlite_file(settings: GatewaySettings) -> Path | None:
    """The SQLite file ``settings.log`` names if it does not exist yet (opening it makes it).

    A gateway is not refused one: it may start before the worker that runs the file (as
    on Kafka, where ``/readyz`` waits for the topics). But a typo would serve an empty
    log that nobody runs, so ``harness gateway`` says so once it serves.
    """
    if not settings.log.startswith("sqlite:///"):
        return None
    path = Path(settings.log[len("sqlite:///"):].partition("?")[0])  # (before its options)
    return None if path.is_file() else path.resolve()


def default_live(log: SessionLog) -> LiveSource:
    """Where the gateway finds live text deltas for ``log``.

    Kafka: the ``<prefix>.live`` topic the workers publish to, one consumer per
    partition per gateway process. Other logs: nothing is published for other processes,
    so an empty router; ``harness serve`` gives its worker's router instead.
    """
    if hasattr(log, "own_partition") and hasattr(log, "settings"):
        from harness.live.kafka import KafkaLiveTails

        return KafkaLiveTails.for_log(log)
    return LiveRouter()


def create_app(
    settings: GatewaySettings,
    *,
    log: SessionLog | None = None,
    harnesses: Sequence[Harness] = (),
    live: LiveSource | None = None,
    now_ms: Callable[[], int] | None = None,
    clock: Callable[[], float] | None = None,
    metrics: GatewayMetrics | None = None,
    on_startup: Callable[[GatewayState], Awaitable[None]] | None = None,
    on_shutdown: Callable[[GatewayState], Awaitable[None]] | None = None,
) -> FastAPI:
    """The gateway as an ASGI app.

    Args:
        settings: see :class:`GatewaySettings`.
        log: the session log (default: :func:`open_gateway_log`, closed with the app).
        harnesses: harnesses known here (names and ask schemas; never driven by the gateway).
        live: where live text deltas come from (default: :func:`default_live`; closed
            with the app).
        clock: monotonic seconds for the rate limit's buckets (default ``time.monotonic``;
            tests pass their own).
        metrics: where HTTP requests and SSE subscribers are counted (default: the
            library's metrics facade when it is there).
        on_startup / on_shutdown: run inside the app's lifespan (``harness serve`` starts
            and stops its worker there).

    Raises:
        GatewayConfigError: no authentication and no ``open_access``; unreadable key files.
    """
    auth = Authenticator(settings, recheck=settings.secrets_recheck_s)  # config errors surface now, not at the first request
    owns_log = log is None
    the_log = log if log is not None else open_gateway_log(settings)
    state = GatewayState(
        settings=settings,
        log=the_log,
        owns_log=owns_log,
        live=live if live is not None else default_live(the_log),
        harnesses=harnesses,
        auth=auth,
        metrics=metrics or gateway_metrics(),
        now_ms=now_ms or _now_ms,
        clock=clock or time.monotonic,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.check_ready()  # once the log answers, the first listing starts (state.warm)
        if on_startup is not None:
            await on_startup(state)
        try:
            yield
        finally:
            await state.stop_warming()
            state.begin_shutdown()
            await state.breaker.stop()
            if on_shutdown is not None:
                await on_shutdown(state)
            await state.live.close()
            if state.owns_log:
                await state.log.close()

    app = FastAPI(
        title="durable-harness gateway",
        version="1",
        description="Sessions of durable agents over HTTP: send inputs, read state, stream events.",
        lifespan=lifespan,
        default_response_class=SafeJSONResponse,
        docs_url=None,  # FastAPI's pages load Swagger UI / ReDoc from a CDN: ours serves it (apidocs)
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
    )
    app.state.gateway = state
    install_routes(app, state)
    install_docs(app, console_dir())
    install_head(app)  # (last: on every GET route, the docs' too)
    return app

