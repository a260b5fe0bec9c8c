"""Shared fixtures: the Kafka broker and unique names per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _docker_available() -> bool:
    try:
        import docker  # type: ignore[import-not-found]

        docker.from_env().ping()
        return True
    except Exception:  # noqa: BLE001 - no engine, no client library: not available
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A real Kafka broker for the whole run.

    HARNESS_KAFKA_BOOTSTRAP if set; else testcontainers when a Docker engine
    answers; else the project's own launcher. In CI, no broker FAILS the run.
    """
    given = os.environ.get("HARNESS_KAFKA_BOOTSTRAP")
    if given:
        yield given
        return
    if _docker_available():
        try:
            from testcontainers.kafka import KafkaContainer  # type: ignore[import-not-found]

            with KafkaContainer().with_kraft() as container:
                yield container.get_bootstrap_server()
            return
        except ImportError:
            pass
    try:
        from harness.testing.kafka_local import LocalKafka

        broker = LocalKafka()
        broker.start()
        broker.warm_up_transactions()
    except Exception as exc:
        if IN_CI:
            pytest.fail(f"no Kafka broker could be started in CI: {exc}", pytrace=False)
        pytest.skip(f"no Kafka broker available: {exc}")
    try:
        yield broker.bootstrap
    finally:
        broker.close()


@pytest.fixture
def unique_prefix() -> str:
    """A topic prefix (and group id stem) of this test alone."""
    return f"t{uuid.uuid4().hex[:10]}"
