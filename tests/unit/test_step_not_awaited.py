"""A ``step.do`` / ``step.sleep`` / ``step.ask`` a tool called and never awaited.

Before, the step's coroutine was dropped: its side effect never happened, the tool call
completed as if it had, and only Python's "coroutine was never awaited" RuntimeWarning
said anything. Now the call fails with ``StepNotAwaited`` naming the step (the tool's
programming error, reported like any error a tool raises: ``tool_failed``), nothing of the
step is written, and Python does not warn on top of it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import warnings
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from harness import StepNotAwaited, agent_tool, chat, define_harness, durable_tool, tool_definition
from harness.errors import StepError
from harness.models import ModelResponse, ScriptedModel, ToolCall

from .conftest import Args, call, entries, script

SID = "s-1"


def harness_of(execute: Any, *, name: str = "work") -> Any:
    t = durable_tool(tool_definition(name=name, description="d", input_schema=Args), execute)
    return define_harness(name="test/unawaited", model=script([call("c1", name)], "done"), tools=[t])


@pytest.fixture
def python_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """Every warning raised while the test runs (a dropped coroutine warns when collected)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
        gc.collect()


def never_awaited(caught: list[warnings.WarningMessage]) -> list[str]:
    gc.collect()
    return [str(w.message) for w in caught if "never awaited" in str(w.message)]


async def test_unawaited_step_do_fails_the_call_naming_the_step(host, log, python_warnings):
    charged: list[int] = []

    async def execute(args: Args, ctx: Any) -> Any:
        ctx.step.do("charge", lambda: charged.append(1) or "ch_1")  # forgot `await`
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"  # the model is told; the turn goes on
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["is_error"] and result["code"] == "tool_failed"
    assert result["content"]["type"] == "StepNotAwaited"
    assert result["content"]["message"].startswith(
        "step.do('charge') was never awaited: write `await step.do(...)`"
    )
    assert charged == [] and await entries(log, SID, "harness.step.result") == []
    assert never_awaited(python_warnings) == []  # the coroutine was closed: no warning on top


async def test_unawaited_step_whose_value_is_used_reports_the_missing_await(host, log, caplog):
    """The usual shape of the mistake: the coroutine's "value" is used at once. The error
    names the missing await, the tool's own TypeError is its cause (in the logged trace)."""

    async def execute(args: Args, ctx: Any) -> Any:
        payment = ctx.step.do("charge", lambda: {"id": "ch_1"})
        return {"charge_id": payment["id"]}  # TypeError: 'coroutine' object is not subscriptable

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["content"]["type"] == "StepNotAwaited"
    assert "step.do('charge') was never awaited" in result["content"]["message"]
    assert "'coroutine' object is not subscriptable" in caplog.text


@pytest.mark.parametrize("kind", ["sleep", "ask"])
async def test_unawaited_sleep_or_ask_fails_the_call_and_writes_nothing(host, log, kind, python_warnings):
    class Ok(BaseModel):
        ok: bool

    async def execute(args: Args, ctx: Any) -> Any:
        if kind == "sleep":
            ctx.step.sleep("cool-off", timedelta(hours=1))
        else:
            ctx.step.ask("approve", message="ok?", schema=Ok)
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["content"]["type"] == "StepNotAwaited"
    name = "cool-off" if kind == "sleep" else "approve"
    assert result["content"]["message"].startswith(f"step.{kind}({name!r}) was never awaited")
    assert await entries(log, SID, "harness.sleep.scheduled") == []
    assert await entries(log, SID, "harness.ask.opened") == []
    assert never_awaited(python_warnings) == []


async def test_gathered_and_task_steps_are_awaited(host, log):
    """Steps run concurrently (gather, a task awaited later, a coroutine kept and awaited
    later) are awaited: nothing changes for them."""

    async def execute(args: Args, ctx: Any) -> Any:
        a, b = await asyncio.gather(ctx.step.do("a", lambda: 1), ctx.step.do("b", lambda: 2))
        task = asyncio.create_task(ctx.step.do("c", lambda: 3))
        later = ctx.step.do("d", lambda: 4)
        return [a, b, await task, await later]

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert not result["is_error"] and result["content"] == [1, 2, 3, 4]
    assert sorted(e["name"] for e in await entries(log, SID, "harness.step.result")) == ["a", "b", "c", "d"]


async def test_many_unawaited_steps_are_all_named_in_the_error(host, log):
    async def execute(args: Args, ctx: Any) -> Any:
        for i in range(40):  # (past the point where started steps are dropped from the list)
            await ctx.step.do(f"done:{i}", lambda: 1)
        for i in range(3):
            ctx.step.do(f"lost:{i}", lambda: 1)
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["content"]["message"] == (
        "step.do('lost:0') was never awaited: write `await step.do(...)`; it did not run (2 more steps too)"
    )
    assert len(await entries(log, SID, "harness.step.result")) == 40


async def test_unawaited_step_in_plain_chat_fails_the_call(python_warnings):
    ran: list[int] = []

    async def execute(args: Args, ctx: Any) -> Any:
        ctx.step.do("charge", lambda: ran.append(1))
        return "ok"

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    out = await chat(model=script([call("c1", "work")], "done"), messages=[{"role": "user", "content": "go"}], tools=[t])
    [tool_msg] = [m for m in out if m["role"] == "tool"]
    assert tool_msg["is_error"]
    content = json.loads(tool_msg["content"])
    assert content["type"] == "StepNotAwaited" and "step.do('charge') was never awaited" in content["message"]
    assert ran == [] and never_awaited(python_warnings) == []


async def test_unawaited_step_in_a_sub_agents_tool_fails_that_call():
    class Topic(BaseModel):
        topic: str

    async def lookup(args: Topic, ctx: Any) -> Any:
        ctx.step.do("fetch", lambda: "facts")
        return "ok"

    child = define_harness(
        name="researcher",
        model=ScriptedModel([
            ModelResponse(tool_calls=[ToolCall(id="c1", name="lookup", arguments={"topic": "x"})]),
            ModelResponse(text="x!"),
        ]),
        tools=[durable_tool(tool_definition(name="lookup", description="d", input_schema=Topic), lookup)],
    )
    research = agent_tool(tool_definition(name="research", description="d", input_schema=Topic), child)
    child_model = child.model
    model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(id="p1", name="research", arguments={"topic": "x"})]), ModelResponse(text="ok")]
    )
    await chat(model=model, messages=[{"role": "user", "content": "hi"}], tools=[research])
    # the sub-agent's second request holds its tool's result: the error
    [tool_msg] = [m for m in child_model.requests[1] if m["role"] == "tool"]
    assert tool_msg["is_error"] and "step.do('fetch') was never awaited" in tool_msg["content"]


def test_step_not_awaited_is_a_step_error():
    assert issubclass(StepNotAwaited, StepError)


async def test_a_step_left_running_in_a_task_when_the_tool_returns_fails_the_call_and_is_stopped(host, log, caplog):
    """``asyncio.create_task(ctx.step.do(...))`` and return without awaiting the task:
    the step had started, and the harness closed its coroutine when the tool returned, so
    the step died silently in the middle (its task pending for good, Python's "Task was
    destroyed but it is pending!" at exit) while the call completed as if all was done.
    Now the call fails with ``StepNotAwaited`` naming the step, which is stopped (its
    task cancelled), and nothing of it is written after the call's result."""
    finished: list[int] = []
    tasks: list[asyncio.Task[Any]] = []
    started, release = asyncio.Event(), asyncio.Event()

    async def slow() -> int:
        started.set()
        await release.wait()
        finished.append(1)
        return 2

    async def execute(args: Args, ctx: Any) -> Any:
        tasks.append(asyncio.create_task(ctx.step.do("late", slow)))
        await started.wait()  # the step runs
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["is_error"] and result["content"]["type"] == "StepNotAwaited"
    assert result["content"]["message"].startswith("step.do('late') was still running when the tool returned")
    release.set()  # (a step still running would now finish and write)
    await asyncio.gather(tasks[0], return_exceptions=True)
    assert tasks[0].cancelled() and finished == []
    assert await entries(log, SID, "harness.step.result") == []


async def test_a_step_task_not_started_when_the_tool_returns_is_cancelled_not_broken(host, log, caplog):
    """A task made of a step that had not started when the tool returned: the call fails
    (never awaited, it did not run) and the task is cancelled, not left to fail on a closed
    coroutine ("Task exception was never retrieved ... cannot reuse already awaited
    coroutine" from asyncio)."""
    tasks: list[asyncio.Task[Any]] = []

    async def execute(args: Args, ctx: Any) -> Any:
        tasks.append(asyncio.create_task(ctx.step.do("late", lambda: 1)))
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["is_error"] and "step.do('late') was never awaited" in result["content"]["message"]
    await asyncio.gather(tasks[0], return_exceptions=True)
    assert tasks[0].cancelled()
    assert await entries(log, SID, "harness.step.result") == []


async def test_a_tool_that_raises_while_a_gathered_step_runs_keeps_its_own_error(host, log):
    """``gather`` does not cancel the other steps when one raises: the tool's error is the
    call's, and the step still running is stopped rather than left to write later."""
    finished: list[int] = []
    release = asyncio.Event()

    async def slow() -> int:
        await release.wait()
        finished.append(1)
        return 2

    def boom() -> Any:
        raise ConnectionError("provider down")

    async def execute(args: Args, ctx: Any) -> Any:
        return await asyncio.gather(ctx.step.do("slow", slow), ctx.step.do("boom", boom))

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["is_error"] and result["content"]["type"] == "ConnectionError"
    release.set()  # (a step still running would now finish and write)
    for _ in range(50):  # yield to the loop: what runs once released has run by then
        await asyncio.sleep(0)
    assert finished == []
    assert await entries(log, SID, "harness.step.result") == []
