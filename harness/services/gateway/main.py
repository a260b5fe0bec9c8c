"""``harness gateway`` and ``harness serve``: run the HTTP gateway (and, for serve, a worker).

    harness gateway --log kafka://broker:9092?topic_prefix=acme --jwks-file /etc/harness/jwks.json
    harness serve --log sqlite:///harness.db --app myapp.agents:assistant --open-access

``gateway`` is stateless: it appends inputs and reads committed records, never
drives a turn; run as many replicas as you like next to the workers. ``serve``
runs the gateway and a worker in one process: one command, one machine, a working
agent service. Either needs authentication (``--jwt-secret-file``, ``--jwks-file``
or ``--api-keys-file``) or an explicit ``--open-access`` (dev only). ``--jwt-issuer``,
``--jwt-audience`` and ``--tenant-claim`` apply to JWTs only, ``--secrets-recheck`` to auth
files (and serve's ``--secrets-dir``): given to a mode that ignores it, a flag stops the start
(exit 2), a variable is a warning line and ignored.

Bound to a loopback address (the default) it answers only the Host names ``localhost``,
``127.0.0.1`` and ``[::1]``, so a web page cannot reach it through DNS rebinding; bound
elsewhere, any Host; ``--allowed-hosts`` names them. ``--rate-limit N`` (off by default) lets
a tenant send N writes a second, bursts of 2N; more get 429 with Retry-After.
``--auth-failure-limit N`` (default 10; 0: off) lets a client address fail to authenticate N
times at once and a minute; past it its requests with credentials get 429 before they are
checked. The client address is the peer's, or, from a peer of ``--forwarded-allow-ips``
(default 127.0.0.1,::1), the one its X-Forwarded-For names: behind an ingress, name the
ingress's addresses, or every caller shares the ingress's address in both limits.

Every flag has an environment variable, read once at start: HARNESS_LOG,
HARNESS_APPS, HARNESS_GATEWAY_HOST, HARNESS_GATEWAY_PORT, HARNESS_METRICS_PORT,
HARNESS_JWT_SECRET_FILE, HARNESS_JWKS_FILE, HARNESS_JWT_ISSUER, HARNESS_JWT_AUDIENCE,
HARNESS_TENANT_CLAIM, HARNESS_API_KEYS_FILE, HARNESS_SECRETS_RECHECK_SECONDS, HARNESS_OPEN_ACCESS,
HARNESS_GATEWAY_MAX_BODY_BYTES, HARNESS_GATEWAY_HEARTBEAT_SECONDS,
HARNESS_GATEWAY_READ_TIMEOUT_SECONDS, HARNESS_GATEWAY_MAX_STREAMS_PER_TENANT,
HARNESS_GATEWAY_MAX_WAITS_PER_TENANT, HARNESS_GATEWAY_SESSION_CACHE_MB, HARNESS_GATEWAY_ALLOWED_HOSTS, HARNESS_GATEWAY_RATE_LIMIT,
HARNESS_GATEWAY_RATE_LIMIT_READS, HARNESS_GATEWAY_AUTH_FAILURE_LIMIT, HARNESS_GATEWAY_FORWARDED_ALLOW_IPS, and
HARNESS_KAFKA_CONFIG_<KEY> for the Kafka clients (as the worker reads them).
The worker of ``serve`` also takes ``--secrets-dir`` (HARNESS_SECRETS_DIR, and
HARNESS_SECRET_<NAME>), ``--max-sessions`` (HARNESS_MAX_SESSIONS) and ``--drain-timeout``
(HARNESS_DRAIN_TIMEOUT_SECONDS: on SIGTERM, running calls get that long to finish; a
second signal ends the drain), as ``harness worker`` does. Log lines: HARNESS_LOG_LEVEL (default warning) and
HARNESS_LOG_FORMAT (text or json), secrets scrubbed.

On Kafka ``harness gateway`` is a client of the log: it never creates a topic
(/readyz says which one is missing until a worker or ``harness topics create``
makes it). ``harness serve`` opens the log for its worker, which creates them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import signal
import socket
import sys
from collections.abc import Coroutine, Iterator, Sequence
from datetime import timedelta
from typing import Any

from harness.errors import ConfigError, HarnessError
from harness.gcpause import tune_for_service

__all__ = ["main", "serve_main"]

log = logging.getLogger("harness.gateway")

GRACEFUL_S = 5


async def run_gateway(settings: Any, *, worker: bool) -> int:
    """Serve until SIGTERM/SIGINT; with ``worker`` a Worker drives the sessions in this process."""
    try:
        import uvicorn
    except ImportError as exc:
        from harness.errors import MissingExtra

        raise MissingExtra("the HTTP gateway", "gateway") from exc
    from harness.live import LiveRouter, LiveSource
    from harness.services.gateway.app import create_app, default_live, new_sqlite_file, open_gateway_log
    from harness.services.worker.main import load_harnesses

    loop = asyncio.get_running_loop()
    # A stop signal before the server serves (while the apps load, the log opens, the
    # broker is probed) ends the start quietly, as a running server stops: without these
    # handlers asyncio's own cancelled the start wherever it was next suspended, inside
    # uvicorn's startup, which printed a traceback while the worker read a closed log.
    stopped_early = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped_early.set)
    harnesses = load_harnesses(settings.apps) if settings.apps else []
    secrets = None
    if worker:
        from harness.services.worker.secrets import WorkerSecrets

        secrets = WorkerSecrets(settings.secrets_dir, os.environ, recheck=settings.secrets_recheck_s)
    # The address first: a port in use is refused before anything (a new SQLite file) is made.
    listening = _listen(settings.host, settings.port)
    try:
        created = None if worker else new_sqlite_file(settings)
        log_ = open_gateway_log(settings, client=not worker)
    except BaseException:
        listening.close()
        raise
    try:
        await _unless_stopped(_check_the_cluster_answers(log_), stopped_early)
    except BaseException:
        listening.close()
        await log_.close()
        raise
    tune_for_service()  # (after the apps and the log are loaded: see harness.gcpause)
    live: LiveSource = default_live(log_)
    if worker and isinstance(live, LiveRouter):
        # No live topic (SQLite): the worker's sessions publish their deltas to the
        # gateway's streams in this process. On Kafka the worker publishes to the live
        # topic, which the gateway reads like any replica.
        in_process: LiveRouter | None = live
    else:
        in_process = None
    stop = asyncio.Event()
    worker_task: asyncio.Task[None] | None = None
    the_worker: Any = None

    async def on_startup(state: Any) -> None:
        nonlocal worker_task, the_worker
        if worker:
            from harness.runtime.worker import Worker

            assert secrets is not None
            the_worker = Worker(
                log=log_,
                harnesses=harnesses,
                lease=timedelta(seconds=30),
                secrets_for=secrets.hook,
                max_sessions=settings.max_sessions,
                drain_timeout=timedelta(seconds=settings.drain_timeout_s),
            )
            if in_process is not None:
                the_worker.host.live = in_process
            worker_task = asyncio.create_task(the_worker.run(stop), name="harness-serve-worker")

    async def on_shutdown(state: Any) -> None:
        stop.set()
        if worker_task is not None:
            await worker_task

    app = create_app(settings, log=log_, harnesses=harnesses, live=live, on_startup=on_startup,
                     on_shutdown=on_shutdown)
    gw = app.state.gateway
    metrics_server = None
    if settings.metrics_port is not None:
        from harness.services.gateway.metrics import start_metrics_server

        metrics_server = start_metrics_server(
            settings.metrics_port, lambda: (gw.ready, "ready" if gw.ready else f"not ready: {gw.not_ready}")
        )

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_S,
        proxy_headers=False,  # the app's own (middleware.ForwardedClient, --forwarded-allow-ips)
    )

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # our own handlers below: a clean SIGTERM exits 0, as the worker does

    server = Server(config)

    def on_signal() -> None:
        if server.should_exit and the_worker is not None:
            the_worker.hurry.set()  # a second signal: the worker's drain ends at once
        gw.begin_shutdown()  # open ?wait requests answer and SSE streams end: nothing holds the stop up
        server.should_exit = True

    if stopped_early.is_set():  # (no await since the last look: from here on_signal stops the server)
        if metrics_server is not None:
            metrics_server.close()
        listening.close()
        await log_.close()
        return 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.02)
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        if worker and the_worker is not None:
            await the_worker.ready.wait()
        what = "serve" if worker else "gateway"
        if created is not None:
            log.warning("there was no SQLite log at %s: this gateway made an empty one; sessions move only while a "
                        "worker runs on the same file ('harness worker --log %s ...', or 'harness serve')",
                        created, settings.log)
        if not worker and not gw.ready:
            # (its startup asked: a gateway may start before the workers make the Kafka topics, but a
            # mistyped topic prefix would serve nothing but 503s after "gateway ready" without a word)
            log.warning("%s; /readyz and the API answer 503 until it does", gw.not_ready)
        if ":" in host:  # an IPv6 address goes in brackets in a URL (http://[::1]:8080)
            host = f"[{host}]"
        print(f"{what} ready url=http://{host}:{port} console=http://{host}:{port}/", flush=True)

    announcer = asyncio.create_task(announce())
    try:
        await server.serve(sockets=[listening])
    finally:
        announcer.cancel()
        if metrics_server is not None:
            metrics_server.close()
        await log_.close()
    from harness.services.lingering import exit_if_reads_linger, exit_if_sync_calls_linger

    if the_worker is not None:
        exit_if_sync_calls_linger(the_worker.host, 0)  # (sync code the stop cut: not waited for)
    exit_if_reads_linger(log_, 0)  # (reads waiting for a broker that is down: not waited for)
    return 0


async def _check_the_cluster_answers(log_: Any) -> None:
    """On Kafka, a broker that does not answer (a wrong address or port) is one line at
    start, as for the worker and the CLI, not a gateway that serves and times out."""
    settings = getattr(log_, "settings", None)
    if settings is None or not hasattr(log_, "check_reachable"):
        return
    from harness.cli.common import PROBE_TIMEOUT_S
    from harness.log.kafka.own_thread import on_own_thread
    from harness.log.kafka.topics import probe

    try:  # (a thread of its own: a Ctrl-C does not wait for the probe to give up)
        await on_own_thread(functools.partial(probe, settings, timeout=PROBE_TIMEOUT_S))
    except ValueError as exc:
        raise ConfigError(f"{exc} (check the HARNESS_KAFKA_CONFIG_* variables)", setting="--log") from exc


async def _unless_stopped(work: Coroutine[Any, Any, None], stopped: asyncio.Event) -> None:
    """``await work``, or stop waiting for it once ``stopped`` is set."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        task.result()


def _listen(host: str, port: int) -> socket.socket:
    """The bound listening socket (uvicorn's own bind printed its error and exited 3).

    Raises:
        ConfigError: the address is taken or cannot be bound here.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        why = "is in use (another gateway?)" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
        raise ConfigError(f"{host}:{port} {why}: give another --port (or --host)", setting="--port") from None
    sock.set_inheritable(True)
    return sock


def _run(settings: Any, *, worker: bool, debug: bool = False) -> int:
    from harness import logs

    prog = f"harness {'serve' if worker else 'gateway'}"
    level, fmt = os.environ.get("HARNESS_LOG_LEVEL") or "warning", os.environ.get("HARNESS_LOG_FORMAT") or "text"
    for name, check in (("HARNESS_LOG_LEVEL", lambda: logs.parse_level(level)),
                        ("HARNESS_LOG_FORMAT", lambda: logs.configure(level=level, fmt=fmt))):
        try:  # lines with context fields and every secret scrubbed, as the worker's
            check()
        except ValueError as exc:
            print(f"{prog}: {name}: {exc}", file=sys.stderr)
            return 2
    try:
        return asyncio.run(run_gateway(settings, worker=worker))
    except HarnessError as exc:
        if debug:
            raise
        print(f"{prog}: {exc}", file=sys.stderr)
        from harness.services.gateway.auth import GatewayConfigError

        # (as every command: 2 for what is set wrong, 1 for what went wrong at run time)
        return 2 if isinstance(exc, (ConfigError, GatewayConfigError)) else 1
    except KeyboardInterrupt:
        return 0


def _settings(argv: Sequence[str] | None, prog: str, description: str | None, *, need_apps: bool) -> Any:
    import argparse

    from harness.services.gateway.settings import parse_settings

    try:
        settings = parse_settings(argv, os.environ, prog=prog, description=description, worker=need_apps)
    except (ValueError, argparse.ArgumentTypeError) as exc:  # a bad value in the environment
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if need_apps and not settings.apps:
        print(f"{prog}: at least one --app module:attribute is required (or HARNESS_APPS)", file=sys.stderr)
        raise SystemExit(2)
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    """``harness gateway``."""
    settings = _settings(argv, "harness gateway", __doc__, need_apps=False)
    return _run(settings, worker=False)


def serve_main(argv: Sequence[str] | None = None) -> int:
    """``harness serve``: the gateway and a worker in one process."""
    settings = _settings(argv, "harness serve", __doc__, need_apps=True)
    return _run(settings, worker=True)


if __name__ == "__main__":
    raise SystemExit(main())
