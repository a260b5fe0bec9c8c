"""The session runtime reports to the metrics facade: steps (ran / served from the log),
tool calls by outcome, turns, takeovers, model calls and group commits.

A recording sink is plugged into the process-wide facade for each test; the Prometheus
sink and the dashboard are tested against a real Prometheus in tests/ops.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from harness import define_harness, durable_tool, tool_definition
from harness.observability import metrics

from .conftest import LEASE, Args, call, crash, script

SID = "s-metrics"


class Recorder:
    """A MetricsSink that remembers every event as (method, args)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any, **kw: Any) -> None:
            self.events.append((name, args + tuple(kw.values())))

        return record

    def count(self, name: str, *labels: Any) -> int:
        return sum(1 for n, args in self.events if n == name and args[: len(labels)] == labels)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    sink = Recorder()
    metrics.plug(sink)  # type: ignore[arg-type]  # duck-typed sink
    try:
        yield sink
    finally:
        metrics.plug(None)


def harness_of(execute: Any) -> Any:
    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    return define_harness(name="test/metrics", model=script([call("c1", "work")], "done"), tools=[t])


async def test_a_turn_reports_its_steps_tool_call_turn_and_model_calls(host, log, recorder):
    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.do("one", lambda: 1)
        await ctx.step.do("two", lambda: 2)
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"

    assert recorder.count("step", "test/metrics", "ran") == 2
    assert recorder.count("tool_call", "test/metrics", "work", "ok") == 1
    assert recorder.count("turn", "test/metrics", "completed") == 1
    assert recorder.count("model_call", "test/metrics") == 2  # the call, then the final answer
    if type(log).__name__ == "SqliteLog":  # the memory log has no group commit
        assert recorder.count("group_commit") >= 1
    durations = [args[2] for name, args in recorder.events if name == "step"]
    assert all(isinstance(d, float) and d >= 0 for d in durations)


async def test_a_sync_tools_steps_are_counted_as_an_async_tools_are(host, recorder):
    def execute(args: Args, ctx: Any) -> Any:  # a def tool: it runs on a thread
        ctx.step.do("one", lambda: 1)
        ctx.step.do("two", lambda: 2)
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert recorder.count("step", "test/metrics", "ran") == 2


async def test_a_failing_tool_is_an_error_and_a_refused_call_is_rejected(host, recorder):
    async def execute(args: Args, ctx: Any) -> Any:
        raise RuntimeError("boom")

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    harness = define_harness(
        name="test/metrics",
        model=script([call("c1", "work"), call("c2", "nope"), call("c3", "work", order_id=7)], "done"),
        tools=[t],
    )
    session = await host.open(harness, session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    outcomes = Counter(args[2] for name, args in recorder.events if name == "tool_call")
    assert outcomes == {"error": 1, "rejected": 2}  # unknown tool, invalid arguments


async def test_a_replayed_step_is_served_from_the_log(hosts, log, clock, recorder):
    release = asyncio.Event()
    first_done = asyncio.Event()

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.do("one", lambda: 1)
        first_done.set()
        await release.wait()  # the first process dies here
        await ctx.step.do("two", lambda: 2)
        return "ok"

    h = harness_of(execute)
    first = await hosts(owner_id="a").open(h, session_id=SID)
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    await first_done.wait()
    await crash(first)
    task.cancel()
    clock.advance(LEASE.total_seconds() + 1)
    release.set()
    assert recorder.count("step", "test/metrics", "served") == 0

    second = await hosts(owner_id="b").open(h, session_id=SID)
    [result] = await second.recover()
    assert result.outcome == "completed"
    assert recorder.count("step", "test/metrics", "served") == 1  # "one" came from the log
    assert recorder.count("step", "test/metrics", "ran") == 2  # "one" once, "two" once
    assert recorder.count("turn_attempt", "test/metrics") == 1  # the takeover of a running turn
