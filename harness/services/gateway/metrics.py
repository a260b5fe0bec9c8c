"""The gateway's metrics hook: HTTP requests and SSE subscribers.

Events go to the library's metrics facade (``harness.observability.metrics``:
``http_request(route, method, status, seconds)`` and ``sse_subscribers(delta)``)
when that package is present; otherwise they are dropped. Routes are templates
(``/v1/sessions/{session_id}``), never paths, so a session id is never a label.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

__all__ = ["GatewayMetrics", "gateway_metrics"]


class GatewayMetrics(Protocol):
    def http_request(self, route: str, method: str, status: int, seconds: float) -> None: ...

    def sse_subscribers(self, delta: int) -> None: ...


class _Off:
    def http_request(self, route: str, method: str, status: int, seconds: float) -> None:
        return None

    def sse_subscribers(self, delta: int) -> None:
        return None


def gateway_metrics() -> GatewayMetrics:
    """The facade if the library has one, else a sink that drops everything."""
    try:
        module: Any = importlib.import_module("harness.observability")
    except ImportError:
        return _Off()
    facade: GatewayMetrics = module.metrics
    return facade


def start_metrics_server(port: int, ready: Any) -> Any:
    """Serve ``/metrics`` on ``port`` through the library's metrics server.

    Raises:
        GatewayConfigError: the library has no metrics server (no ``harness.observability``).
    """
    try:
        module: Any = importlib.import_module("harness.observability")
    except ImportError as exc:
        from harness.services.gateway.auth import GatewayConfigError

        raise GatewayConfigError(
            "--metrics-port needs harness.observability, which this build does not have; drop the flag"
        ) from exc
    sink = module.enable_metrics()
    return module.MetricsServer(port=port, registry=sink.registry, ready=ready).start()
