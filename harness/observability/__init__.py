"""Prometheus metrics and health endpoints of the harness's processes.

::

    from harness.observability import metrics          # the facade: free while off
    metrics.step("acme/assistant", "ran", 0.012)        # a no-op until enabled

    sink = enable_metrics()                             # imports prometheus_client
    server = MetricsServer(port=9464, registry=sink.registry, ready=worker_ready).start()

Only the facade (:mod:`harness.observability.facade`) is imported by the runtime;
the Prometheus sink and the HTTP server are loaded on first use, so an embedded
user who never enables metrics pays one attribute test per event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.observability.facade import Metrics, Observation, ObservationSource, metrics

if TYPE_CHECKING:  # pragma: no cover
    from harness.observability.prometheus import PrometheusSink
    from harness.observability.server import MetricsServer

__all__ = [
    "Metrics",
    "MetricsServer",
    "Observation",
    "ObservationSource",
    "PrometheusSink",
    "disable_metrics",
    "enable_metrics",
    "metrics",
]


def enable_metrics() -> PrometheusSink:
    """Send the facade's events to a new Prometheus sink on a private registry; returns it.

    Also turns off prometheus_client's ``*_created`` series (process-wide): they double
    the series count and no dashboard or alert of ours uses them.

    Raises:
        MissingExtra: ``prometheus-client`` is not installed (the ``metrics`` extra).
    """
    import importlib.util

    if importlib.util.find_spec("prometheus_client") is None:
        from harness.errors import MissingExtra

        raise MissingExtra("Prometheus metrics", "metrics")
    import prometheus_client

    from harness.observability.prometheus import PrometheusSink

    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

    sink = PrometheusSink()
    metrics.plug(sink)
    return sink


def disable_metrics() -> None:
    """Metrics off again: the facade drops every event."""
    metrics.plug(None)


def __getattr__(name: str) -> Any:
    if name == "PrometheusSink":
        from harness.observability.prometheus import PrometheusSink

        return PrometheusSink
    if name == "MetricsServer":
        from harness.observability.server import MetricsServer

        return MetricsServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
