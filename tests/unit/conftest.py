"""Helpers of the SPEC tests: a log on every embedded backend, a fake clock, hosts, a fake provider.

``log`` is parametrized over ``memory`` and ``sqlite`` (a file under tmp_path);
``other_log()`` opens a second handle on the SAME store, as another process
would (for ``memory:`` that is the same object: it lives in this process).
Time only moves when a test says so (``FakeClock``): leases, sleeps and
expiries never wait for the wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pydantic import BaseModel

from harness import FakeClock, HarnessHost, Session, open_log
from harness.log.base import SessionLog
from harness.models import ModelResponse, ScriptedModel, ToolCall

LEASE = timedelta(seconds=30)
POLL = timedelta(milliseconds=2)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


class Logs:
    """Opens handles on one store of one backend; closes them all at the end."""

    def __init__(self, backend: str, path: Path, clock: FakeClock) -> None:
        self.backend = backend
        self.path = path
        self.clock = clock
        self.opened: list[SessionLog] = []
        self._memory: SessionLog | None = None

    def open(self) -> SessionLog:
        if self.backend == "memory":
            if self._memory is None:
                self._memory = open_log("memory:", clock=self.clock.now)
                self.opened.append(self._memory)
            return self._memory
        log = open_log(f"sqlite:///{self.path}", clock=self.clock.now)
        self.opened.append(log)
        return log

    async def close(self) -> None:
        for log in self.opened:
            with contextlib.suppress(Exception):
                await log.close()


@pytest_asyncio.fixture(params=["memory", "sqlite"])
async def logs(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> AsyncIterator[Logs]:
    handle = Logs(request.param, tmp_path / "harness.db", clock)
    yield handle
    await handle.close()


@pytest.fixture
def log(logs: Logs) -> SessionLog:
    return logs.open()


@pytest.fixture
def other_log(logs: Logs) -> Callable[[], SessionLog]:
    """A second handle on the same store (another process on SQLite)."""
    return logs.open


@pytest_asyncio.fixture
async def hosts(log: SessionLog, clock: FakeClock) -> AsyncIterator[Callable[..., HarnessHost]]:
    """``hosts(log=None, owner_id=None)``: a host on the fake clock; all closed at the end."""
    made: list[HarnessHost] = []

    def make(log_: SessionLog | None = None, owner_id: str | None = None, lease: timedelta = LEASE) -> HarnessHost:
        host = HarnessHost(log=log_ or log, clock=clock, lease=lease, owner_id=owner_id, poll_interval=POLL)
        made.append(host)
        return host

    yield make
    for host in made:
        await host.close()


@pytest.fixture
def host(hosts: Callable[..., HarnessHost]) -> HarnessHost:
    return hosts(owner_id="host-1")


class PaymentProvider:
    """A payment provider that counts calls and refuses a repeated idempotency key."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.charges: dict[str, dict[str, Any]] = {}

    def charge(self, order_id: str, *, idempotency_key: str) -> dict[str, Any]:
        self.calls.append(idempotency_key)
        if idempotency_key in self.charges:
            raise RuntimeError(f"idempotency key {idempotency_key!r} was already used")
        payment = {"id": f"ch_{len(self.charges) + 1}", "order": order_id}
        self.charges[idempotency_key] = payment
        return payment


@pytest.fixture
def provider() -> PaymentProvider:
    return PaymentProvider()


class Args(BaseModel):
    """Arguments of most test tools."""

    order_id: str = "42"


def call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def script(*batches: list[ToolCall] | str) -> ScriptedModel:
    """A scripted model: a list of calls is one response with those calls; a str is a final text."""
    return ScriptedModel(
        [ModelResponse(text=b) if isinstance(b, str) else ModelResponse(tool_calls=list(b)) for b in batches]
    )


async def eventually(check: Callable[[], Any], *, tries: int = 2000) -> Any:
    """Yield to the loop until ``check()`` is truthy (bounded; never a timed wait)."""
    for i in range(tries):
        out = check()
        if isinstance(out, Awaitable):
            out = await out
        if out:
            return out
        await asyncio.sleep(0.001 if i % 20 == 19 else 0)
    raise AssertionError("condition never became true")


async def types(log: SessionLog, session_id: str) -> list[str]:
    return [e.type for e in await log.read(session_id)]


async def entries(log: SessionLog, session_id: str, type_: str) -> list[dict[str, Any]]:
    return [e.data for e in await log.read(session_id) if e.type == type_]


class Died(BaseException):
    """The process died here (nothing after this point happened)."""


class DyingLog:
    """A log handle whose writer dies (raises ``Died``, writing nothing) on the first batch ``when`` picks."""

    def __init__(self, inner: SessionLog, when: Callable[[list[Any]], bool]) -> None:
        self._inner = inner
        self._when = when
        self.died = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def claim(self, session_id: str, *, owner: str, lease: timedelta) -> Any:
        return _DyingWriter(self, await self._inner.claim(session_id, owner=owner, lease=lease))


class _DyingWriter:
    def __init__(self, log: DyingLog, inner: Any) -> None:
        self._log = log
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append(self, records: Any) -> Any:
        if not self._log.died and self._log._when(list(records)):
            self._log.died = True
            raise Died("the process died before this batch was committed")
        return await self._inner.append(records)


class CutLog(DyingLog):
    """A log handle whose writer lands the first batch holding a record ``at`` picks only
    up to that record, then dies (``Died``): the state a process of an earlier version,
    which appended those records apart, leaves when it dies between them."""

    def __init__(self, inner: SessionLog, at: Callable[[Any], bool]) -> None:
        super().__init__(inner, lambda batch: any(at(r) for r in batch))
        self._at = at

    async def claim(self, session_id: str, *, owner: str, lease: timedelta) -> Any:
        return _CutWriter(self, await self._inner.claim(session_id, owner=owner, lease=lease))


class _CutWriter(_DyingWriter):
    async def append(self, records: Any) -> Any:
        records = list(records)
        log = self._log
        assert isinstance(log, CutLog)
        if not log.died and log._when(records):
            log.died = True
            cut = next(i for i, r in enumerate(records) if log._at(r))
            if cut:
                await self._inner.append(records[:cut])
            raise Died("the process died between two appends")
        return await self._inner.append(records)


async def raw_bytes(log: SessionLog, logs: Logs) -> bytes:
    """Every byte the store holds (to look for secrets)."""
    if logs.backend == "memory":
        return b"".join(row.value + row.type.encode() for row in log._rows)  # type: ignore[attr-defined]
    out = b""
    for suffix in ("", "-wal"):
        p = Path(str(logs.path) + suffix)
        if p.exists():
            out += p.read_bytes()
    return out


async def crash(session: Session) -> None:
    """Kill a session's driving as a dying process would: nothing more is written, no release.

    Its lease stays until it runs out (advance the fake clock past ``LEASE``).
    """
    core = session._core
    session._closed = True
    core.closed = True
    core.host.unwatch(core)
    core.ownership.lost()  # no release: the lease stays until it runs out
    for task in (core._task, core._standby, core._refreshing, *core._side_tasks):
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    host_cores = getattr(core.host, "_cores", {})
    if host_cores.get(core.session_id) is core:
        del host_cores[core.session_id]
