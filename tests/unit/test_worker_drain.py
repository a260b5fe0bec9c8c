"""A worker's drain on stop, in-process on a memory log (harness.runtime.partition
``drain``, harness.runtime.driver ``drain``): what runs reaches its next durable
boundary, nothing new starts, durable waits stop at once, and the next owner goes on
from the log as the planner says."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.errors import DefinitionError
from harness.log.memory import MemoryLog
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import (
    InputMessage,
    InputSettled,
    ModelResponseRecord,
    ToolResult,
    ToolStarted,
    TurnStarted,
)
from harness.runtime.worker import Worker

pytestmark = pytest.mark.asyncio


class Args(BaseModel):
    pass


class Ok(BaseModel):
    ok: bool


class Gates:
    """Events the test opens; counts of what ran."""

    def __init__(self) -> None:
        self.model_entered = asyncio.Event()
        self.model_release = asyncio.Event()
        self.step_entered = asyncio.Event()
        self.step_release = asyncio.Event()
        self.shipped = 0
        self.model_calls = 0
        self.steps: list[str] = []  # the step fns of two_steps, in the order they ran


def make_harness(gates: Gates, *, hold_model: bool = False, tool: str = "ship") -> Any:
    async def ship(args: Args, ctx: Any) -> dict[str, Any]:
        async def send() -> str:
            gates.step_entered.set()
            await gates.step_release.wait()
            gates.shipped += 1
            return "sent"

        return {"sent": await ctx.step.do("send", send)}

    async def nap(args: Args, ctx: Any) -> dict[str, Any]:
        await ctx.step.sleep("nap", timedelta(hours=1))
        return {"slept": True}

    async def approve(args: Args, ctx: Any) -> dict[str, Any]:
        answer = await ctx.step.ask("approve", message="ok?", schema=Ok)
        return {"ok": answer.ok}

    async def script(messages: list[dict[str, Any]]) -> ModelResponse:
        if messages[-1]["content"] == "hi":
            return ModelResponse(text="hello")  # (another session: counted nowhere)
        gates.model_calls += 1
        if hold_model and gates.model_calls == 1:
            gates.model_entered.set()
            await gates.model_release.wait()
        if messages[-1]["role"] == "tool":
            return ModelResponse(text="done")
        return ModelResponse(tool_calls=[ToolCall(id="c1", name=tool, arguments={})])

    async def two_steps(args: Args, ctx: Any) -> dict[str, Any]:
        async def first() -> str:
            gates.steps.append("first")
            gates.step_entered.set()
            await gates.step_release.wait()
            return "one"

        def second() -> str:
            gates.steps.append("second")
            return "two"

        return {"first": await ctx.step.do("first", first), "second": await ctx.step.do("second", second)}

    def tool_of(name: str, fn: Any, replay: str = "never") -> Any:
        return durable_tool(tool_definition(name=name, description=name, input_schema=Args), fn, replay=replay)

    return define_harness(
        name="drain", model=ScriptedModel(script),
        tools=[tool_of("ship", ship), tool_of("nap", nap), tool_of("approve", approve),
               tool_of("two_steps", two_steps, replay="safe")],
    )


async def until(predicate: Callable[[], Awaitable[bool]], rounds: int = 4000) -> None:
    for _ in range(rounds):
        if await predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def records(entries: list[Any], kind: type, session: str = "s") -> list[Any]:
    return [e.record for e in entries if isinstance(e.record, kind) and e.session_id == session]


async def start(log: MemoryLog, harness: Any, drain: float = 600.0) -> tuple[Worker, asyncio.Event, asyncio.Task[None]]:
    worker = Worker(log=log, harnesses=[harness], drain_timeout=timedelta(seconds=drain))
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    await worker.ready.wait()
    return worker, stop, run


async def finish(log: MemoryLog, harness: Any) -> list[Any]:
    """A next owner runs the session to its end; the whole log then."""
    _worker, stop, run = await start(log, harness)

    async def settled() -> bool:
        return bool(records(await log.read_all(), InputSettled))

    await until(settled)
    stop.set()
    await run
    return await log.read_all()


async def test_a_model_answer_that_comes_in_while_draining_is_logged_and_its_calls_start_at_the_next_owner() -> None:
    gates = Gates()
    harness = make_harness(gates, hold_model=True)
    log = MemoryLog()
    _, stop, run = await start(log, harness)
    await log.submit(InputMessage("s", 0, "in-1", "ship it", "drain"))
    await gates.model_entered.wait()
    stop.set()  # the model call is in flight
    await asyncio.sleep(0.05)
    assert not run.done(), "the drain waits for the model's answer"
    await log.submit(InputMessage("other", 0, "in-1", "hi", "drain"))  # nothing new starts
    gates.model_release.set()
    await run

    entries = await log.read_all()
    [response] = records(entries, ModelResponseRecord)
    assert [c["name"] for c in response.tool_calls] == ["ship"]
    assert records(entries, ToolStarted) == [], "its calls are not started by a draining owner"
    assert records(entries, TurnStarted, "other") == []
    assert gates.shipped == 0 and gates.model_calls == 1

    gates.step_release.set()
    entries = await finish(log, harness)
    [result] = records(entries, ToolResult)
    assert (result.is_error, result.content) == (False, {"sent": "sent"})  # a first run, not a cut
    assert [s.attempt for s in records(entries, ToolStarted)] == [1]
    assert gates.shipped == 1 and gates.model_calls == 2, "the logged answer is not asked for again"
    assert records(entries, InputSettled)[0].outcome == "completed"


async def test_a_running_step_finishes_and_its_result_is_logged_before_the_worker_stops() -> None:
    gates = Gates()
    harness = make_harness(gates)
    log = MemoryLog()
    _, stop, run = await start(log, harness)
    await log.submit(InputMessage("s", 0, "in-1", "ship it", "drain"))
    await gates.step_entered.wait()
    stop.set()
    await asyncio.sleep(0.05)
    assert not run.done(), "the drain waits for the running step"
    gates.step_release.set()
    await run
    entries = await log.read_all()
    [result] = records(entries, ToolResult)
    assert not result.is_error and gates.shipped == 1
    assert records(entries, InputSettled) == [], "the next model call is the next owner's"

    entries = await finish(log, harness)
    assert records(entries, InputSettled)[0].outcome == "completed"
    assert len(records(entries, ToolResult)) == 1 and gates.shipped == 1


async def test_a_safe_call_stops_at_its_next_step_boundary_and_the_next_owner_replays_what_finished() -> None:
    """replay="safe": run again from the log it replays its finished steps, so the drain
    stops it before its next step's fn instead of waiting for the whole call."""
    gates = Gates()
    harness = make_harness(gates, tool="two_steps")
    log = MemoryLog()
    _, stop, run = await start(log, harness)
    await log.submit(InputMessage("s", 0, "in-1", "go", "drain"))
    await gates.step_entered.wait()
    stop.set()
    await asyncio.sleep(0.05)
    assert not run.done(), "the step that runs goes on to its result"
    gates.step_release.set()
    async with asyncio.timeout(30):  # (a drain of 600 s: it does not wait for the call's end)
        await run
    entries = await log.read_all()
    assert [e.record.name for e in entries if e.type == "harness.step.result"] == ["first"]
    assert records(entries, ToolResult) == [] and gates.steps == ["first"]

    entries = await finish(log, harness)
    [result] = records(entries, ToolResult)
    assert (result.is_error, result.content) == (False, {"first": "one", "second": "two"})
    assert gates.steps == ["first", "second"], "the finished step is replayed from the log, not run again"


@pytest.mark.parametrize("tool", ["nap", "approve"])
async def test_a_call_in_a_durable_wait_does_not_hold_the_drain(tool: str, caplog: Any) -> None:
    """A sleep or an ask stops at once (with a drain of 600 s the run would not end), and
    the stop does not call it a running session to drain."""
    gates = Gates()
    harness = make_harness(gates, tool=tool)
    log = MemoryLog()
    worker, stop, run = await start(log, harness, drain=600)
    await log.submit(InputMessage("s", 0, "in-1", "wait", "drain"))
    waiting = "harness.sleep.scheduled" if tool == "nap" else "harness.ask.opened"

    async def parked() -> bool:
        sessions = [rt.sessions.get("s") for rt in worker.runtimes.values()]
        return any(e.type == waiting for e in await log.read_all()) and any(
            s is not None and s.busy and s.drained for s in sessions
        )

    await until(parked)
    with caplog.at_level("INFO", logger="harness"):
        stop.set()
        async with asyncio.timeout(30):
            await run
    assert records(await log.read_all(), ToolResult) == [], "the wait resumes at the next owner"
    assert "running session" not in caplog.text, caplog.text


async def test_a_drain_that_times_out_stops_the_call_the_recoverable_way() -> None:
    gates = Gates()
    harness = make_harness(gates)
    log = MemoryLog()
    _, stop, run = await start(log, harness, drain=0.05)
    await log.submit(InputMessage("s", 0, "in-1", "ship it", "drain"))
    await gates.step_entered.wait()
    stop.set()
    await run  # never released: cut at the deadline
    assert records(await log.read_all(), ToolResult) == []
    entries = await finish(log, harness)
    [result] = records(entries, ToolResult)
    assert result.is_error and result.code == "cut" and gates.shipped == 0


async def test_a_negative_drain_timeout_is_refused() -> None:
    with pytest.raises(DefinitionError, match="drain_timeout=\\) must be zero or more"):
        Worker(log=MemoryLog(), harnesses=[make_harness(Gates())], drain_timeout=timedelta(seconds=-1))


async def test_the_worker_reads_its_drain_timeout_from_a_flag_or_the_environment() -> None:
    from harness.errors import ConfigError
    from harness.services.worker.main import parse

    assert parse(["--app", "a:b"], {}).drain_timeout == 20
    assert parse(["--app", "a:b", "--drain-timeout", "0"], {}).drain_timeout == 0
    assert parse(["--app", "a:b"], {"HARNESS_DRAIN_TIMEOUT_SECONDS": "7.5"}).drain_timeout == 7.5
    assert parse(["--app", "a:b", "--drain-timeout", "3"], {"HARNESS_DRAIN_TIMEOUT_SECONDS": "7.5"}).drain_timeout == 3
    with pytest.raises(ConfigError, match="HARNESS_DRAIN_TIMEOUT_SECONDS must be a number of seconds >= 0, not -1"):
        parse(["--app", "a:b"], {"HARNESS_DRAIN_TIMEOUT_SECONDS": "-1"})
    with pytest.raises(SystemExit):
        parse(["--app", "a:b", "--drain-timeout", "inf"], {})


async def test_a_sync_safe_call_stops_at_its_next_step_boundary_too() -> None:
    """A sync tool (``def``, run on a thread) has the same boundary as an async one: the
    drain lets its running step finish and stops it before the next step's fn."""
    import threading

    loop = asyncio.get_running_loop()
    entered = asyncio.Event()
    release = threading.Event()
    ran: list[str] = []

    def two_steps(args: Args, ctx: Any) -> dict[str, Any]:
        def first() -> str:
            ran.append("first")
            loop.call_soon_threadsafe(entered.set)
            release.wait(30)
            return "one"

        def second() -> str:
            ran.append("second")
            return "two"

        return {"first": ctx.step.do("first", first), "second": ctx.step.do("second", second)}

    def script(messages: list[dict[str, Any]]) -> ModelResponse:
        if messages[-1]["role"] == "tool":
            return ModelResponse(text="done")
        return ModelResponse(tool_calls=[ToolCall(id="c1", name="two_steps", arguments={})])

    harness = define_harness(name="drain", model=ScriptedModel(script), tools=[durable_tool(
        tool_definition(name="two_steps", description="d", input_schema=Args), two_steps, replay="safe")])
    log = MemoryLog()
    _, stop, run = await start(log, harness)
    await log.submit(InputMessage("s", 0, "in-1", "go", "drain"))
    await entered.wait()
    stop.set()
    await asyncio.sleep(0.05)
    assert not run.done(), "the step that runs goes on to its result"
    release.set()
    async with asyncio.timeout(30):
        await run
    entries = await log.read_all()
    assert [e.record.name for e in entries if e.type == "harness.step.result"] == ["first"]
    assert records(entries, ToolResult) == [] and ran == ["first"]

    entries = await finish(log, harness)
    [result] = records(entries, ToolResult)
    assert (result.is_error, result.content) == (False, {"first": "one", "second": "two"})
    assert ran == ["first", "second"], "the finished step is replayed from the log, not run again"


async def test_a_restart_with_many_waiting_sessions_does_not_log_a_takeover_line_for_each(
    caplog: Any, monkeypatch: Any
) -> None:
    """Taking over a turn parked on an ask is routine (every waiting session, at every
    restart or partition move): its line is a sampled turn line, not one INFO line per
    waiting session (a soak's restart printed 345 of them at once)."""
    from harness.records import AskOpened, TurnResumed
    from harness.runtime import driver
    from harness.runtime.turn_lines import BURST, TurnLines

    harness = make_harness(Gates(), tool="approve")
    log = MemoryLog()
    _, stop, run = await start(log, harness)
    waiting = 3 * BURST
    for k in range(waiting):
        await log.submit(InputMessage(f"w-{k}", 0, "in-1", "approve it", "drain"))

    async def all_asked() -> bool:
        return sum(isinstance(e.record, AskOpened) for e in await log.read_all()) == waiting

    await until(all_asked)
    stop.set()
    await run

    # A full bucket for the restart: the process's is shared, and what ran before spent it
    # (the first run's own turn lines, when an earlier test left INFO on).
    monkeypatch.setattr(driver, "TURN_LINES", TurnLines(driver.log))
    caplog.clear()
    with caplog.at_level("INFO", "harness"):
        _, stop, run = await start(log, harness)

        async def all_taken_over() -> bool:
            return sum(isinstance(e.record, TurnResumed) for e in await log.read_all()) == waiting

        await until(all_taken_over)
        stop.set()
        await run
    lines = [r.getMessage() for r in caplog.records if "took over turn" in r.getMessage()]
    assert lines and all("parked: no attempt used" in line for line in lines)
    assert len(lines) <= 2 * BURST, f"{len(lines)} takeover lines for {waiting} waiting sessions"


async def test_a_cancel_that_comes_while_its_turn_is_being_started_stops_that_turn(monkeypatch: Any) -> None:
    """The turn's start rides with its first model call, so for a moment the log holds no
    turn for the input. A cancel taken then was settled as for a queued input ("aborted",
    no turn finished) and the turn started anyway: its tool ran and parked on its ask for
    good, and the session's next message queued behind it (found by a soak run)."""
    from harness.records import AskOpened, InputCancel, TurnFinished
    from harness.runtime import model_call

    monkeypatch.setattr(model_call, "RIDE_S", 600.0)  # the start waits for the held model answer
    gates = Gates()
    harness = make_harness(gates, hold_model=True, tool="approve")
    log = MemoryLog()
    worker, stop, run = await start(log, harness)
    await log.submit(InputMessage("s", 0, "in-1", "approve it", "drain"))
    await gates.model_entered.wait()
    assert records(await log.read_all(), TurnStarted) == []  # the start is not in the log yet
    await log.submit(InputCancel("s", 0, "cancel:in-1", "in-1"))

    async def cancel_taken() -> bool:
        cores = [rt.sessions.get("s") for rt in worker.runtimes.values()]
        return any(core is not None and "cancel:in-1" in core.state.inputs for core in cores)

    await until(cancel_taken)
    for _ in range(20):  # (whatever the core does with it beside the turn's start)
        await asyncio.sleep(0)
    gates.model_release.set()

    async def settled() -> bool:
        return len(records(await log.read_all(), InputSettled)) >= 2

    await until(settled)
    await log.submit(InputMessage("s", 0, "in-2", "hi", "drain"))  # the session goes on

    async def next_settled() -> bool:
        return any(s.input_id == "in-2" for s in records(await log.read_all(), InputSettled))

    await until(next_settled)
    stop.set()
    await run
    entries = await log.read_all()
    verdicts = {s.input_id: (s.outcome, s.code) for s in records(entries, InputSettled)}
    assert verdicts == {"in-1": ("aborted", "cancelled"), "cancel:in-1": ("completed", None),
                        "in-2": ("completed", None)}
    assert [(f.turn, f.outcome) for f in records(entries, TurnFinished)] == [(1, "aborted"), (2, "completed")]
    assert records(entries, AskOpened) == [], "the cancelled turn's tool never got to its ask"
