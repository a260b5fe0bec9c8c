"""The HTTP gateway and web console (``harness gateway``, ``harness serve``).

A stateless HTTP service over the session log: ``create_app(settings)`` gives the
ASGI app (FastAPI). Needs the ``gateway`` extra: ``pip install 'durable-harness[gateway]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from harness.services.gateway.app import create_app as create_app
    from harness.services.gateway.settings import GatewaySettings as GatewaySettings

__all__ = ["GatewaySettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from harness.services.gateway.app import create_app

        return create_app
    if name == "GatewaySettings":
        from harness.services.gateway.settings import GatewaySettings

        return GatewaySettings
    raise AttributeError(name)
