"""Shared fixtures: the Kafka broker and unique names per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _docker_available() -> bool:
    """A Docker engine answers on its socket (checked without the docker library,
    which leaves its socket open when no engine runs)."""
    import socket

    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return True  # a remote engine: let testcontainers try it
    path = host[len("unix://"):]
    if not os.path.exists(path):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            return b"OK" in sock.recv(1024)
        except OSError:
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
    except Exception as exc:  # noqa: BLE001 - any failure to start: fail in CI, skip locally
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
