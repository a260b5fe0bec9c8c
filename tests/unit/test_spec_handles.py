"""Session handles (issues 7 and 13): closed handles, idle sessions, concurrent calls.

* After ``close()`` every call on the handle raises ``SessionClosed`` and writes nothing;
  ``close()`` frees the session for the next owner at once; the host forgets it.
* Idle sessions hold no lease and no task of their own (one poller per host).
* Concurrent sends, answers and record appends on one handle, or on several handles of
  one session in one host, are queued in order and each settles once: no FencedError.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.errors import DefinitionError, FencedError, HostClosed, SessionClosed
from harness.models import ModelResponse, ScriptedModel

from .conftest import LEASE, Args, call, entries, eventually, script

SID = "s-1"


def echo() -> Any:
    def respond(messages: list[dict[str, Any]]) -> ModelResponse:
        return ModelResponse(text=f"re: {messages[-1]['content']}")

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), lambda a, c: "ok")
    return define_harness(name="test/handles", model=ScriptedModel(respond), tools=[t])


class Ok(BaseModel):
    ok: bool


async def test_every_call_on_a_closed_handle_raises_session_closed_and_writes_nothing(hosts, log, other_log):
    host = hosts(owner_id="a")
    session = await host.open(echo(), session_id=SID)
    assert (await session.send("one", input_id="in-1")).outcome == "completed"
    await session.close()
    before = [e.seq for e in await log.read(SID)]
    calls = [
        session.send("two", input_id="in-2"),
        session.recover(),
        session.answer("c1", "ask", {"ok": True}),
        session.append_records([{"type": "note"}]),
        session.records(),
        session.cancel("in-1"),
    ]
    for coro in calls:
        with pytest.raises(SessionClosed):
            await coro
    with pytest.raises(SessionClosed):
        async for _ in session.events():
            pass
    assert [e.seq for e in await log.read(SID)] == before
    assert (await log.lease_info(SID)).owner is None
    writer = await other_log().claim(SID, owner="b", lease=LEASE)  # free at once
    await writer.release()
    assert host.open_sessions == 0  # the host forgot it


async def test_open_on_a_closed_host_says_the_host_is_closed_and_writes_nothing(hosts, log):
    host = hosts(owner_id="a")  # (given a log object it does not own: the log stays open)
    await host.close()
    with pytest.raises(HostClosed, match=r"this HarnessHost is closed .*make a new HarnessHost"):
        await host.open(echo(), session_id=SID)
    assert await log.read(SID) == []
    assert host.open_sessions == 0


async def test_close_ends_calls_in_flight_with_session_closed(hosts, log):
    started = asyncio.Event()

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.do("first", lambda: 1)
        started.set()
        await asyncio.Event().wait()  # still running when the handle closes

    h = define_harness(
        name="test/handles",
        model=script([call("c1", "work")], "done"),
        tools=[durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)],
    )
    session = await hosts(owner_id="a").open(h, session_id=SID)
    events: list[str] = []

    async def follow() -> None:
        async for entry in session.events():
            events.append(entry.type)

    following = asyncio.create_task(follow())
    sending = asyncio.create_task(session.send("go", input_id="in-1"))
    await started.wait()
    await eventually(lambda: events)
    before = [e.seq for e in await log.read(SID)]
    await session.close()
    with pytest.raises(SessionClosed):
        await sending
    await following  # a live events() iterator just ends
    assert (await log.lease_info(SID)).owner is None
    assert [e.seq for e in await log.read(SID)] == before  # stopped the recoverable way


async def test_an_owner_waiting_for_a_lease_takes_the_session_once_the_holder_closes_it(hosts, log, other_log, caplog):
    """A closed handle frees the session at once: another process waiting for it notices
    (it looked only when the lease would have run out: a silent wait of up to a lease).
    The fake clock never moves, so only the release can let the waiter in."""
    asked: list[str] = []

    async def execute(args: Args, ctx: Any) -> Any:
        answer = await ctx.step.ask("ok", message="go on?", schema=Ok)
        asked.append(ctx.tool_call_id)
        return answer.ok

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    h = define_harness(name="test/handles", model=script([call("c1", "work")], "done", "again"), tools=[t])
    holder = await hosts(owner_id="b").open(h, session_id=SID)
    assert (await holder.send("go", input_id="in-1")).outcome == "waiting"  # parked on the ask: lease held
    waiter = await hosts(other_log(), owner_id="a").open(h, session_id=SID)
    with caplog.at_level("WARNING", logger="harness"):
        queued = asyncio.ensure_future(waiter.send("and then", input_id="in-2"))
        await eventually(lambda: "waiting for the lease of session s-1, held by b" in caplog.text)
    assert not queued.done()
    await holder.close()
    assert (await queued).outcome == "waiting"  # the waiter now drives it: its turn waits on the ask
    assert (await waiter.answer("c1", "ok", {"ok": True})).outcome == "completed"
    assert asked == ["c1"]


async def test_idle_sessions_hold_no_lease_and_no_task(hosts, log):
    host = hosts(owner_id="a")
    h = echo()
    sessions = [await host.open(h, session_id=f"s-{i}") for i in range(300)]
    await asyncio.gather(*(s.send("hi", input_id="in-1") for s in sessions))
    tasks_before = len(asyncio.all_tasks())

    async def all_released() -> bool:
        infos = [await log.lease_info(s.session_id) for s in sessions]
        return all(i.owner is None for i in infos)

    await eventually(all_released)
    for _ in range(5):
        await asyncio.sleep(0.01)
    assert not any(s.busy for s in sessions)
    # One poller for the host; nothing per session.
    assert len(asyncio.all_tasks()) <= tasks_before
    assert len(asyncio.all_tasks()) < 10


async def test_idle_session_takes_a_message_another_process_put_in_the_log(hosts, log, other_log):
    from harness.records import InputMessage

    session = await hosts(owner_id="a").open(echo(), session_id=SID)
    assert (await session.send("one", input_id="in-1")).outcome == "completed"
    await other_log().submit(InputMessage(SID, 0, "in-2", "two", "test/handles"))
    await eventually(lambda: session.state.inputs.get("in-2") and session.state.inputs["in-2"].settled)
    finished = await entries(log, SID, "harness.turn.finished")
    assert [f["text"] for f in finished] == ["re: one", "re: two"]


@pytest.mark.parametrize("handles", [1, 2])
async def test_concurrent_first_sends_on_fresh_handles_each_settle_once(hosts, log, handles):
    """Issue 13: 20 sends started at once on a fresh handle (or on 2 handles of one session
    in one host) never fence each other; 50 runs catch a 1-in-8 race."""
    h = echo()
    for run in range(50):
        host = hosts(owner_id=f"h{run}")
        sid = f"s-{run}"
        opened = [await host.open(h, session_id=sid) for _ in range(handles)]
        sends = [opened[i % handles].send(f"m{i}", input_id=f"in-{i}") for i in range(20)]
        results = await asyncio.gather(*sends, return_exceptions=True)
        assert not [r for r in results if isinstance(r, BaseException)], (run, results)
        assert [r.text for r in results] == [f"re: m{i}" for i in range(20)]  # type: ignore[union-attr]
        settled = await entries(log, sid, "harness.input.settled")
        assert sorted(s["input_id"] for s in settled) == sorted(f"in-{i}" for i in range(20))
        for s in opened:
            await s.close()


async def test_concurrent_answers_and_appends_on_one_handle_each_settle_once(hosts, log):
    async def execute(args: Args, ctx: Any) -> Any:
        a = await ctx.step.ask("a", message="?", schema=Ok)
        b = await ctx.step.ask("b", message="?", schema=Ok)
        return [a.ok, b.ok]

    h = define_harness(
        name="test/handles",
        model=script([call("c1", "work")], "done"),
        tools=[durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)],
    )
    session = await hosts(owner_id="a").open(h, session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "waiting"
    await eventually(lambda: session.state.calls["c1"].asks)
    results = await asyncio.gather(
        session.answer("c1", "a", {"ok": True}),
        *(session.append_records([{"type": "note", "n": i}], input_id=f"r-{i}") for i in range(10)),
        return_exceptions=True,
    )
    assert not [r for r in results if isinstance(r, FencedError | Exception)], results
    await eventually(lambda: "b" in session.state.calls["c1"].asks)
    assert (await session.answer("c1", "b", {"ok": False})).outcome == "completed"
    assert sorted(r["n"] for r in await session.records()) == list(range(10))
    settled = [s["input_id"] for s in await entries(log, SID, "harness.input.settled")]
    assert len(settled) == len(set(settled)) == 13


async def test_open_refuses_a_session_whose_log_names_another_harness_and_writes_nothing(hosts, log, other_log):
    await (await hosts(owner_id="a").open(echo(), session_id=SID)).send("one", input_id="in-1")
    before = [e.seq for e in await log.read(SID)]
    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), lambda a, c: "other")
    other = define_harness(name="test/other", model=ScriptedModel([ModelResponse(text="no")]), tools=[t])
    host = hosts(log_=other_log(), owner_id="b")  # another process, with another harness under that id
    with pytest.raises(DefinitionError, match=r"session 's-1' runs harness 'test/handles', not 'test/other'"):
        await host.open(other, session_id=SID)
    assert host.open_sessions == 0  # nothing kept of the refused open
    assert [e.seq for e in await log.read(SID)] == before
    session = await host.open(echo(), session_id=SID)  # the right harness opens it
    assert (await session.send("two", input_id="in-2")).outcome == "completed"
