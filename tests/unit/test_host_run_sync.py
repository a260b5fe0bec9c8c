"""``HarnessHost.run_sync``: a sync call runs on the host's thread pool; a loop with
nothing else ready waits a moment for a quick one (``QUICK_SYNC_S``) instead of being
woken for it, and never while a task is ready."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from harness import HarnessHost
from harness.runtime import host as host_module


@pytest.fixture
def wraps(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The calls awaited through ``asyncio.wrap_future`` (the slow way back to the loop)."""
    seen: list[Any] = []
    real = asyncio.wrap_future

    def counting(future: Any, **kw: Any) -> Any:
        seen.append(future)
        return real(future, **kw)

    monkeypatch.setattr(host_module.asyncio, "wrap_future", counting)
    monkeypatch.setattr(host_module, "QUICK_SYNC_S", 5.0)  # (so "quick" does not depend on the machine)
    return seen


async def test_a_quick_call_on_an_idle_loop_comes_back_without_waking_the_loop(wraps: list[Any]) -> None:
    host = HarnessHost(log="memory://")
    try:
        threads: list[threading.Thread] = []

        def call() -> dict[str, int]:
            threads.append(threading.current_thread())
            return {"n": 1}

        assert await host.run_sync(call) == {"n": 1}
        assert threads[0] is not threading.current_thread()  # (still on the pool)
        assert wraps == []

        def fails() -> None:
            raise ValueError("bad input")

        with pytest.raises(ValueError, match="bad input"):
            await host.run_sync(fails)
        assert wraps == []
    finally:
        await host.close()


async def test_with_a_task_ready_the_loop_does_not_wait(wraps: list[Any]) -> None:
    host = HarnessHost(log="memory://")
    try:
        ran: list[str] = []
        asyncio.get_running_loop().call_soon(ran.append, "other")  # ready: it runs before the call ends
        assert await host.run_sync(lambda: "value") == "value"
        assert len(wraps) == 1 and ran == ["other"]
    finally:
        await host.close()


async def test_a_call_still_running_after_the_wait_is_awaited_with_the_loop_free(
    monkeypatch: pytest.MonkeyPatch, wraps: list[Any]
) -> None:
    """A call that blocks until the loop does something (a timer sets its event): the loop
    waits no longer than ``QUICK_SYNC_S``, then runs its timer (else this would never end)."""
    monkeypatch.setattr(host_module, "QUICK_SYNC_S", 0.0003)
    host = HarnessHost(log="memory://")
    try:
        released = threading.Event()

        def blocked() -> str:
            return "done" if released.wait(timeout=30) else "the loop never ran"

        asyncio.get_running_loop().call_later(0.01, released.set)
        assert await host.run_sync(blocked) == "done"
        assert len(wraps) == 1  # (awaited, after the wait)
    finally:
        await host.close()
