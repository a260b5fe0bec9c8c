"""A tool's execute function as users write it: wrapped in a lambda, a ``functools.partial``,
a decorator, an object with an ``async def __call__``. Each runs its steps as an async
tool does.

Before, ``durable_tool(defn, lambda args, ctx: impl(args, ctx))`` (``impl`` async) was taken
for a sync tool: the lambda ran on a pool thread and handed back ``impl``'s coroutine, which
ran on the event loop with the sync tool's ``ctx.step``; its first ``await ctx.step.do(...)``
then blocked the loop waiting for the loop: the whole process hung for good. An object
with an ``async def __call__`` went the same way.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from harness import define_harness, durable_tool, tool, tool_definition

from .conftest import Args, call, entries, script

SID = "s-1"


async def impl(args: Args, ctx: Any, extra: int = 0) -> Any:
    value = await ctx.step.do("charge", lambda: {"id": f"ch_{args.order_id}", "extra": extra})
    return {"charge": value}


class AsyncCallable:
    async def __call__(self, args: Args, ctx: Any) -> Any:
        return await impl(args, ctx)


def decorated(fn: Any) -> Any:
    @functools.wraps(fn)
    async def wrapper(args: Args, ctx: Any) -> Any:
        return await fn(args, ctx)

    return wrapper


EXECUTES = {
    "lambda": lambda args, ctx: impl(args, ctx),
    "partial": functools.partial(impl, extra=0),
    "callable-object": AsyncCallable(),
    "decorated": decorated(impl),
}


@pytest.mark.timeout(20)  # (the old code hung the event loop for good)
@pytest.mark.parametrize("how", sorted(EXECUTES))
async def test_an_async_execute_behind_a_wrapper_runs_its_steps(host, log, how: str) -> None:
    t = durable_tool(tool_definition(name="pay", description="d", input_schema=Args), EXECUTES[how])
    session = await host.open(define_harness(name="t/callables", model=script([call("c1", "pay")], "paid"), tools=[t]),
                              session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert not result["is_error"], result
    assert result["content"] == {"charge": {"id": "ch_42", "extra": 0}}
    assert [e["name"] for e in await entries(log, SID, "harness.step.result")] == ["charge"]


@pytest.mark.timeout(20)
async def test_a_plain_tool_whose_execute_returns_a_coroutine_is_awaited(host, log) -> None:
    async def work(args: Args) -> Any:
        return {"order": args.order_id}

    t = tool(tool_definition(name="look", description="d", input_schema=Args), lambda args: work(args))
    session = await host.open(define_harness(name="t/callables", model=script([call("c1", "look")], "ok"), tools=[t]),
                              session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["content"] == {"order": "42"}


@pytest.mark.timeout(20)
async def test_a_sync_tools_step_used_on_the_event_loop_is_a_step_error_not_a_hang(host, log) -> None:
    """The one way left to reach a sync tool's blocking ``ctx.step`` from the loop: a
    coroutine that took ``ctx.step`` before the tool returned it. It fails that call."""

    async def impl_of(step: Any, args: Args) -> Any:
        return await step.do("charge", lambda: 1)

    t = durable_tool(tool_definition(name="pay", description="d", input_schema=Args),
                     lambda args, ctx: impl_of(ctx.step, args))
    session = await host.open(define_harness(name="t/callables", model=script([call("c1", "pay")], "paid"), tools=[t]),
                              session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["is_error"] and result["content"]["type"] == "StepError"
    assert "make the tool an async def" in result["content"]["message"]
    assert await entries(log, SID, "harness.step.result") == []


@pytest.mark.timeout(20)
@pytest.mark.parametrize("where", ["tool", "step"])
async def test_a_cancelled_error_the_tool_raises_itself_is_its_error_not_a_stuck_turn(host, log, where: str) -> None:
    """A CancelledError out of the tool's own code (a task it cancelled and then awaited; a
    library's cancel scope) while nobody cancelled the call was taken for the call's own
    cancellation: the turn stopped where it was, and ``send`` never returned. It is the
    call's error now (``tool_failed``), and the turn goes on."""
    import asyncio

    async def leaks() -> Any:
        inner = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.sleep(0)
        inner.cancel()
        return await inner  # raises CancelledError into the tool

    async def execute(args: Args, ctx: Any) -> Any:
        if where == "step":
            return await ctx.step.do("charge", leaks)
        return await leaks()

    t = durable_tool(tool_definition(name="pay", description="d", input_schema=Args), execute)
    session = await host.open(define_harness(name="t/callables", model=script([call("c1", "pay")], "paid"), tools=[t]),
                              session_id=SID)
    result = await asyncio.wait_for(session.send("go"), 10)
    assert result.outcome == "completed" and result.text == "paid"
    [tool_result] = await entries(log, SID, "harness.tool.result")
    assert tool_result["is_error"] and tool_result["content"]["type"] == "CancelledError"
    assert "nobody cancelled" in tool_result["content"]["message"]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("hook", ["on_before_tool_call", "on_after_tool_call"])
async def test_a_cancelled_error_out_of_a_hook_is_its_error_not_a_stuck_turn(host, log, hook: str) -> None:
    import asyncio

    async def leaks(*_: Any) -> Any:
        inner = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.sleep(0)
        inner.cancel()
        return await inner

    t = durable_tool(tool_definition(name="pay", description="d", input_schema=Args), impl)
    harness = define_harness(name="t/hooks", model=script([call("c1", "pay")], "paid"), tools=[t], hooks={hook: leaks})
    session = await host.open(harness, session_id=SID)
    result = await asyncio.wait_for(session.send("go"), 10)
    assert result.outcome == "completed"
    [tool_result] = await entries(log, SID, "harness.tool.result")
    assert tool_result["is_error"] and tool_result["code"] == "hook_failed"
    assert tool_result["content"]["message"].startswith(f"{hook} raised CancelledError though nobody cancelled it")
