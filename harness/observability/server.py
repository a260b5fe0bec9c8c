"""A small HTTP server on its own port: ``/metrics``, ``/healthz`` (alive), ``/readyz``.

It runs on a daemon thread (``ThreadingHTTPServer``), so a busy or blocked event
loop cannot hide the process from Prometheus. The health callbacks run on that
thread too: they must only read state the loop published (no I/O, no locks held
by the loop for long).
"""

from __future__ import annotations

import errno
import logging
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from harness.errors import ConfigError

__all__ = ["Check", "MetricsServer", "QuietHTTPServer"]

log = logging.getLogger("harness.observability")

Check = Callable[[], tuple[bool, str]]
"""A health check: ``(ok, one line saying why)``."""


def _always_ok() -> tuple[bool, str]:
    return True, "ok"


class QuietHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` whose handler errors go to logging, not to stderr.

    ``socketserver`` prints "Exception occurred during processing of request" and a
    traceback on stderr for every failed request, past the process's log format (JSON
    lines) and level. A client that went away mid-reply (a scrape or probe timing out)
    is normal and says nothing; anything else is one warning line.
    """

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        log.warning("HTTP request from %s failed: %s: %s", client_address[0], type(exc).__name__, exc)


class MetricsServer:
    """Serves a registry and two health checks on ``host:port`` (port 0: any free port).

    Args:
        registry: the ``CollectorRegistry`` behind ``/metrics`` (``None``: 404).
        alive: ``/healthz``: the process is not wedged (restart it otherwise).
        ready: ``/readyz``: it does its job now (e.g. broker reachable, partitions taken up).
    """

    def __init__(
        self,
        *,
        port: int,
        host: str = "0.0.0.0",  # a pod's probes and scrapes come from outside
        registry: Any = None,
        alive: Check | None = None,
        ready: Check | None = None,
    ) -> None:
        self._registry = registry
        self._alive = alive or _always_ok
        self._ready = ready or _always_ok
        try:
            self._httpd = QuietHTTPServer((host, port), self._handler())
        except OSError as exc:
            why = "is in use (another worker?)" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
            raise ConfigError(f"metrics port {host}:{port} {why}: give another --metrics-port",
                              setting="--metrics-port") from None
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="harness-metrics", daemon=True)
        self._scraped = threading.Condition()
        self._scrapes: list[float] = []  # time.monotonic() of the last two /metrics answers

    def wait_for_scrape(self, after: float, *, at_most: float = 30.0) -> bool:
        """Wait until ``/metrics`` was answered after ``after`` (a ``time.monotonic()``), for
        at most one and a half of the interval seen between the last two scrapes (plus 1 s)
        and never above ``at_most``; True if it was. Not scraped twice yet: no wait (False).

        A process that counts something just before it exits (a SIGTERM's drain cut) is
        gone before the next scrape: without this, Prometheus never sees that count and
        the alert on it never fires."""
        with self._scraped:
            if len(self._scrapes) < 2:
                return bool(self._scrapes) and self._scrapes[-1] > after
            interval = self._scrapes[-1] - self._scrapes[-2]
            return self._scraped.wait_for(lambda: self._scrapes[-1] > after,
                                          timeout=min(at_most, 1.5 * interval + 1.0))

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics" and server._registry is not None:
                    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

                    self._reply(200, generate_latest(server._registry), CONTENT_TYPE_LATEST)
                    with server._scraped:
                        server._scrapes = [*server._scrapes[-1:], time.monotonic()]
                        server._scraped.notify_all()
                elif path in ("/healthz", "/livez"):
                    self._check(server._alive)
                elif path == "/readyz":
                    self._check(server._ready)
                else:
                    self._reply(404, b"not found: try /metrics, /healthz or /readyz\n")

            def _check(self, check: Check) -> None:
                try:
                    ok, why = check()
                except Exception as exc:  # noqa: BLE001 - a failing check means not healthy
                    ok, why = False, f"check failed: {type(exc).__name__}: {exc}"
                self._reply(200 if ok else 503, (why + "\n").encode())

            def _reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
                pass  # scrapes and probes every few seconds: not worth a log line

        return Handler
