"""SPEC 4: app records (``ctx.append``, ``session.append_records``, ``session.records``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness import ToolOutcome, define_harness, durable_tool, tool_definition
from harness.errors import InvalidRecord, ReservedRecordType
from harness.records import InputRecords

from .conftest import LEASE, Args, DyingLog, call, crash, entries, eventually, script

SID = "s-1"


def harness_of(execute: Any, *, model: Any = None, replay: str = "safe", hooks: Any = None) -> Any:
    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute, replay=replay)  # type: ignore[arg-type]
    return define_harness(
        name="test/records", model=model or script([call("c1", "work")], "done"), tools=[t], hooks=hooks
    )


async def test_s4_1_appended_records_land_in_the_same_batch_as_the_result(hosts, log):
    batches: list[list[str]] = []
    spy = DyingLog(log, lambda batch: batches.append([r.TYPE for r in batch]) and False)

    async def execute(args: Args, ctx: Any) -> Any:
        ctx.append([{"type": "order.paid", "order": args.order_id}])
        await ctx.step.do("charge", lambda: 1)
        ctx.append([{"type": "order.invoiced"}, {"type": "order.paid", "n": 2}])
        return "ok"

    session = await hosts(log_=spy).open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert ["harness.step.result"] in batches  # the step went alone
    assert ["harness.app.record"] * 3 + ["harness.tool.result"] in batches
    assert not any("harness.app.record" in b and "harness.tool.result" not in b for b in batches)
    assert [r["type"] for r in await session.records()] == ["order.paid", "order.invoiced", "order.paid"]


async def test_s4_1_records_of_a_cut_call_never_happened(hosts, log, clock):
    runs: list[int] = []
    release = asyncio.Event()

    async def execute(args: Args, ctx: Any) -> Any:
        runs.append(1)
        ctx.append([{"type": "order.paid", "run": len(runs)}])
        await ctx.step.do("charge", lambda: 1)
        if len(runs) == 1:
            await release.wait()  # the first process dies here
        return "ok"

    h = harness_of(execute)
    first = await hosts(owner_id="a").open(h, session_id=SID)
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    await eventually(lambda: first.state.calls.get("c1") and first.state.calls["c1"].steps)
    await crash(first)
    task.cancel()
    assert await entries(log, SID, "harness.app.record") == []

    clock.advance(LEASE.total_seconds() + 1)
    second = await hosts(owner_id="b").open(h, session_id=SID)
    [result] = await second.recover()
    assert result.outcome == "completed"
    assert await second.records() == [{"type": "order.paid", "run": 2}]


async def test_s4_1_records_of_a_tool_that_raised_are_dropped(host, log):
    async def execute(args: Args, ctx: Any) -> Any:
        ctx.append([{"type": "order.paid"}])
        raise RuntimeError("failed after staging")

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert await session.records() == []
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["is_error"] and result["code"] == "tool_failed"


async def test_s4_1_records_kept_when_a_hook_replaces_a_failed_outcome(host, log):
    async def execute(args: Args, ctx: Any) -> Any:
        ctx.append([{"type": "order.paid"}])
        raise RuntimeError("failed after staging")

    def after(event: Any, outcome: ToolOutcome) -> Any:
        return {"recovered": True} if outcome.is_error else None

    session = await host.open(harness_of(execute, hooks={"on_after_tool_call": after}), session_id=SID)
    await session.send("go")
    assert await session.records() == [{"type": "order.paid"}]


async def test_s4_2_reserved_record_type_raises_at_once(host, log):
    caught: list[BaseException] = []

    async def execute(args: Args, ctx: Any) -> Any:
        for bad in ([{"type": "harness.tool.result"}], [{"no": "type"}], [{"type": 3}], ["text"]):
            try:
                ctx.append(bad)
            except (ReservedRecordType, InvalidRecord) as exc:
                caught.append(exc)
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    await session.send("go")
    assert [type(e) for e in caught] == [ReservedRecordType] + [InvalidRecord] * 3
    assert caught[0].record_type == "harness.tool.result"
    assert await entries(log, SID, "harness.app.record") == []

    before = len(await log.read(SID))
    with pytest.raises(ReservedRecordType):
        await session.append_records([{"type": "ok"}, {"type": "harness.x"}], input_id="r-1")
    with pytest.raises(InvalidRecord):
        await session.append_records([{"kind": "x"}], input_id="r-2")
    assert len(await log.read(SID)) == before


async def test_s4_2_reserved_type_produced_into_the_log_is_rejected_not_landed(host, log, other_log):
    session = await host.open(harness_of(lambda a, c: "ok"), session_id=SID)
    await session.append_records([{"type": "first"}], input_id="r-0")  # become the owner
    await other_log().submit(InputRecords(SID, 0, "r-bad", [{"type": "harness.turn.finished"}]))
    await eventually(lambda: session.state.inputs.get("r-bad") and session.state.inputs["r-bad"].settled)
    assert session.state.inputs["r-bad"].settled.outcome == "rejected"
    assert await session.records() == [{"type": "first"}]


async def test_s4_3_append_records_once_per_input_id(host, log):
    session = await host.open(harness_of(lambda a, c: "ok"), session_id=SID)
    await session.append_records([{"type": "note", "n": 1}], input_id="r-1")
    await session.append_records([{"type": "note", "n": 1}], input_id="r-1")
    assert await session.records() == [{"type": "note", "n": 1}]
    assert len(await entries(log, SID, "harness.input.records")) == 1


async def test_s4_3_append_records_resend_from_other_handles_appends_once(hosts, log, other_log):
    h = harness_of(lambda a, c: "ok")
    owner = await hosts(owner_id="a").open(h, session_id=SID)
    await owner.append_records([{"type": "note", "n": 0}], input_id="r-0")
    other = await hosts(log_=other_log(), owner_id="b").open(h, session_id=SID)
    await other.append_records([{"type": "note", "n": 1}], input_id="r-1")  # not the owner: submitted
    await eventually(lambda: owner.state.inputs.get("r-1") and owner.state.inputs["r-1"].settled)
    await other.append_records([{"type": "note", "n": 1}], input_id="r-1")
    await owner.append_records([{"type": "note", "n": 1}], input_id="r-1")
    assert await owner.records() == [{"type": "note", "n": 0}, {"type": "note", "n": 1}]
    assert await other.records() == [{"type": "note", "n": 0}, {"type": "note", "n": 1}]


async def test_s4_4_records_read_back_by_type_in_log_order(host, log):
    async def execute(args: Args, ctx: Any) -> Any:
        ctx.append([{"type": "b", "n": 2}, {"type": "a", "n": 3}])
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    await session.append_records([{"type": "a", "n": 1}], input_id="r-1")
    await session.send("go")
    await session.append_records([{"type": "a", "n": 4}], input_id="r-2")
    assert [r["n"] for r in await session.records()] == [1, 2, 3, 4]
    assert await session.records(type="a") == [{"type": "a", "n": 1}, {"type": "a", "n": 3}, {"type": "a", "n": 4}]
    assert await session.records(type="b") == [{"type": "b", "n": 2}]
    assert await session.records(type="none") == []


async def test_s4_4_app_records_read_back_with_their_own_type_from_every_reader(host, log):
    from harness.client import HarnessClient

    async def execute(args: Args, ctx: Any) -> Any:
        ctx.append([{"type": "app.memory", "fact": "likes tea"}])
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    await session.send("go", input_id="in-1")
    [entry] = [e for e in await log.read(SID) if e.type == "app.memory"]
    assert entry.data == {"type": "app.memory", "fact": "likes tea"}
    assert not any(e.type == "harness.app.record" for e in await log.read(SID))
    assert entry.record_type == "harness.app.record"  # the envelope, for who needs it
    assert await session.records() == [{"type": "app.memory", "fact": "likes tea"}]

    client = HarnessClient(log=log)
    seen = []
    async for e in client.events(SID):
        seen.append((e.type, e.data))
        if e.type == "harness.input.settled":
            break
    assert ("app.memory", {"type": "app.memory", "fact": "likes tea"}) in seen


async def test_s4_4_records_sent_from_outside_read_back_as_their_input(host, log):
    """An ``append_records`` input stays one ``harness.input.records`` entry (a request the
    owner may refuse); its records land, each with its own type, in ``session.records()``."""
    session = await host.open(harness_of(lambda a, c: "ok"), session_id=SID)
    await session.append_records([{"type": "app.note", "n": 1}, {"type": "app.tag"}], input_id="r-1")
    [entry] = [e for e in await log.read(SID) if e.type == "harness.input.records"]
    assert entry.data["records"] == [{"type": "app.note", "n": 1}, {"type": "app.tag"}]
    assert await session.records() == [{"type": "app.note", "n": 1}, {"type": "app.tag"}]
