"""Inputs (issue 7): the same ``input_id`` with another payload is refused, ``input_conflict``,
from ``send``, from ``HarnessClient`` and from any producer; cancel and timeout."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from harness import HarnessHost, define_harness, durable_tool, tool_definition
from harness.client import HarnessClient
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import InputCancel, InputMessage

from .conftest import Args, entries, eventually

SID = "s-1"


class Ok(BaseModel):
    ok: bool


def harness_of(execute: Any = None, *, timeout: timedelta | None = None) -> Any:
    """'go...' messages call the tool; anything else is echoed."""

    def respond(messages: list[dict[str, Any]]) -> ModelResponse:
        last = messages[-1]
        if last["role"] == "user" and last["content"].startswith("go"):
            n = sum(1 for m in messages if m["role"] == "user")
            return ModelResponse(tool_calls=[ToolCall(id=f"c{n}", name="work", arguments={})])
        user = [m for m in messages if m["role"] == "user"][-1]
        return ModelResponse(text=f"re: {user['content']}")

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute or (lambda a, c: "ok"))
    return define_harness(
        name="test/inputs", model=ScriptedModel(respond), tools=[t], durability={"timeout": timeout}
    )


# --- input_conflict -------------------------------------------------------------------------


async def test_send_with_a_used_input_id_and_another_text_is_rejected_input_conflict(hosts, log, other_log):
    session = await hosts(owner_id="a").open(harness_of(), session_id=SID)
    first = await session.send("one", input_id="in-1")
    before = [e.seq for e in await log.read(SID)]
    refused = await session.send("something else", input_id="in-1")
    assert (refused.outcome, refused.code) == ("rejected", "input_conflict")
    assert await session.send("one", input_id="in-1") == first  # a true resend: its result
    other = await hosts(log_=other_log(), owner_id="b").open(harness_of(), session_id=SID)
    assert (await other.send("yet another", input_id="in-1")).code == "input_conflict"
    assert [e.seq for e in await log.read(SID)] == before  # nothing written


async def test_a_producer_reusing_an_input_id_with_another_payload_is_refused(hosts, log, other_log):
    session = await hosts(owner_id="a").open(harness_of(), session_id=SID)
    assert (await session.send("one", input_id="in-1")).text == "re: one"
    dup = await other_log().submit(InputMessage(SID, 0, "in-1", "two", "test/inputs"))

    def refused() -> Any:
        c = session.state.conflicts.get(dup.seq)
        return c is not None and c.settled is not None

    await eventually(refused)
    settled = [s for s in await entries(log, SID, "harness.input.settled") if s["input_id"] == "in-1"]
    assert [(s["outcome"], s["code"], s["input_seq"]) for s in settled] == [
        ("completed", None, None),
        ("rejected", "input_conflict", dup.seq),
    ]
    assert [f["text"] for f in await entries(log, SID, "harness.turn.finished")] == ["re: one"]  # "two" never ran


async def test_harness_client_sees_its_conflicting_send_refused(hosts, log, other_log):
    session = await hosts(owner_id="a").open(harness_of(), session_id=SID)
    assert (await session.send("one", input_id="in-1")).outcome == "completed"
    client = HarnessClient(log=other_log())
    await client.send(SID, "two", harness="test/inputs", input_id="in-1")
    verdict = await client.wait_settled(SID, "in-1", timeout=30)
    assert (verdict.outcome, verdict.code) == ("rejected", "input_conflict")
    await client.send(SID, "three", harness="test/inputs", input_id="in-3")
    assert (await client.wait_settled(SID, "in-3", timeout=30)).outcome == "completed"


async def test_a_clients_resend_waits_on_the_first_record_it_sent(hosts, log, other_log):
    """A retry after a lost reply: the resend's receipt still finds the verdict the owner
    gave the first record, which may lie before the resend in the log."""
    session = await hosts(owner_id="a").open(harness_of(), session_id=SID)
    client = HarnessClient(log=other_log())
    first = await client.send(SID, "one", harness="test/inputs", input_id="in-1")
    await session.recover()
    settled = await client.wait_settled(SID, first, timeout=30)
    assert settled.outcome == "completed"
    again = await client.send(SID, "one", harness="test/inputs", input_id="in-1")  # the retry
    assert again.position > first.position
    assert await client.wait_settled(SID, again, timeout=30) == settled


async def test_the_same_client_reusing_an_input_id_with_another_text_learns_it_was_refused(hosts, log, other_log):
    """The client remembered the first position it sent under an id and waited on it for
    every later send of that id: a reuse with another text got the first text's answer."""
    session = await hosts(owner_id="a").open(harness_of(), session_id=SID)
    client = HarnessClient(log=other_log())
    first = await client.send(SID, "one", harness="test/inputs", input_id="in-1")
    await session.recover()
    assert (await client.wait_settled(SID, first, timeout=30)).outcome == "completed"
    other = await client.send(SID, "two", harness="test/inputs", input_id="in-1")
    refused = await client.wait_settled(SID, other, timeout=30)
    assert (refused.outcome, refused.code) == ("rejected", "input_conflict")
    assert (await client.wait_settled(SID, "in-1", timeout=30)).code == "input_conflict"  # (the text sent last)
    # The first text again is a resend: the first record's verdict; the first receipt still has it.
    again = await client.send(SID, "one", harness="test/inputs", input_id="in-1")
    assert (await client.wait_settled(SID, again, timeout=30)).outcome == "completed"
    assert (await client.wait_settled(SID, first, timeout=30)).outcome == "completed"


async def test_two_racing_producers_of_one_input_id_both_learn_the_outcome(hosts, log, other_log):
    producer = other_log()
    a = await producer.submit(InputMessage(SID, 0, "in-1", "first", "test/inputs"))
    b = await producer.submit(InputMessage(SID, 0, "in-1", "second", "test/inputs"))
    session = await hosts(owner_id="a").open(harness_of(), session_id=SID)
    [result] = await session.recover()
    assert result.text == "re: first"
    assert session.state.inputs["in-1"].seq == a.seq
    await eventually(lambda: session.state.conflicts.get(b.seq) and session.state.conflicts[b.seq].settled)
    assert session.state.conflicts[b.seq].settled.code == "input_conflict"


# --- cancel ---------------------------------------------------------------------------------


async def test_cancel_a_turn_waiting_for_a_person_settles_it_aborted(hosts, log):
    async def execute(args: Args, ctx: Any) -> Any:
        return (await ctx.step.ask("ok?", message="?", schema=Ok)).ok

    session = await hosts(owner_id="a").open(harness_of(execute), session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "waiting"
    result = await session.cancel("in-1")
    assert (result.outcome, result.code) == ("aborted", "cancelled")
    [finished] = await entries(log, SID, "harness.turn.finished")
    assert finished["outcome"] == "aborted"
    settled = {s["input_id"]: s["outcome"] for s in await entries(log, SID, "harness.input.settled")}
    assert settled == {"in-1": "aborted", "cancel:in-1": "completed"}
    assert await entries(log, SID, "harness.tool.result") == []
    # The session goes on; the model is told the cancelled call ended without a result.
    assert (await session.send("next", input_id="in-2")).text == "re: next"
    assert session.state.calls["c1"].result is None


async def test_cancel_stops_a_running_tool_the_recoverable_way(hosts, log):
    started = asyncio.Event()
    cancelled: list[bool] = []

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.do("first", lambda: 1)
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        await ctx.step.do("never", lambda: 2)
        return "ok"

    session = await hosts(owner_id="a").open(harness_of(execute), session_id=SID)
    sending = asyncio.create_task(session.send("go", input_id="in-1"))
    await started.wait()
    assert (await session.cancel("in-1")).outcome == "aborted"
    assert (await sending).outcome == "aborted"
    assert cancelled == [True]
    assert [s["name"] for s in await entries(log, SID, "harness.step.result")] == ["first"]
    assert await entries(log, SID, "harness.tool.result") == []


async def test_a_cancelled_queued_input_never_runs(hosts, log):
    release = asyncio.Event()

    async def execute(args: Args, ctx: Any) -> Any:
        await release.wait()
        return "ok"

    session = await hosts(owner_id="a").open(harness_of(execute), session_id=SID)
    first = asyncio.create_task(session.send("go", input_id="in-1"))
    await eventually(lambda: session.busy and session.state.calls)
    queued = asyncio.create_task(session.send("queued", input_id="in-2"))
    await eventually(lambda: "in-2" in session.state.inputs)
    assert (await session.cancel("in-2")).outcome == "aborted"
    release.set()
    assert (await first).outcome == "completed"
    assert (await queued).outcome == "aborted"
    assert [s["input_id"] for s in await entries(log, SID, "harness.turn.started")] == ["in-1"]


async def test_a_cancel_record_from_any_producer_stops_the_turn(hosts, log, other_log):
    async def execute(args: Args, ctx: Any) -> Any:
        return (await ctx.step.ask("ok?", message="?", schema=Ok)).ok

    session = await hosts(owner_id="a").open(harness_of(execute), session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "waiting"
    await other_log().submit(InputCancel(SID, 0, "stop-1", "in-1"))
    await eventually(lambda: session.state.inputs["in-1"].settled)
    assert session.state.inputs["in-1"].settled.outcome == "aborted"
    assert session.state.inputs["stop-1"].settled.outcome == "completed"


async def test_harness_client_cancel(hosts, log, other_log):
    async def execute(args: Args, ctx: Any) -> Any:
        return (await ctx.step.ask("ok?", message="?", schema=Ok)).ok

    session = await hosts(owner_id="a").open(harness_of(execute), session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "waiting"
    client = HarnessClient(log=other_log())
    await client.cancel(SID, "in-1")
    verdict = await client.wait_settled(SID, "in-1", timeout=30)
    assert (verdict.outcome, verdict.code) == ("aborted", "cancelled")


async def test_cancel_of_an_unknown_or_settled_input(hosts, log):
    session = await hosts(owner_id="a").open(harness_of(), session_id=SID)
    assert (await session.cancel("nope")).code == "unknown_input"
    done = await session.send("one", input_id="in-1")
    assert await session.cancel("in-1") == done  # too late: it had completed
    settled = {s["input_id"]: s["code"] for s in await entries(log, SID, "harness.input.settled")}
    assert settled["cancel:nope"] == "unknown_input" and settled["cancel:in-1"] == "already_settled"


# --- timeout --------------------------------------------------------------------------------


async def test_durability_timeout_fails_a_turn_from_its_first_start(hosts, log, clock):
    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.sleep("nap", timedelta(hours=1))
        return "rested"

    session = await hosts(owner_id="a").open(harness_of(execute, timeout=timedelta(minutes=5)), session_id=SID)
    sending = asyncio.create_task(session.send("go", input_id="in-1"))
    await eventually(lambda: clock.sleepers >= 2)  # the sleep and the turn's deadline
    clock.advance(299)
    await asyncio.sleep(0.01)
    assert not sending.done()
    clock.advance(1)
    result = await sending
    assert (result.outcome, result.code) == ("failed", "timeout")
    assert await entries(log, SID, "harness.tool.result") == []
    assert (await session.send("next", input_id="in-2")).outcome == "completed"


async def test_timeout_of_a_turn_waiting_for_a_person(hosts, log, clock):
    async def execute(args: Args, ctx: Any) -> Any:
        return (await ctx.step.ask("ok?", message="?", schema=Ok)).ok

    session = await hosts(owner_id="a").open(harness_of(execute, timeout=timedelta(minutes=5)), session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "waiting"
    clock.advance(301)
    await eventually(lambda: session.state.inputs["in-1"].settled)
    assert session.state.inputs["in-1"].settled.code == "timeout"


async def test_harness_client_takes_a_log_url_and_says_what_it_waited_for(tmp_path):
    """``HarnessClient(log="sqlite:///...")`` kept the string and failed later with
    "cannot create weak reference to 'str' object"; a timeout said nothing at all."""
    from harness.errors import LogUnavailable

    url = f"sqlite:///{tmp_path / 'h.db'}"
    with pytest.raises(LogUnavailable, match="no SQLite log at"):
        HarnessClient(log=url)  # a client never creates the log (a typo would make a new one)
    with pytest.raises(TypeError, match="log= takes a session log or its URL"):
        HarnessClient(log=42)  # type: ignore[arg-type]
    async with HarnessHost(log=url) as host:
        session = await host.open(harness_of(), session_id=SID)
        assert (await session.send("one", input_id="in-1")).outcome == "completed"
        async with HarnessClient(log=url) as client:
            assert (await client.wait_settled(SID, "in-1", timeout=30)).outcome == "completed"
            with pytest.raises(TimeoutError) as waited:
                await client.wait_settled(SID, "in-never", timeout=0.2)
            assert "'in-never' of session 's-1' was not settled within 0.2 s" in str(waited.value)
