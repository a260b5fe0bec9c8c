"""SPEC 6: plain mode, ``chat()`` with the same tools and no durable log."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from harness import FakeClock, chat, durable_tool, tool, tool_definition
from harness.errors import NotDurableError, StepError

from .conftest import Args, call, eventually, script


class Ok(BaseModel):
    ok: bool


def results(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {m["tool_call_id"]: (json.loads(m["content"]), m["is_error"]) for m in messages if m["role"] == "tool"}


async def test_s6_1_step_do_runs_fn_every_time():
    runs: list[str] = []

    async def execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("charge", lambda info: runs.append(info.idempotency_key) or len(runs))

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    for _ in range(2):
        out = await chat(
            model=script([call("c1", "work")], "done"), messages=[{"role": "user", "content": "go"}], tools=[t]
        )
        assert out[-1] == {"role": "assistant", "content": "done"}
    assert len(runs) == 2  # nothing is stored, nothing is skipped
    assert out[0] == {"role": "user", "content": "go"}
    assert results(out) == {"c1": (2, False)}


async def test_s6_1_plain_and_sync_tools_work_in_chat():
    def plain(args: Args) -> Any:
        return {"order": args.order_id}

    def sync_durable(args: Args, ctx: Any) -> Any:
        return ctx.step.do("s", lambda: (1, 2))

    tools = [
        tool(tool_definition(name="plain", description="d", input_schema=Args), plain),
        durable_tool(tool_definition(name="sync", description="d", input_schema=Args), sync_durable),
    ]
    out = await chat(
        model=script([call("c1", "plain", order_id="7"), call("c2", "sync")], "done"),
        messages=[{"role": "user", "content": "go"}],
        tools=tools,
    )
    assert results(out) == {"c1": ({"order": "7"}, False), "c2": ([1, 2], False)}


async def test_s6_1_step_sleep_waits_its_full_time():
    clock = FakeClock()

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.sleep("nap", timedelta(seconds=60))
        return "rested"

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    task = asyncio.create_task(
        chat(model=script([call("c1", "work")], "done"), messages=[{"role": "user", "content": "go"}], tools=[t], clock=clock)
    )
    await eventually(lambda: clock.sleepers == 1)
    clock.advance(59.9)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(0.1)
    assert results(await task) == {"c1": ("rested", False)}


async def test_s6_1_step_sleep_takes_seconds_and_refuses_a_duration_that_is_no_time():
    clock = FakeClock()
    refused: list[str] = []

    async def execute(args: Args, ctx: Any) -> Any:
        try:
            await ctx.step.sleep("bad", "5")
        except StepError as exc:
            refused.append(str(exc))
        await ctx.step.sleep("nap", 30)
        return "rested"

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    task = asyncio.create_task(
        chat(model=script([call("c1", "work")], "done"), messages=[{"role": "user", "content": "go"}], tools=[t], clock=clock)
    )
    await eventually(lambda: clock.sleepers == 1)
    clock.advance(29.9)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(0.1)
    assert results(await task) == {"c1": ("rested", False)}
    assert refused == ["step.sleep takes a timedelta or a number of seconds as its duration, not str"]


async def test_s6_1_ask_and_append_raise_not_durable():
    caught: list[str] = []

    async def execute(args: Args, ctx: Any) -> Any:
        try:
            await ctx.step.ask("q", message="?", schema=Ok)
        except NotDurableError:
            caught.append("ask")
        try:
            ctx.append([{"type": "x"}])
        except NotDurableError:
            caught.append("append")
        return "ok"

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    await chat(model=script([call("c1", "work")], "done"), messages=[{"role": "user", "content": "go"}], tools=[t])
    assert caught == ["ask", "append"]


async def test_s6_1_uncaught_not_durable_is_a_tool_error():
    async def execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.ask("q", message="?", schema=Ok)

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    out = await chat(model=script([call("c1", "work")], "done"), messages=[{"role": "user", "content": "go"}], tools=[t])
    [(content, is_error)] = results(out).values()
    assert is_error and content["error"] == "tool_failed" and content["type"] == "NotDurableError"


async def test_s2_4_plain_idempotency_keys_are_unique_per_chat_call():
    keys: list[str] = []

    async def execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("charge", lambda info: keys.append(info.idempotency_key) or 1)

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    for _ in range(2):  # the model reuses its call ids in every conversation
        await chat(model=script([call("c1", "work")], "done"), messages=[{"role": "user", "content": "go"}], tools=[t])
    assert len(keys) == 2 and keys[0] != keys[1]
    assert all(k.startswith("plain:") and k.endswith(":c1:charge") for k in keys)


async def test_s3_naive_until_is_refused_in_plain_mode_too():
    from datetime import datetime

    caught: list[BaseException] = []

    async def execute(args: Args, ctx: Any) -> Any:
        try:
            await ctx.step.sleep("nap", until=datetime(2030, 1, 1))
        except TypeError as exc:
            caught.append(exc)
        return "ok"

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    await chat(model=script([call("c1", "work")], "done"), messages=[{"role": "user", "content": "go"}], tools=[t])
    assert len(caught) == 1 and "until" in str(caught[0])


class Flaky:
    """A model that fails with the given errors first, then answers."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]], tools: Any) -> Any:
        from harness.models import ModelResponse

        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return ModelResponse(text="fine")


async def test_chat_retries_transient_model_errors_with_backoff_and_retry_after():
    from harness import Durability
    from harness.errors import ModelError

    clock = FakeClock()
    model = Flaky(ModelError("slow down", transient=True, status=429, retry_after=7.0),
                  ModelError("upstream 503", transient=True, status=503))
    durability = Durability(model_backoff=timedelta(seconds=2), model_backoff_max=timedelta(seconds=30))
    run = asyncio.ensure_future(chat(model=model, messages=[{"role": "user", "content": "hi"}], clock=clock,
                                      durability=durability))
    await eventually(lambda: clock.sleepers == 1)
    assert model.calls == 1
    clock.advance(6.9)
    await asyncio.sleep(0)
    assert model.calls == 1  # Retry-After: 7 s, not the backoff
    clock.advance(0.2)  # (past 7 s: floats)
    await eventually(lambda: model.calls == 2 and clock.sleepers == 1)
    assert clock.sleepers == 1
    clock.advance(3.9)  # the second retry: backoff 2 s x 2, drawn between 2 and 4 s
    clock.advance(0.2)
    out = await asyncio.wait_for(run, 10)
    assert out[-1] == {"role": "assistant", "content": "fine"} and model.calls == 3


async def test_chat_raises_a_permanent_model_error_at_once_and_the_last_transient_one():
    from harness import Durability
    from harness.errors import ModelError

    permanent = Flaky(ModelError("bad key", transient=False, status=401))
    with pytest.raises(ModelError, match="bad key"):
        await chat(model=permanent, messages=[{"role": "user", "content": "hi"}], clock=FakeClock())
    assert permanent.calls == 1

    clock = FakeClock()
    always = Flaky(*[ModelError(f"busy {i}", transient=True, status=503) for i in range(3)])
    run = asyncio.ensure_future(chat(model=always, messages=[{"role": "user", "content": "hi"}], clock=clock,
                                      durability=Durability(model_retries=2)))
    for n in (1, 2):
        await eventually(lambda n=n: always.calls == n and clock.sleepers == 1)
        clock.advance(60)
    with pytest.raises(ModelError, match="busy 2"):
        await run
    assert always.calls == 3  # the first call and 2 retries


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_s6_1_a_step_whose_fn_raised_may_be_retried_under_its_name_in_chat_too(kind: str):
    keys: list[str] = []

    def flaky(info: Any) -> Any:
        keys.append(info.idempotency_key)
        if len(keys) < 2:
            raise ConnectionError("provider down")
        return "ok"

    async def async_execute(args: Args, ctx: Any) -> Any:
        try:
            return await ctx.step.do("charge", flaky)
        except ConnectionError:
            return await ctx.step.do("charge", flaky)

    def sync_execute(args: Args, ctx: Any) -> Any:
        try:
            return ctx.step.do("charge", flaky)
        except ConnectionError:
            return ctx.step.do("charge", flaky)

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args),
                     async_execute if kind == "async" else sync_execute)
    out = await chat(model=script([call("c1", "work")], "done"), messages=[{"role": "user", "content": "go"}], tools=[t])
    assert results(out) == {"c1": ("ok", False)}
    assert len(keys) == 2 and len(set(keys)) == 1
