"""Fewer sequential commits per turn (issue 12; docs/architecture.md "Fewer commits per turn").

A turn of one tool call of three steps is six appends: turn.started with the response
and its batch's tool.started (a model that answers within ``RIDE_S``; a slower one gets
the start appended alone, beside its call), the three steps, the tool's result, the
final answer with the turn's end and the input's settlement.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

import pytest

from harness import define_harness, durable_tool, tool_definition
from harness.errors import LogUnavailable, RecordTooLarge
from harness.log.base import SessionLog
from harness.models import ModelResponse, Usage
from harness.records import LogEntry, Record

from .conftest import LEASE, Args, call, crash, entries, eventually, script

SID = "s-1"


class RecordingLog:
    """A log handle that keeps the record types of every owner append, one list each;
    ``hold(types)`` makes the next append holding one of ``types`` wait for ``release``."""

    def __init__(self, inner: SessionLog) -> None:
        self._inner = inner
        self.appends: list[list[str]] = []
        self.held: asyncio.Event | None = None
        self._hold: set[str] = set()
        self.release = asyncio.Event()
        self.fail: type[Exception] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def hold(self, *types: str, fail: type[Exception] | None = None) -> asyncio.Event:
        self._hold = set(types)
        self.fail = fail
        self.held = asyncio.Event()
        return self.held

    async def claim(self, session_id: str, *, owner: str, lease: timedelta) -> Any:
        return _RecordingWriter(self, await self._inner.claim(session_id, owner=owner, lease=lease))


class _RecordingWriter:
    def __init__(self, log: RecordingLog, inner: Any) -> None:
        self._log = log
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append(self, records: list[Record]) -> list[LogEntry]:
        log = self._log
        types = [r.TYPE for r in records]
        if log._hold & set(types):
            log._hold = set()
            assert log.held is not None
            log.held.set()
            await log.release.wait()
            if log.fail is not None:
                raise log.fail("the log failed this append")
        out: list[LogEntry] = await self._inner.append(records)
        log.appends.append(types)
        return out


def three_steps() -> Any:
    async def execute(args: Args, ctx: Any) -> Any:
        for i in range(3):
            await ctx.step.do(f"s{i}", lambda i=i: i)
        return "ok"

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    return define_harness(name="test/commits", model=script([call("c1", "work")], "done"), tools=[t])


async def test_a_turn_of_one_tool_call_of_three_steps_is_six_appends(hosts, log):
    recording = RecordingLog(log)
    session = await hosts(log_=recording).open(three_steps(), session_id=SID)
    stats = getattr(log, "stats", None)
    before = stats.appends if stats is not None else 0
    result = await session.send("go", input_id="in-1")
    assert result.outcome == "completed" and result.text == "done"
    assert recording.appends == [
        ["harness.turn.started", "harness.model.response", "harness.tool.started"],
        ["harness.step.result"],
        ["harness.step.result"],
        ["harness.step.result"],
        ["harness.tool.result"],
        ["harness.model.response", "harness.turn.finished", "harness.input.settled"],
    ]
    if stats is not None:  # SQLite counts every append and submit it commits
        assert stats.appends - before == 1 + 6


async def test_s5_7_the_response_and_its_batch_start_land_together_before_any_call_runs(hosts, log):
    ran_with: list[list[str]] = []

    async def execute(args: Args, ctx: Any) -> Any:
        ran_with.append([e.type for e in await log.read(SID)])
        return "ok"

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    h = define_harness(name="test/commits", model=script([call("c1", "work"), call("c2", "work")], "done"), tools=[t])
    session = await hosts().open(h, session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "completed"
    for seen in ran_with:  # each call ran with its response and both starts in the log
        at = seen.index("harness.model.response")
        assert seen[at : at + 3] == ["harness.model.response", "harness.tool.started", "harness.tool.started"]
    assert len(ran_with) == 2


class SlowModel:
    """A model whose first call waits for ``go``; it notes when it was called and cancelled."""

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self.go = asyncio.Event()
        self.cancelled = False

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelResponse:
        self.called.set()
        try:
            await self.go.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return ModelResponse(text="done")


async def test_a_quick_first_answer_rides_in_its_turn_start_append(hosts, log):
    recording = RecordingLog(log)
    model = SlowModel()
    model.go.set()  # answers at once
    session = await hosts(log_=recording).open(define_harness(name="test/commits", model=model), session_id=SID)
    result = await session.send("go", input_id="in-1")
    assert result.outcome == "completed" and result.text == "done"
    assert recording.appends == [
        ["harness.turn.started", "harness.model.response", "harness.turn.finished", "harness.input.settled"],
    ]


async def test_a_slow_first_answer_waits_for_its_turn_start_appended_alone(hosts, log):
    recording = RecordingLog(log)
    model = SlowModel()  # answers when told: well after RIDE_S
    held = recording.hold("harness.turn.started")
    session = await hosts(log_=recording).open(define_harness(name="test/commits", model=model), session_id=SID)
    sending = asyncio.create_task(session.send("go", input_id="in-1"))
    await held.wait()  # the start goes alone while the call runs
    assert model.called.is_set()
    model.go.set()  # the answer comes while the start is in flight: it must wait for it
    for _ in range(20):
        await asyncio.sleep(0)
    assert recording.appends == []  # nothing logged before the turn's start
    recording.release.set()
    result = await sending
    assert result.outcome == "completed" and result.text == "done"
    assert recording.appends == [
        ["harness.turn.started"],
        ["harness.model.response", "harness.turn.finished", "harness.input.settled"],
    ]
    assert [e.type for e in await log.read(SID)] == [
        "harness.input.message",
        "harness.turn.started",
        "harness.model.response",
        "harness.turn.finished",
        "harness.input.settled",
    ]


async def test_a_quick_answer_too_large_for_the_log_fails_a_turn_that_is_in_the_log(hosts, log):
    recording = RecordingLog(log)
    model = SlowModel()
    model.go.set()
    held = recording.hold("harness.model.response", fail=_too_large)
    session = await hosts(log_=recording).open(define_harness(name="test/commits", model=model), session_id=SID)
    sending = asyncio.create_task(session.send("go", input_id="in-1"))
    await held.wait()
    recording.release.set()
    result = await sending
    assert result.outcome == "failed" and result.code == "record_too_large"
    assert recording.appends == [
        ["harness.turn.started"],  # alone, once the answer's append with it was refused
        ["harness.turn.finished", "harness.input.settled"],
    ]
    assert [e.type for e in await log.read(SID)] == [
        "harness.input.message",
        "harness.turn.started",
        "harness.turn.finished",
        "harness.input.settled",
    ]


def _too_large(message: str) -> RecordTooLarge:
    return RecordTooLarge(message, session_id=SID, size=2_000_000)


async def test_a_quick_answer_the_log_cannot_hold_fails_a_turn_that_is_in_the_log(hosts, log):
    recording = RecordingLog(log)
    replies = iter([ModelResponse(text="bad \ud800 text"), ModelResponse(text="done")])

    class Model:
        async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelResponse:
            return next(replies)

    session = await hosts(log_=recording).open(define_harness(name="test/commits", model=Model()), session_id=SID)
    result = await session.send("go", input_id="in-1")
    assert recording.appends[0] == ["harness.turn.started"]  # alone: its answer was refused
    types = [e.type for e in await log.read(SID)]
    assert types[:2] == ["harness.input.message", "harness.turn.started"]
    assert types.count("harness.turn.started") == 1
    assert "harness.model.response" not in types  # the refused answer is not logged
    assert result.outcome == "failed" and result.code == "model_error"


async def test_an_answer_the_log_cannot_hold_still_logs_its_usage(hosts, log):
    """An answer refused before it is logged (a text with no UTF-8 form) was paid for: its
    usage lands with the failed turn's end."""

    class Model:
        async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelResponse:
            return ModelResponse(text="bad \ud800 text", usage=Usage(30, 9, "m-1"))

    session = await hosts().open(define_harness(name="test/commits", model=Model()), session_id=SID)
    result = await session.send("go", input_id="in-1")
    assert result.outcome == "failed" and result.code == "model_error"
    assert [(u["input_tokens"], u["output_tokens"], u["model"]) for u in await entries(log, SID, "harness.model.usage")] == [
        (30, 9, "m-1")
    ]
    assert session.usage.calls == 1


async def test_a_failed_turn_start_cancels_the_model_call_and_logs_nothing_more(hosts, log):
    recording = RecordingLog(log)
    model = SlowModel()
    held = recording.hold("harness.turn.started", fail=LogUnavailable)
    session = await hosts(log_=recording).open(define_harness(name="test/commits", model=model), session_id=SID)
    sending = asyncio.create_task(session.send("go", input_id="in-1"))
    await held.wait()
    await eventually(lambda: model.called.is_set())
    recording.release.set()
    with pytest.raises(LogUnavailable):
        await sending
    assert model.cancelled
    assert [e.type for e in await log.read(SID)] == ["harness.input.message"]


async def test_s7_5_a_crash_during_the_first_model_call_is_a_takeover_that_counts(hosts, log, other_log, clock):
    model = SlowModel()  # never answers: every owner dies during the call
    h = define_harness(name="test/commits", model=model, durability={"max_attempts": 2})
    first = await hosts(owner_id="p0").open(h, session_id=SID)
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    await eventually(lambda: model.called.is_set() and first.state.active_turn is not None)
    await crash(first)
    task.cancel()
    clock.advance(LEASE.total_seconds() + 1)
    model.called.clear()
    second = await hosts(log_=other_log(), owner_id="p1").open(h, session_id=SID)
    recovering = asyncio.create_task(second.recover())
    await eventually(lambda: model.called.is_set())
    [resumed] = await entries(log, SID, "harness.turn.resumed")
    assert resumed["counted"] and resumed["attempt"] == 2
    await crash(second)
    recovering.cancel()
    clock.advance(LEASE.total_seconds() + 1)
    third = await hosts(log_=other_log(), owner_id="p2").open(h, session_id=SID)
    [result] = await third.recover()
    assert result.outcome == "failed" and result.code == "attempts_exhausted"


async def test_a_cancel_during_the_first_model_call_aborts_the_turn(hosts, log):
    model = SlowModel()
    session = await hosts().open(define_harness(name="test/commits", model=model), session_id=SID)
    sending = asyncio.create_task(session.send("go", input_id="in-1"))
    await eventually(lambda: model.called.is_set() and session.state.active_turn is not None)
    cancelled = await session.cancel("in-1")
    assert cancelled.outcome == "aborted"
    assert (await sending).outcome == "aborted"
    assert model.cancelled
    assert "harness.model.response" not in [e.type for e in await log.read(SID)]


async def test_closing_during_the_first_model_call_never_starts_the_turn_twice(hosts, log, other_log):
    model = SlowModel()
    h = define_harness(name="test/commits", model=model)
    first = await hosts(owner_id="p0").open(h, session_id=SID)
    sending = asyncio.create_task(first.send("go", input_id="in-1"))
    await eventually(lambda: model.called.is_set())  # (its turn.started may still be in flight)
    await first.close()
    with contextlib.suppress(Exception):
        await sending
    model.go.set()
    second = await hosts(log_=other_log(), owner_id="p1").open(h, session_id=SID)
    [result] = await second.recover()
    assert result.outcome == "completed"
    assert len(await entries(log, SID, "harness.turn.started")) == 1


@pytest.mark.parametrize("steps", [2, 30])
async def test_a_waiting_send_is_not_woken_by_each_step_result(hosts, log, monkeypatch, steps):
    from harness.runtime.core import SessionCore

    looks: list[str] = []
    real = SessionCore.result_of

    def result_of(self, input_id, seq=None):  # type: ignore[no-untyped-def]
        looks.append(input_id)
        return real(self, input_id, seq)

    monkeypatch.setattr(SessionCore, "result_of", result_of)

    async def execute(args: Args, ctx: Any) -> Any:
        for i in range(steps):
            await ctx.step.do(f"s{i}", lambda i=i: i)
        return "ok"

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    h = define_harness(name="test/commits", model=script([call("c1", "work")], "done"), tools=[t])
    session = await hosts().open(h, session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "completed"
    assert len(looks) <= 8  # a look per append that may decide it, none per step
