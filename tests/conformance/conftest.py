"""Fixtures of the log conformance suite: one ``log_factory`` per backend.

To add a backend (e.g. Kafka), add its name to ``BACKENDS`` and a branch in
``log_factory`` that builds a factory from its own fixtures (a broker, a
per-test topic prefix). Every test in ``test_log_contract.py`` then runs on it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from harness.codec import default_codec
from harness.log.base import SessionLog

BACKENDS = ("memory", "sqlite", "kafka")

CAPABILITIES = {
    "memory": {"leases", "volatile"},
    "sqlite": {"leases", "persistent"},
    "kafka": {"persistent"},
}
"""What each backend can do; a test marked ``needs(...)`` runs only on the backends that
can (it is deselected, not skipped, elsewhere: a skip would look like a missing broker)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        marker = item.get_closest_marker("needs")
        backend = getattr(getattr(item, "callspec", None), "params", {}).get("log_factory")
        if marker is not None and backend is not None and not set(marker.args) <= CAPABILITIES[backend]:
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep



@pytest.fixture
def codec() -> Any:
    return default_codec()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@dataclass
class LogFactory:
    """Opens logs of one backend. Every call of a persistent backend opens the SAME store."""

    name: str
    open: Callable[..., SessionLog]
    persistent: bool  # a new call sees what earlier logs wrote (reopen)
    has_leases: bool  # claims are refused with SessionBusy while a lease is live
    opened: list[SessionLog] = field(default_factory=list)

    def __call__(self, **options: Any) -> SessionLog:
        log = self.open(**options)
        self.opened.append(log)
        return log


@pytest_asyncio.fixture(params=[pytest.param(b, marks=pytest.mark.kafka) if b == "kafka" else b for b in BACKENDS])
async def log_factory(request: pytest.FixtureRequest, tmp_path: Path, codec: Any) -> AsyncIterator[LogFactory]:
    name = request.param
    if name == "memory":
        from harness.log.memory import MemoryLog

        factory = LogFactory(name, lambda **kw: MemoryLog(codec=codec, **kw), persistent=False, has_leases=True)
    elif name == "sqlite":
        from harness.log.sqlite import SqliteLog

        path = tmp_path / f"log-{uuid.uuid4().hex[:8]}.db"
        factory = LogFactory(name, lambda **kw: SqliteLog(path, codec=codec, **kw), persistent=True, has_leases=True)
    elif name == "kafka":
        from harness.log.kafka.log import KafkaLog

        # One partition: seqs are then comparable across sessions, as the contract's
        # "one log" tests expect. The factory drops clock=: Kafka has no leases. Its
        # record limit (max_record_bytes= on the other backends) is the clients'
        # message.max.bytes, which counts a record's key and headers too.
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        prefix = f"conf-{uuid.uuid4().hex[:10]}"

        def kafka_log(**kw: Any) -> SessionLog:
            limit = kw.get("max_record_bytes")
            return KafkaLog(
                bootstrap=bootstrap, topic_prefix=prefix, partitions=1, codec=kw.get("codec", codec),
                client_config=None if limit is None else {"message.max.bytes": limit},
            )

        factory = LogFactory(
            name,
            kafka_log,
            persistent=True,
            has_leases=False,
        )
    else:  # pragma: no cover - a new backend must add its branch here
        raise AssertionError(f"no factory for backend {name!r}")
    yield factory
    for log in factory.opened:
        await log.close()


@pytest_asyncio.fixture
async def log(log_factory: LogFactory, clock: FakeClock) -> SessionLog:
    """One log of the backend under test, on the fake clock."""
    return log_factory(clock=clock)
