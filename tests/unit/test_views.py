"""Session views (``harness.views``): summaries and timelines of folded logs, and purity."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.models import ModelResponse, ScriptedModel
from harness.records import (
    AskAnswered,
    AskOpened,
    InputMessage,
    InputSettled,
    LogEntry,
    ModelResponseRecord,
    ModelRetry,
    ModelUsage,
    StepResult,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnResumed,
    TurnStarted,
)
from harness.replay import fold
from harness.views import (
    SessionSummary,
    Timeline,
    Usage,
    input_queued_behind_person,
    input_waits_for_person,
    preview,
    summarize,
    timeline,
    usage_text,
)

from .conftest import Args, call, eventually, script

SID = "s-1"
ROOT = Path(__file__).resolve().parents[2]


class Approval(BaseModel):
    approved: bool


def harness_of(execute: Any, *, model: Any = None, name: str = "test/views") -> Any:
    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    return define_harness(name=name, model=model or script([call("c1", "work")], "done"), tools=[t])


def now_ms(clock: Any) -> int:
    return int(clock.now() * 1000)


def roundtrip(value: Any) -> Any:
    return json.loads(json.dumps(value))


async def test_completed_session_is_idle_with_its_last_outcome(host, log, clock):
    async def execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("charge", lambda: {"id": "ch_1"})

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "completed"
    entries = await log.read(SID)
    summary = summarize(fold(SID, entries), now_ms=now_ms(clock), last_activity_ms=entries[-1].record.ts)
    assert summary.state == "idle"
    assert (summary.harness, summary.turns, summary.last_outcome, summary.last_code) == ("test/views", 1, "completed", None)
    assert summary.last_activity == entries[-1].record.ts
    assert summary.open_asks == () and summary.pending_inputs == 0
    assert roundtrip(summary.to_json())["state"] == "idle"


async def test_waiting_session_lists_its_open_ask_and_timeline_shows_the_answer(host, log, clock):
    async def execute(args: Args, ctx: Any) -> Any:
        answer = await ctx.step.ask("approval", message="Approve order 42?", schema=Approval)
        return {"approved": answer.approved}

    session = await host.open(harness_of(execute), session_id=SID)
    result = await session.send("go", input_id="in-1")
    assert result.outcome == "waiting"
    state = fold(SID, await log.read(SID))
    summary = summarize(state, now_ms=now_ms(clock))
    assert summary.state == "waiting" and summary.active_input == "in-1"
    [ask] = summary.open_asks
    assert (ask.tool_call_id, ask.name, ask.message) == ("c1", "approval", "Approve order 42?")
    assert roundtrip(summary.to_json())["open_asks"][0]["name"] == "approval"
    [item] = [i for i in timeline(await log.read(SID)) if i.kind == "ask"]
    assert (item.text, item.status, item.depth) == ("Approve order 42?", "open", 2)

    assert (await session.answer("c1", "approval", {"approved": True})).outcome == "completed"
    items = timeline(await log.read(SID))
    [item] = [i for i in items if i.kind == "ask"]
    assert (item.status, item.value) == ("answered", {"approved": True})
    assert [i.kind for i in items if i.kind.startswith(("ask", "input.answer"))] == ["ask", "input.answer", "ask.answered"]
    assert summarize(fold(SID, await log.read(SID)), now_ms=now_ms(clock)).state == "idle"


async def test_sleeping_session_says_until_when_then_runs_when_due(host, log, clock):
    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.sleep("nap", timedelta(seconds=60))
        return "rested"

    session = await host.open(harness_of(execute), session_id=SID)
    task = asyncio.create_task(session.send("go"))
    await eventually(lambda: clock.sleepers == 1)
    entries = await log.read(SID)
    state = fold(SID, entries)
    wake = round((clock.now() + 60) * 1000)
    summary = summarize(state, now_ms=now_ms(clock))
    assert (summary.state, summary.sleeping_until) == ("sleeping", wake)
    assert summarize(state, now_ms=wake).state == "running"  # due: its owner is about to wake it
    [item] = [i for i in timeline(entries) if i.kind == "sleep"]
    assert (item.name, item.wake_at) == ("nap", wake)
    clock.advance(60)
    assert (await task).outcome == "completed"


async def test_failed_turn_makes_the_session_failed_with_its_code(host, log, clock):
    def broken(messages: Any) -> ModelResponse:
        raise RuntimeError("model down")

    async def execute(args: Args, ctx: Any) -> Any:
        return None

    session = await host.open(harness_of(execute, model=ScriptedModel(broken)), session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "failed"
    entries = await log.read(SID)
    summary = summarize(fold(SID, entries), now_ms=now_ms(clock))
    assert (summary.state, summary.last_outcome, summary.last_code) == ("failed", "failed", "model_error")
    items = timeline(entries)
    [finished] = [i for i in items if i.kind == "turn.finished"]
    assert finished.error and finished.code == "model_error" and "model down" in (finished.text or "")
    [message] = [i for i in items if i.kind == "input.message"]
    assert (message.status, message.error) == ("failed", True)


async def test_an_input_nobody_took_yet_is_running(log, clock):
    await log.submit(InputMessage(SID, 1, "in-1", "hello", "test/views"))
    summary = summarize(fold(SID, await log.read(SID)), now_ms=now_ms(clock))
    assert (summary.state, summary.pending_inputs, summary.harness) == ("running", 1, "test/views")


def entry(seq: int, record: Any) -> LogEntry:
    return LogEntry(seq, record)


def takeover_log() -> list[LogEntry]:
    calls = ({"id": "c1", "name": "checkout", "arguments": {"order_id": "42"}},)
    records = [
        InputMessage(SID, 1000, "in-1", "check out order 42", "acme/assistant"),
        TurnStarted(SID, 1001, "in-1", 1),
        ModelResponseRecord(SID, 1002, 1, 0, "on it", calls),
        ToolStarted(SID, 1003, "c1", "checkout", 1),
        StepResult(SID, 1004, "c1", "charge:42", {"id": "ch_1", "amount": 1000}),
        TurnResumed(SID, 2000, "in-1", 1, 2),
        ToolStarted(SID, 2001, "c1", "checkout", 2),
        StepResult(SID, 2002, "c1", "invoice:ch_1", {"id": "inv_1"}),
        ToolResult(SID, 2003, "c1", "checkout", {"charge_id": "ch_1"}),
        ModelResponseRecord(SID, 2004, 1, 1, "Paid."),
        TurnFinished(SID, 2005, "in-1", 1, "completed", "Paid."),
        InputSettled(SID, 2005, "in-1", "completed"),
    ]
    return [entry(i + 1, r) for i, r in enumerate(records)]


def test_timeline_shows_takeovers_attempts_and_steps_in_log_order():
    items = timeline(takeover_log())
    assert [i.kind for i in items] == [
        "input.message", "turn.started", "model.response", "tool.started", "step", "turn.resumed",
        "tool.started", "step", "tool.result", "model.response", "turn.finished", "input.settled",
    ]
    assert [i.attempt for i in items if i.kind == "tool.started"] == [1, 2]
    [resumed] = [i for i in items if i.kind == "turn.resumed"]
    assert (resumed.turn, resumed.attempt) == (1, 2)
    assert [(i.name, i.preview) for i in items if i.kind == "step"] == [
        ("charge:42", '{"id":"ch_1","amount":1000}'), ("invoice:ch_1", '{"id":"inv_1"}')
    ]
    assert items[2].preview == 'checkout(order_id="42")'
    assert items[0].status == "completed"  # the input carries its settlement
    assert [i.depth for i in items[:5]] == [0, 0, 1, 1, 2]
    assert roundtrip([i.to_json() for i in items])[4]["value"] == {"id": "ch_1", "amount": 1000}


def test_a_timeline_made_batch_by_batch_is_the_timeline_of_the_whole():
    """``harness tail`` adds each batch of new records to one Timeline: however the
    session is cut into batches, the items are those of the whole (an input shown
    settled once its settlement came, in a later batch too)."""
    whole = [i.to_json() for i in timeline(takeover_log())]
    entries = takeover_log()
    for cuts in ([], [1], [3, 4], list(range(1, len(entries))), [11]):
        made, got, start = Timeline(), [], 0
        for end in [*cuts, len(entries)]:
            got += made.add(entries[start:end])
            start = end
        assert [i.to_json() for i in got] == whole, cuts
    made = Timeline()
    first = made.add(entries[:1])
    assert first[0].status is None  # not settled yet
    assert [i.kind for i in made.add(entries[1:])][-1] == "input.settled"
    assert first[0].status == "completed"  # the item it returned before learns it


def test_summary_of_a_taken_over_turn_parked_on_an_answered_ask_is_running():
    records = [
        *takeover_log()[:5],
        entry(6, AskOpened(SID, 1005, "c1", "ok", "Sure?", {"type": "object"})),
        entry(7, AskAnswered(SID, 1006, "c1", "ok", {"yes": True}, "a-1")),
    ]
    summary = summarize(fold(SID, records), now_ms=5000)
    assert summary.state == "running" and summary.open_asks == ()  # answered: the tool goes on


def test_a_message_queued_behind_a_turn_that_waits_for_a_person_names_that_turns_input():
    parked = [*takeover_log()[:5], entry(6, AskOpened(SID, 1005, "c1", "ok", "Sure?", {"type": "object"}, 3000))]
    queued = [*parked, entry(7, InputMessage(SID, 1006, "in-2", "again"))]
    state = fold(SID, queued)
    assert input_queued_behind_person(state, "in-2", now_ms=2000) == "in-1"
    assert not input_waits_for_person(state, "in-2", now_ms=2000)  # not its own turn
    assert input_queued_behind_person(state, "in-1", now_ms=2000) is None  # the parked turn's own input
    assert input_queued_behind_person(state, "in-2", now_ms=3000) is None  # the ask expired: the tool goes on
    assert input_queued_behind_person(fold(SID, parked), "in-2", now_ms=2000) is None  # not sent
    answered = fold(SID, [*queued, entry(8, AskAnswered(SID, 1007, "c1", "ok", {}, "a-1"))])
    assert input_queued_behind_person(answered, "in-2", now_ms=2000) is None  # the turn goes on


def test_an_ask_past_its_expiry_waits_for_nobody_its_tool_is_about_to_fail():
    """An unanswered ask whose ``expires_at`` passed cannot be answered (a later answer is
    rejected; its tool raises AskExpired): the session is not waiting for a person, and
    the ask is not listed as open. ``harness send`` once printed 'the turn waits for a
    person' (exit 3) with an answer command for an ask opened already expired."""
    records = [*takeover_log()[:5], entry(6, AskOpened(SID, 1005, "c1", "ok", "Sure?", {"type": "object"}, 3000))]
    state = fold(SID, records)
    before = summarize(state, now_ms=2999)
    assert before.state == "waiting" and [a.name for a in before.open_asks] == ["ok"]
    after = summarize(state, now_ms=3000)
    assert after.state == "running" and after.open_asks == ()


def test_an_ask_its_tool_left_unanswered_reads_expired_past_its_expiry_else_closed():
    """A tool that catches AskExpired and returns ends its ask as much as one that fails with
    it: the timeline says ``expired``; a call that ended before the expiry left it ``closed``."""
    def ask_ended_at(result_ts: int, content: Any, code: str | None = None) -> str | None:
        records = [
            *takeover_log()[:5],
            entry(6, AskOpened(SID, 1005, "c1", "ok", "Sure?", {"type": "object"}, 3000)),
            entry(7, ToolResult(SID, result_ts, "c1", "checkout", content, code is not None, False, code)),
        ]
        [ask] = [i for i in timeline(records) if i.kind == "ask"]
        return ask.status

    assert ask_ended_at(3000, {"approved": False, "note": "nobody answered in time"}) == "expired"
    assert ask_ended_at(2500, {"approved": False}) == "closed"
    assert ask_ended_at(2500, {"type": "AskExpired", "message": "x"}, "tool_failed") == "expired"


def test_preview_is_one_short_line():
    assert preview({"a": "x" * 200}).endswith("…") and len(preview({"a": "x" * 200})) == 72
    assert preview("two\nlines") == "two lines"
    assert preview([1, 2]) == "[1,2]"


def test_partial_summary_is_json():
    summary = SessionSummary(session_id="old", harness=None, state="idle", partial=True)
    assert roundtrip(summary.to_json()) == {
        "session_id": "old", "harness": None, "state": "idle", "last_activity": None, "sleeping_until": None,
        "open_asks": [], "turns": 0, "last_outcome": None, "last_code": None, "active_input": None,
        "pending_inputs": 0, "partial": True,
        "usage": {"calls": 0, "input_tokens": 0, "output_tokens": 0, "cost": None},
    }


def model_calls_log() -> list[LogEntry]:
    """A turn whose first model call failed twice (retried), then answered cut at its output
    limit, then answered in full; every answer with its usage."""
    calls = ({"id": "c1", "name": "checkout", "arguments": {"order_id": "42"}},)
    records = [
        InputMessage(SID, 1000, "in-1", "check out order 42", "acme/assistant"),
        TurnStarted(SID, 1001, "in-1", 1),
        ModelRetry(SID, 1002, 1, 0, 1, 1502, "rate limited: slow down", status=429, kind="rate_limit"),
        ModelRetry(SID, 1503, 1, 0, 2, 2503, "server error", status=500),
        ModelResponseRecord(SID, 2600, 1, 0, "on it", calls, finish_reason="length"),
        ModelUsage(SID, 2600, 1, 0, "gpt-test", 1200, 4096, None),
        ToolResult(SID, 2601, "c1", "checkout", {"error": "cut"}, is_error=True, code="truncated"),
        ModelResponseRecord(SID, 2700, 1, 1, "Paid.", finish_reason="stop"),
        ModelUsage(SID, 2700, 1, 1, "gpt-test", 1300, 40, 0.0042),
        TurnFinished(SID, 2701, "in-1", 1, "completed", "Paid."),
        InputSettled(SID, 2701, "in-1", "completed"),
    ]
    return [entry(i + 1, r) for i, r in enumerate(records)]


def test_timeline_shows_model_retries_truncation_and_usage():
    items = timeline(model_calls_log())
    assert [i.kind for i in items] == [
        "input.message", "turn.started", "model.retry", "model.retry", "model.response", "model.usage",
        "tool.result", "model.response", "model.usage", "turn.finished", "input.settled",
    ]
    first, second = (i for i in items if i.kind == "model.retry")
    assert (first.attempt, first.code, first.text, first.wake_at, first.status, first.error) == (
        1, "rate_limit", "rate limited: slow down", 1502, "retrying", False)
    assert (second.attempt, second.code, second.detail) == (2, "500", {"index": 0, "status": 500})
    cut, full = (i for i in items if i.kind == "model.response")
    assert cut.status == "truncated" and cut.detail["finish_reason"] == "length"
    assert full.status is None and full.detail["finish_reason"] == "stop"
    used = [i for i in items if i.kind == "model.usage"]
    assert [(u.name, u.value, u.depth) for u in used] == [
        ("gpt-test", {"input_tokens": 1200, "output_tokens": 4096, "cost": None}, 1),
        ("gpt-test", {"input_tokens": 1300, "output_tokens": 40, "cost": 0.0042}, 1),
    ]
    assert used[0].preview == "1,200 in / 4,096 out tokens"
    assert used[1].preview == "1,300 in / 40 out tokens, $0.0042"
    assert roundtrip([i.to_json() for i in items])[5]["value"]["output_tokens"] == 4096


def test_summary_totals_the_usage_of_every_model_call():
    summary = summarize(fold(SID, model_calls_log()), now_ms=10_000)
    assert summary.usage == Usage(calls=2, input_tokens=2500, output_tokens=4136, cost=0.0042)
    assert roundtrip(summary.to_json())["usage"] == {"calls": 2, "input_tokens": 2500, "output_tokens": 4136,
                                                      "cost": 0.0042}
    assert summarize(fold(SID, takeover_log()), now_ms=10_000).usage == Usage()  # no usage reported: zero, no cost
    assert usage_text(Usage(3, 10, 20, None)) == "10 in / 20 out tokens"


def test_views_module_imports_no_io_module():
    code = (
        "import json, sys, types\n"
        f"pkg = types.ModuleType('harness'); pkg.__path__ = [{str(ROOT / 'harness')!r}]; sys.modules['harness'] = pkg\n"
        "before = set(sys.modules)\n"
        "import harness.views\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    modules = set(json.loads(out.stdout))
    assert "harness.views" in modules
    forbidden = ("sqlite3", "socket", "asyncio", "confluent_kafka", "threading", "harness.log", "harness.runtime",
                 "harness.codec", "harness.clock")
    assert sorted(m for m in modules for f in forbidden if m == f or m.startswith(f + ".")) == []
