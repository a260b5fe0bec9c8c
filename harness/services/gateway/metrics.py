"""The gateway's metrics: HTTP requests, SSE subscribers and rate-limit refusals, through the
library's facade.

Events go to ``harness.observability.metrics`` (``http_request(route, method, status,
seconds)``, ``sse_subscribers(delta)`` and ``rate_limited(reason)``, counted as
``harness_http_rate_limited_total{reason="rate_limit"|"auth_failures"}``; never by tenant nor address): free until ``--metrics-port`` enables the
Prometheus sink. Routes are templates (``/v1/sessions/{session_id}``), never paths, so a
session id is never a label (the facade also caps a label's distinct values).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from harness.observability import MetricsServer, enable_metrics, metrics

__all__ = ["GatewayMetrics", "gateway_metrics", "start_metrics_server"]


class GatewayMetrics(Protocol):
    def http_request(self, route: str, method: str, status: int, seconds: float) -> None: ...

    def sse_subscribers(self, delta: int) -> None: ...

    def rate_limited(self, reason: str) -> None: ...


def gateway_metrics() -> GatewayMetrics:
    """The library's metrics facade (a no-op until metrics are enabled)."""
    return metrics


def start_metrics_server(port: int, ready: Callable[[], tuple[bool, str]]) -> MetricsServer:
    """Enable the Prometheus sink and serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``port``
    (``ready() -> (ok, one line saying why)``, as ``harness.observability.MetricsServer`` takes it).

    Raises:
        MissingExtra: prometheus_client is not installed (the ``metrics`` extra).
    """
    sink = enable_metrics()
    return MetricsServer(port=port, registry=sink.registry, ready=ready).start()
