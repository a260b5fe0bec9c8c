"""``HarnessHost.run_sync``: a sync call runs on the host's thread pool; a loop with
nothing else ready waits a moment for a quick one (``quick=True``: a sync step fn;
``QUICK_SYNC_S``) instead of being woken for it, never while a task is ready, and never
for a sync tool (its steps need the loop). A sync step fn is run so."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import pytest

from harness import HarnessHost
from harness.runtime import host as host_module

from .conftest import eventually


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

        assert await host.run_sync(call, quick=True) == {"n": 1}
        assert threads[0] is not threading.current_thread()  # (still on the pool)
        assert wraps == []

        def fails() -> None:
            raise ValueError("bad input")

        with pytest.raises(ValueError, match="bad input"):
            await host.run_sync(fails, quick=True)
        assert wraps == []
    finally:
        await host.close()


async def test_with_a_task_ready_the_loop_does_not_wait(wraps: list[Any]) -> None:
    host = HarnessHost(log="memory://")
    try:
        ran: list[str] = []
        asyncio.get_running_loop().call_soon(ran.append, "other")  # ready: it runs before the call ends
        assert await host.run_sync(lambda: "value", quick=True) == "value"
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
        assert await host.run_sync(blocked, quick=True) == "done"
        assert len(wraps) == 1  # (awaited, after the wait)
    finally:
        await host.close()


async def test_a_call_not_marked_quick_is_awaited_at_once(wraps: list[Any]) -> None:
    """A sync tool's call: the loop must stay free for the steps it sends back to it."""
    host = HarnessHost(log="memory://")
    try:
        assert await host.run_sync(lambda: "value") == "value"
        assert len(wraps) == 1
    finally:
        await host.close()


async def test_a_sync_step_fn_is_a_quick_call_and_a_sync_tools_steps_still_run(wraps: list[Any]) -> None:
    """Through a session: the sync step fn comes back without the loop's wake-up; a sync
    tool whose body runs steps (through the loop) is awaited, so its steps run."""
    from pydantic import BaseModel

    from harness import define_harness, durable_tool, tool, tool_definition
    from harness.models import ModelResponse, ScriptedModel, ToolCall

    class NoArgs(BaseModel):
        pass

    async def with_step(args: NoArgs, ctx: Any) -> Any:
        return await ctx.step.do("s1", lambda: {"n": 1})

    def sync_tool(args: NoArgs, ctx: Any) -> Any:
        return ctx.step.do("s2", lambda: {"n": 2})

    h = define_harness(
        name="test/quick",
        model=ScriptedModel([  # (one call at a time: two at once make a task ready, and no wait)
            ModelResponse(tool_calls=[ToolCall(id="c1", name="a", arguments={})]),
            ModelResponse(tool_calls=[ToolCall(id="c2", name="b", arguments={})]),
            ModelResponse(text="done"),
        ]),
        tools=[
            durable_tool(tool_definition(name="a", description="d", input_schema=NoArgs), with_step),
            tool(tool_definition(name="b", description="d", input_schema=NoArgs), sync_tool),
        ],
    )
    host = HarnessHost(log="memory://")
    try:
        session = await host.open(h, session_id="q-1")
        result = await session.send("go")
        assert result.outcome == "completed"
        assert len(wraps) == 1  # the sync tool's call only (its own step fn runs on its thread)
    finally:
        await host.close()


@pytest.mark.timeout(30)
async def test_sync_tools_waiting_for_a_person_or_a_sleep_do_not_starve_the_hosts_other_sync_code() -> None:
    """A sync tool in ``ctx.step.ask`` / ``ctx.step.sleep`` blocks its pool thread for the
    whole wait (hours, days): with ``sync_threads`` of them waiting, every other sync tool
    and sync step fn of the host, of every session, queued behind them until a person
    answered. A waiting thread does not count against ``sync_threads`` now."""
    from datetime import timedelta

    from pydantic import BaseModel

    from harness import define_harness, durable_tool, tool_definition
    from harness.models import ModelResponse, ScriptedModel, ToolCall

    class Kind(BaseModel):
        kind: str

    class Ok(BaseModel):
        ok: bool

    def execute(args: Kind, ctx: Any) -> Any:
        if args.kind == "ask":
            return {"ok": ctx.step.ask("approve", message="ok?", schema=Ok).ok}
        if args.kind == "sleep":
            ctx.step.sleep("nap", timedelta(hours=1))
            return {"slept": True}
        return {"value": ctx.step.do("quick", lambda: 1)}

    tool = durable_tool(tool_definition(name="work", description="d", input_schema=Kind), execute)

    def harness_for(kind: str) -> Any:
        model = ScriptedModel([ModelResponse(tool_calls=[ToolCall(id="c1", name="work", arguments={"kind": kind})]),
                               ModelResponse(text="done")])
        return define_harness(name="t/pool", model=model, tools=[tool])

    host = HarnessHost(log="memory:", sync_threads=2)
    slept: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    try:
        asking = await host.open(harness_for("ask"), session_id="asks")
        assert (await asking.send("go")).outcome == "waiting"
        sleeping = await host.open(harness_for("sleep"), session_id="sleeps")
        slept = asyncio.create_task(sleeping.send("go"))
        await eventually(lambda: any(c.sleeps for c in sleeping.state.calls.values()))  # its thread waits
        other = await host.open(harness_for("step"), session_id="works")
        assert (await asyncio.wait_for(other.send("go"), 10)).outcome == "completed"  # (it waited for good)
        answered = await asyncio.wait_for(asking.answer("c1", "approve", {"ok": True}), 10)
        assert answered is not None and answered.outcome == "completed"
    finally:
        await host.close()
        with contextlib.suppress(BaseException):  # (closed: the sleeping turn stays in the log)
            await slept


@pytest.mark.timeout(30)
@pytest.mark.parametrize("wait", ["ask", "sleep"])
async def test_a_cancelled_turn_releases_its_sync_tool_from_its_wait(wait: str) -> None:
    """A sync tool waits in ``ctx.step.ask`` / ``ctx.step.sleep`` through a coroutine on
    the loop that the turn's cancel did not reach: after ``session.cancel`` the tool stayed
    blocked, holding its thread until the host closed (a sleep's tool even went on after its
    wake time, running code of a turn that had ended). The wait is cancelled with the call
    now: the tool unwinds at once and runs nothing more."""
    from datetime import timedelta

    from pydantic import BaseModel

    from harness import define_harness, durable_tool, tool_definition
    from harness.models import ModelResponse, ScriptedModel, ToolCall

    class Kind(BaseModel):
        kind: str

    class Ok(BaseModel):
        ok: bool

    unwound: list[str] = []
    went_on: list[str] = []
    left = threading.Event()

    def execute(args: Kind, ctx: Any) -> Any:
        try:
            if args.kind == "ask":
                ctx.step.ask("approve", message="ok?", schema=Ok)
            else:
                ctx.step.sleep("nap", timedelta(hours=1))
        except BaseException as exc:
            unwound.append(type(exc).__name__)
            left.set()
            raise
        went_on.append(args.kind)
        left.set()
        return {"done": True}

    tool = durable_tool(tool_definition(name="work", description="d", input_schema=Kind), execute)
    model = ScriptedModel([ModelResponse(tool_calls=[ToolCall(id="c1", name="work", arguments={"kind": wait})]),
                           ModelResponse(text="done")])
    host = HarnessHost(log="memory:")
    try:
        session = await host.open(define_harness(name="t/cancel", model=model, tools=[tool]), session_id="s-1")
        sent = asyncio.create_task(session.send("go", input_id="in-1"))
        await eventually(lambda: any(c.asks or c.sleeps for c in session.state.calls.values()))  # in its wait
        assert (await session.cancel("in-1")).outcome == "aborted"
        assert await asyncio.to_thread(left.wait, 20), "the tool stayed in its wait"
        assert unwound == ["CancelledError"] and went_on == []  # (it left by the exception: it runs nothing more)
        assert (await sent).outcome == ("waiting" if wait == "ask" else "aborted")
    finally:
        await host.close()
