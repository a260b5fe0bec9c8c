"""SPEC 7.5: waiting is not crashing.

A turn parked on ``step.ask`` / ``step.sleep`` with nothing running is taken over
without using an attempt; attempts count only takeovers of work that may have been
running; a final answer already in the log wins over ``attempts_exhausted``.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition

from .conftest import LEASE, Args, CutLog, Died, call, crash, entries, eventually, script

SID = "s-1"
MAX = 2


class Ok(BaseModel):
    ok: bool


def harness_of(execute: Any, *, model: Any = None, max_attempts: int = MAX) -> Any:
    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    return define_harness(
        name="test/attempts",
        model=model or script([call("c1", "work")], "done"),
        tools=[t],
        durability={"max_attempts": max_attempts},
    )


async def test_s7_5_clean_restarts_of_a_turn_waiting_for_a_person_use_no_attempt(hosts, log, other_log):
    async def execute(args: Args, ctx: Any) -> Any:
        return (await ctx.step.ask("confirm", message="ok?", schema=Ok)).ok

    h = harness_of(execute)
    first = await hosts(owner_id="p0").open(h, session_id=SID)
    assert (await first.send("go", input_id="in-1")).outcome == "waiting"
    await first.close()
    for n in range(MAX + 3):  # more clean hand-overs (deploys, SIGTERM) than attempts
        owner = await hosts(log_=other_log(), owner_id=f"p{n + 1}").open(h, session_id=SID)
        [result] = await owner.recover()
        assert result.outcome == "waiting", n
        await owner.close()
    resumed = await entries(log, SID, "harness.turn.resumed")
    assert len(resumed) == MAX + 3
    assert all(not r["counted"] and r["attempt"] == 1 for r in resumed)

    last = await hosts(log_=other_log(), owner_id="last").open(h, session_id=SID)
    result = await last.answer("c1", "confirm", {"ok": True})
    assert result is not None and result.outcome == "completed" and result.text == "done"


async def test_s7_5_crashes_of_a_turn_sleeping_until_later_use_no_attempt(hosts, log, other_log, clock):
    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.sleep("nap", timedelta(days=2))
        return "rested"

    h = harness_of(execute)
    first = await hosts(owner_id="p0").open(h, session_id=SID)
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    await eventually(lambda: clock.sleepers >= 1 and first.state.calls.get("c1") and first.state.calls["c1"].sleeps)
    await crash(first)
    task.cancel()
    for n in range(MAX + 2):  # killed while sleeping, again and again
        clock.advance(LEASE.total_seconds() + 1)
        owner = await hosts(log_=other_log(), owner_id=f"p{n + 1}").open(h, session_id=SID)
        recovering = asyncio.create_task(owner.recover())

        async def sleeping_again(n: int = n) -> bool:
            return clock.sleepers >= 1 and len(await entries(log, SID, "harness.turn.resumed")) == n + 1

        await eventually(sleeping_again)
        await crash(owner)
        recovering.cancel()
    resumed = await entries(log, SID, "harness.turn.resumed")
    assert [r["counted"] for r in resumed] == [False] * (MAX + 2)

    clock.advance(3 * 86400)  # now the sleep is due
    owner = await hosts(log_=other_log(), owner_id="late").open(h, session_id=SID)
    [result] = await owner.recover()
    assert result.outcome == "completed" and result.text == "done"


async def test_s7_5_takeover_of_work_that_may_have_been_running_uses_an_attempt(hosts, log, other_log, clock):
    release = asyncio.Event()

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.do("charge", lambda: 1)
        await release.wait()  # every owner dies while the tool runs
        return "ok"

    h = harness_of(execute)
    first = await hosts(owner_id="p0").open(h, session_id=SID)
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    await eventually(lambda: first.state.calls.get("c1") and first.state.calls["c1"].steps)
    await crash(first)
    task.cancel()
    for n in range(MAX):
        clock.advance(LEASE.total_seconds() + 1)
        owner = await hosts(log_=other_log(), owner_id=f"p{n + 1}").open(h, session_id=SID)
        recovering = asyncio.create_task(owner.recover())
        if n + 2 <= MAX:
            await eventually(lambda owner=owner, n=n: owner.state.calls["c1"].attempts == n + 2)
            await crash(owner)
            recovering.cancel()
        else:
            [result] = await recovering
            assert result.outcome == "failed" and result.code == "attempts_exhausted"
    resumed = await entries(log, SID, "harness.turn.resumed")
    assert all(r["counted"] for r in resumed)


async def test_s7_5_a_sleep_already_due_at_takeover_counts(hosts, log, other_log, clock):
    """The sleeper may have woken and be running when its owner died."""
    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.sleep("nap", timedelta(seconds=5))
        return "rested"

    h = harness_of(execute)
    first = await hosts(owner_id="p0").open(h, session_id=SID)
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    await eventually(lambda: first.state.calls.get("c1") and first.state.calls["c1"].sleeps)
    await crash(first)
    task.cancel()
    clock.advance(LEASE.total_seconds() + 1)
    owner = await hosts(log_=other_log(), owner_id="p1").open(h, session_id=SID)
    [result] = await owner.recover()
    assert result.outcome == "completed"
    [resumed] = await entries(log, SID, "harness.turn.resumed")
    assert resumed["counted"] and resumed["attempt"] == 2


async def test_s7_5_a_final_answer_in_the_log_wins_over_attempts_exhausted(hosts, log, other_log, clock):
    # (The final answer and the turn's end are one append today; an earlier version's
    # owner could die between them, and any log it left must still be carried on.)
    dying = CutLog(log, lambda r: r.TYPE == "harness.turn.finished")
    h = harness_of(lambda a, c: "ok", max_attempts=1)
    first = await hosts(log_=dying, owner_id="p0").open(h, session_id=SID)
    with contextlib.suppress(Died):
        await first.send("go", input_id="in-1")
    await crash(first)
    assert [e.type for e in await log.read(SID)][-1] == "harness.model.response"
    clock.advance(LEASE.total_seconds() + 1)
    owner = await hosts(log_=other_log(), owner_id="p1").open(h, session_id=SID)
    [result] = await owner.recover()  # attempt 2 of max 1, but the answer is in the log
    assert result.outcome == "completed" and result.text == "done"
