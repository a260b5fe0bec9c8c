"""SPEC 7 on the embedded logs: one owner, fencing, inputs waiting in the log, failover."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness import define_harness, durable_tool, tool_definition
from harness.errors import FencedError, SessionBusy, SessionClosed
from harness.records import InputMessage, StepResult

from .conftest import LEASE, Args, Died, DyingLog, call, crash, entries, eventually, script, types

SID = "s-1"


def harness_of(execute: Any, model: Any) -> Any:
    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    return define_harness(name="test/sessions", model=model, tools=[t])


def echo_model() -> Any:
    from harness.models import ModelResponse, ScriptedModel

    def respond(messages: list[dict[str, Any]]) -> ModelResponse:
        return ModelResponse(text=f"re: {messages[-1]['content']}")

    return ScriptedModel(respond)


async def test_s7_1_one_owner_at_a_time(hosts, log, other_log):
    inside = asyncio.Event()
    release = asyncio.Event()

    async def execute(args: Args, ctx: Any) -> Any:
        inside.set()
        await release.wait()
        return "ok"

    h = harness_of(execute, script([call("c1", "work")], "done"))
    a = await hosts(owner_id="a").open(h, session_id=SID)
    sending = asyncio.create_task(a.send("one", input_id="in-1"))
    await inside.wait()
    info = await log.lease_info(SID)
    assert info.owner == "a"
    with pytest.raises(SessionBusy):
        await other_log().claim(SID, owner="b", lease=LEASE)
    release.set()
    assert (await sending).outcome == "completed"
    # Idle, it holds no lease: the next writer claims it at once.
    async def released() -> bool:
        return (await log.lease_info(SID)).owner is None

    await eventually(released)


async def test_s7_1_new_owner_fences_the_old_one_whose_write_lands_nothing(hosts, log, other_log, clock):
    release = asyncio.Event()
    progress: list[str] = []
    caught: list[BaseException] = []

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.do("first", lambda: 1)
        progress.append("first")
        await release.wait()
        try:
            await ctx.step.do("second", lambda: 2)  # the zombie's write
        except FencedError as exc:
            caught.append(exc)
            raise
        return "ok"

    model = script([call("c1", "work")], "done")
    h = harness_of(execute, model)
    zombie = await hosts(owner_id="a").open(h, session_id=SID)
    sending = asyncio.create_task(zombie.send("go", input_id="in-1"))
    await eventually(lambda: progress)
    core = zombie._core
    core.host.drop(core.ownership)  # it stops renewing its lease (a long GC pause, a partition)
    clock.advance(LEASE.total_seconds() + 1)

    fencer = await other_log().claim(SID, owner="b", lease=LEASE)  # a new owner: fences the zombie
    before = await log.read(SID)
    release.set()
    with pytest.raises(FencedError):
        await sending
    assert len(caught) == 1
    assert [e.seq for e in await log.read(SID)] == [e.seq for e in before]  # nothing landed
    assert "second" not in {e["name"] for e in await entries(log, SID, "harness.step.result")}
    with pytest.raises(FencedError):
        await zombie.send("more", input_id="in-2")
    assert "in-2" not in {e["input_id"] for e in await entries(log, SID, "harness.input.message")}

    # The new owner finishes the turn: the call reruns, its finished step served from the log.
    await fencer.release()
    new_owner = await hosts(log_=other_log(), owner_id="b").open(h, session_id=SID)
    [result] = await new_owner.recover()
    assert result.outcome == "completed"
    assert [e["name"] for e in await entries(log, SID, "harness.step.result")] == ["first", "second"]


async def test_s7_2_input_sent_to_another_server_waits_for_the_owner(hosts, log, other_log):
    inside = asyncio.Event()
    release = asyncio.Event()

    async def execute(args: Args, ctx: Any) -> Any:
        inside.set()
        await release.wait()
        return "ok"

    def respond(messages: list[dict[str, Any]]) -> Any:
        from harness.models import ModelResponse, ToolCall

        if messages[-1] == {"role": "user", "content": "one"}:
            return ModelResponse(tool_calls=[ToolCall(id="c1", name="work", arguments={})])
        last_user = [m for m in messages if m["role"] == "user"][-1]
        return ModelResponse(text=f"re: {last_user['content']}")

    from harness.models import ScriptedModel

    h = harness_of(execute, ScriptedModel(respond))
    owner = await hosts(owner_id="a").open(h, session_id=SID)
    first = asyncio.create_task(owner.send("one", input_id="in-1"))
    await inside.wait()

    other = await hosts(log_=other_log(), owner_id="b").open(h, session_id=SID)
    second = asyncio.create_task(other.send("two", input_id="in-2"))  # b is not the owner: it waits in the log
    await eventually(lambda: "in-2" in owner.state.inputs)
    assert (await log.lease_info(SID)).owner == "a" and not second.done()
    release.set()
    assert (await first).text == "re: one"
    result = await second
    assert result.outcome == "completed" and result.text == "re: two"
    started = await entries(log, SID, "harness.turn.started")
    assert [s["input_id"] for s in started] == ["in-1", "in-2"]


async def test_s7_2_input_produced_into_the_log_is_taken_in_order(hosts, log, other_log):
    model = echo_model()
    h = harness_of(lambda a, c: "ok", model)
    producer = other_log()
    await producer.submit(InputMessage(SID, 0, "in-1", "first", "test/sessions"))
    await producer.submit(InputMessage(SID, 0, "in-2", "second", "test/sessions"))
    session = await hosts(owner_id="a").open(h, session_id=SID)
    assert (await session.send("third", input_id="in-3")).text == "re: third"
    finished = await entries(log, SID, "harness.turn.finished")
    assert [(f["input_id"], f["text"]) for f in finished] == [
        ("in-1", "re: first"), ("in-2", "re: second"), ("in-3", "re: third")
    ]


async def test_s7_2_resending_an_input_id_has_no_second_effect(hosts, log, other_log):
    model = echo_model()
    h = harness_of(lambda a, c: "ok", model)
    session = await hosts(owner_id="a").open(h, session_id=SID)
    first = await session.send("one", input_id="in-1")
    again = await session.send("one", input_id="in-1")
    assert first == again and len(model.requests) == 1
    await other_log().submit(InputMessage(SID, 0, "in-1", "one", "test/sessions"))  # a producer resends
    other = await hosts(log_=other_log(), owner_id="b").open(h, session_id=SID)
    assert (await other.send("one", input_id="in-1")) == first
    assert (await session.send("two", input_id="in-2")).outcome == "completed"
    assert len(model.requests) == 2
    assert [s["input_id"] for s in await entries(log, SID, "harness.turn.started")] == ["in-1", "in-2"]
    assert [s["input_id"] for s in await entries(log, SID, "harness.input.settled")] == ["in-1", "in-2"]


async def _owner_dies_mid_turn(hosts: Any, log: Any, runs: list[int]) -> Any:
    release = asyncio.Event()

    async def execute(args: Args, ctx: Any) -> Any:
        runs.append(1)
        value = await ctx.step.do("charge", lambda: "ch_1")
        if len(runs) == 1:
            await release.wait()  # the owner dies here
        return value

    model = script([call("c1", "work")], "done")
    h = harness_of(execute, model)
    first = await hosts(owner_id="a").open(h, session_id=SID)
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    await eventually(lambda: first.state.calls.get("c1") and first.state.calls["c1"].steps)
    await crash(first)
    task.cancel()
    return h


async def test_s7_3_another_worker_recovers_once_the_lease_expired(hosts, log, other_log, clock):
    runs: list[int] = []
    h = await _owner_dies_mid_turn(hosts, log, runs)
    worker = await hosts(log_=other_log(), owner_id="b").open(h, session_id=SID)
    recovering = asyncio.create_task(worker.recover())
    await eventually(lambda: clock.sleepers >= 1)  # waiting for the dead owner's lease
    assert not recovering.done() and len(runs) == 1
    clock.advance(LEASE.total_seconds() + 1)
    [result] = await recovering
    assert result.outcome == "completed" and result.text == "done"
    assert len(runs) == 2
    resumed = await entries(log, SID, "harness.turn.resumed")
    assert [(r["turn"], r["attempt"]) for r in resumed] == [(1, 2)]
    assert len(await entries(log, SID, "harness.step.result")) == 1


async def test_s7_3_a_waiting_client_sees_the_turn_finish_without_user_action(hosts, log, other_log, clock):
    runs: list[int] = []
    h = await _owner_dies_mid_turn(hosts, log, runs)
    other = await hosts(log_=other_log(), owner_id="b").open(h, session_id=SID)
    waiting = asyncio.create_task(other.send("go", input_id="in-1"))  # a resend: no second input
    for _ in range(20):
        await asyncio.sleep(0.001)
    assert not waiting.done()
    clock.advance(LEASE.total_seconds() + 1)
    result = await waiting
    assert result.outcome == "completed"
    assert len(runs) == 2
    assert len(await entries(log, SID, "harness.input.message")) == 1


async def test_s7_3_new_host_rebuilds_state_from_the_log(hosts, log, other_log, clock):
    runs: list[int] = []
    h = await _owner_dies_mid_turn(hosts, log, runs)
    clock.advance(LEASE.total_seconds() + 1)
    worker = await hosts(log_=other_log(), owner_id="b").open(h, session_id=SID)
    assert worker.state.active_turn is not None
    assert worker.state.calls["c1"].steps == {"charge": "ch_1"}
    [result] = await worker.recover()
    assert result.outcome == "completed"
    assert await worker.recover() == []  # nothing left to do


async def test_s7_4_a_batch_that_did_not_commit_is_never_seen(hosts, log, clock):
    runs: list[int] = []

    async def execute(args: Args, ctx: Any) -> Any:
        runs.append(1)
        ctx.append([{"type": "order.paid"}])
        return await ctx.step.do("charge", lambda: "ch_1")

    dying = DyingLog(log, lambda batch: any(r.TYPE == "harness.tool.result" for r in batch))
    h = harness_of(execute, script([call("c1", "work")], "done"))
    first = await hosts(log_=dying, owner_id="a").open(h, session_id=SID)
    with pytest.raises(Died):
        await first.send("go", input_id="in-1")
    await crash(first)
    seen = await types(log, SID)
    assert "harness.tool.result" not in seen and "harness.app.record" not in seen

    clock.advance(LEASE.total_seconds() + 1)
    second = await hosts(owner_id="b").open(h, session_id=SID)
    [result] = await second.recover()
    assert result.outcome == "completed"
    assert await second.records() == [{"type": "order.paid"}]
    assert len(runs) == 2


async def test_s7_4_encoding_failure_writes_nothing(log):
    writer = await log.claim(SID, owner="a", lease=LEASE)
    good = StepResult(SID, 1, "c1", "a", 1)
    bad = StepResult("other-session", 1, "c1", "b", 2)
    with pytest.raises(ValueError):
        await writer.append([good, bad])
    assert await log.read(SID) == []


async def test_s7_3_an_answer_to_a_dead_owners_ask_takes_over_and_finishes(hosts, log, other_log, clock):
    from pydantic import BaseModel

    class Ok(BaseModel):
        ok: bool

    async def execute(args: Args, ctx: Any) -> Any:
        return (await ctx.step.ask("confirm", message="ok?", schema=Ok)).ok

    h = harness_of(execute, script([call("c1", "work")], "done"))
    first = await hosts(owner_id="a").open(h, session_id=SID)
    assert (await first.send("go", input_id="in-1")).outcome == "waiting"
    await crash(first)
    clock.advance(LEASE.total_seconds() + 1)
    other = await hosts(log_=other_log(), owner_id="b").open(h, session_id=SID)
    result = await other.answer("c1", "confirm", {"ok": True})  # no recover(): the answer is enough
    assert result is not None and result.outcome == "completed" and result.text == "done"
    assert len(await entries(log, SID, "harness.ask.opened")) == 1


async def test_s7_3_close_gives_up_ownership_so_another_host_takes_over_at_once(hosts, log, other_log):
    runs: list[int] = []
    release = asyncio.Event()

    async def execute(args: Args, ctx: Any) -> Any:
        runs.append(1)
        await ctx.step.do("s", lambda: 1)
        if len(runs) == 1:
            await release.wait()
        return "ok"

    h = harness_of(execute, script([call("c1", "work")], "done"))
    first = await hosts(owner_id="a").open(h, session_id=SID)
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    await eventually(lambda: first.state.calls.get("c1") and first.state.calls["c1"].steps)
    await first.close()  # recoverable: nothing written, lease released
    with pytest.raises(SessionClosed):  # the waiting send ends with the handle
        await task
    other = await hosts(log_=other_log(), owner_id="b").open(h, session_id=SID)
    [result] = await other.recover()  # no clock advance needed
    assert result.outcome == "completed" and len(runs) == 2
