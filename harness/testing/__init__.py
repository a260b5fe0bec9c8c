"""Test-support utilities for harness (real local services for tests/CI)."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["KAFKA_VERSION", "LocalKafka", "ensure_jars"]

if TYPE_CHECKING:  # pragma: no cover
    from harness.testing.kafka_local import KAFKA_VERSION, LocalKafka, ensure_jars


def __getattr__(name: str) -> object:
    # Lazy so `import harness.testing` stays cheap.
    if name in ("KAFKA_VERSION", "LocalKafka", "ensure_jars"):
        from harness.testing import kafka_local

        return getattr(kafka_local, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
