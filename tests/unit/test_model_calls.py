"""Durable model calls (issue 9) through sessions on memory and SQLite, with models written here:
truncated responses, usage, transient/permanent errors and logged retries, streaming to live
subscribers. The provider adapters are tested against a local HTTP server in test_model_adapters.py."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from harness import Durability, define_harness, durable_tool, tool_definition
from harness.definition import DEFAULT_TRUNCATED_CALL_ERROR
from harness.errors import DefinitionError, ModelError
from harness.live import LiveEvent
from harness.models import ModelResponse, ScriptedModel, ToolCall, ToolSpec, Usage
from harness.models.base import StreamSink, model_keywords
from harness.records import LogEntry
from harness.replay import UsageTotals
from harness.runtime.model_call import backoff_seconds, classify_error

from .conftest import Args, crash, entries, eventually, types

SID = "s-1"


def counting_tool(runs: list[str], *, replay: str = "safe") -> Any:
    async def fn(args: Args, ctx: Any) -> Any:
        runs.append(ctx.tool_call_id)
        return {"ok": args.order_id}

    return durable_tool(tool_definition(name="work", description="d", input_schema=Args), fn, replay=replay)  # type: ignore[arg-type]


class Flaky:
    """A model that raises the given errors first, then answers ``final``."""

    def __init__(self, errors: Sequence[BaseException], final: ModelResponse) -> None:
        self.errors = list(errors)
        self.final = final
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> ModelResponse:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.final


# -- truncated responses ----------------------------------------------------------------------


@pytest.mark.parametrize("replay", ["safe", "never"])
async def test_truncated_response_tool_calls_never_run_and_the_model_is_called_again(host, log, replay):
    runs: list[str] = []
    model = ScriptedModel(
        [
            ModelResponse(
                text="Let me",
                tool_calls=[ToolCall("c1", "work", {"order_id": "4"}), ToolCall("c2", "work", '{"order_id": "4')],
                finish_reason="length",
            ),
            ModelResponse(text="done", finish_reason="stop"),
        ]
    )
    h = define_harness(name="t/models", model=model, tools=[counting_tool(runs, replay=replay)])
    session = await host.open(h, session_id=SID)
    result = await session.send("go", input_id="in-1")
    assert (result.outcome, result.text) == ("completed", "done")
    assert runs == []  # neither call ran, not even replay="safe"
    [first, second] = await entries(log, SID, "harness.model.response")
    assert first["finish_reason"] == "length" and second["finish_reason"] == "stop"
    assert first["tool_calls"][1]["arguments"] == '{"order_id": "4'  # the raw text, as logged
    results = await entries(log, SID, "harness.tool.result")
    assert [(r["tool_call_id"], r["code"], r["is_error"]) for r in results] == [
        ("c1", "truncated", True),
        ("c2", "truncated", True),
    ]
    assert results[0]["content"]["message"] == DEFAULT_TRUNCATED_CALL_ERROR
    assert "harness.tool.started" not in await types(log, SID)
    tool_msgs = [m for m in model.requests[1] if m["role"] == "tool"]
    assert [json.loads(m["content"])["error"] for m in tool_msgs] == ["truncated", "truncated"]


async def test_truncated_call_error_text_is_configurable(host, log):
    model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall("c1", "work", {})], finish_reason="length"), ModelResponse(text="ok")]
    )
    h = define_harness(
        name="t/models", model=model, tools=[counting_tool([])],
        durability=Durability(truncated_call_error="cut: shorter please"),
    )
    await (await host.open(h, session_id=SID)).send("go")
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["content"] == {"error": "truncated", "message": "cut: shorter please"}


async def test_truncated_calls_are_not_run_after_a_crash_either(hosts, log, clock):
    """The decision is the planner's, from the logged finish_reason: a new owner decides the same."""
    runs: list[str] = []
    gate = asyncio.Event()

    async def slow_hook(event: Any, outcome: Any) -> None:
        await gate.wait()  # the owner "dies" while writing the truncated results

    model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall("c1", "work", {})], finish_reason="length"), ModelResponse(text="ok")]
    )
    h1 = define_harness(name="t/models", model=model, tools=[counting_tool(runs)], hooks={"on_after_tool_call": slow_hook})
    s1 = await hosts(owner_id="a").open(h1, session_id=SID)
    task = asyncio.create_task(s1.send("go", input_id="in-1"))
    await eventually(lambda: s1.state.active_turn is not None and s1.state.active_turn.responses)
    await crash(s1)
    task.cancel()
    clock.advance(60)
    h2 = define_harness(name="t/models", model=model, tools=[counting_tool(runs)])
    s2 = await hosts(owner_id="b").open(h2, session_id=SID)
    [result] = await s2.recover()
    assert (result.outcome, result.text, runs) == ("completed", "ok", [])
    [tool_result] = await entries(log, SID, "harness.tool.result")
    assert tool_result["code"] == "truncated"


# -- usage ------------------------------------------------------------------------------------


async def test_usage_one_record_per_completed_call_and_session_totals(host, log):
    model = ScriptedModel(
        [
            ModelResponse(tool_calls=[ToolCall("c1", "work", {})], usage=Usage(100, 10, "m-1", 0.001)),
            ModelResponse(text="done", usage=Usage(130, 4, "m-1", None)),
            ModelResponse(text="again", usage=Usage(200, 6, "m-2", 0.002)),
        ]
    )
    session = await host.open(define_harness(name="t/models", model=model, tools=[counting_tool([])]), session_id=SID)
    await session.send("go", input_id="in-1")
    usage = await entries(log, SID, "harness.model.usage")
    assert [(u["turn"], u["index"], u["model"], u["input_tokens"], u["output_tokens"], u["cost"]) for u in usage] == [
        (1, 0, "m-1", 100, 10, 0.001),
        (1, 1, "m-1", 130, 4, None),
    ]
    seq = [e.type for e in await log.read(SID)]
    # Each usage record is appended with its response, in one batch, right after it.
    assert seq[seq.index("harness.model.response") + 1] == "harness.model.usage"
    await session.send("more", input_id="in-2")
    assert session.usage == UsageTotals(calls=3, input_tokens=430, output_tokens=20, cost=pytest.approx(0.003))
    # A model that reports no usage writes no usage record.
    plain = ScriptedModel([ModelResponse(text="hi")])
    other = await host.open(define_harness(name="t/models", model=plain), session_id="s-2")
    await other.send("go")
    assert "harness.model.usage" not in await types(log, "s-2") and other.usage.calls == 0


async def test_usage_totals_come_back_from_the_log_in_a_new_host(hosts, log):
    model = ScriptedModel([ModelResponse(text="a", usage=Usage(7, 3, "m", 0.5))])
    s1 = await hosts(owner_id="a").open(define_harness(name="t/models", model=model), session_id=SID)
    await s1.send("go")
    await s1.close()
    s2 = await hosts(owner_id="b").open(define_harness(name="t/models", model=model), session_id=SID)
    assert s2.usage == UsageTotals(calls=1, input_tokens=7, output_tokens=3, cost=0.5)


# -- errors and retries -------------------------------------------------------------------------


async def test_permanent_error_fails_the_turn_at_once_with_the_providers_message_secrets_scrubbed(host, log):
    model = Flaky(
        [ModelError("HTTP 401: invalid key sk-SECRET-123 for org", transient=False, status=401, kind="auth")],
        ModelResponse(text="never"),
    )
    h = define_harness(name="t/models", model=model)
    session = await host.open(h, session_id=SID, secrets={"openai": "sk-SECRET-123"})
    result = await session.send("go", input_id="in-1")
    assert (result.outcome, result.code) == ("failed", "model_error")
    assert result.error == "HTTP 401: invalid key [secret:openai] for org"
    assert model.calls == 1
    assert "harness.model.retry" not in await types(log, SID)
    assert "sk-SECRET" not in json.dumps([e.data for e in await log.read(SID)])


async def test_transient_error_is_retried_after_retry_after_and_the_count_is_logged(host, log, clock):
    model = Flaky(
        [
            ModelError("rate limited", transient=True, status=429, retry_after=7.0, kind="rate_limited"),
            ModelError("server error", transient=True, status=503, kind="server_error"),
        ],
        ModelResponse(text="finally"),
    )
    h = define_harness(name="t/models", model=model, durability=Durability(model_backoff=timedelta(seconds=2)))
    session = await host.open(h, session_id=SID)
    start = clock.now()
    task = asyncio.create_task(session.send("go", input_id="in-1"))
    await eventually(lambda: clock.sleepers == 1)
    [retry] = await entries(log, SID, "harness.model.retry")
    assert (retry["turn"], retry["index"], retry["retry"], retry["status"], retry["kind"]) == (1, 0, 1, 429, "rate_limited")
    assert retry["wait_until"] == round((start + 7.0) * 1000)  # Retry-After honoured exactly
    assert model.calls == 1
    clock.advance(6.9)
    await asyncio.sleep(0)
    assert model.calls == 1  # not before the logged deadline
    clock.advance(0.1)
    await eventually(lambda: model.calls == 2 and clock.sleepers == 1)
    second = (await entries(log, SID, "harness.model.retry"))[1]
    assert second["retry"] == 2 and second["status"] == 503
    wait = second["wait_until"] / 1000 - clock.now()
    assert 2.0 <= wait <= 4.0  # backoff 2 s doubled for the 2nd retry, jittered in [half, all]
    clock.advance(4.0)
    result = await task
    assert (result.outcome, result.text, model.calls) == ("completed", "finally", 3)


async def test_bare_timeouts_and_connection_errors_are_transient(host, clock):
    model = Flaky([TimeoutError("read timed out"), ConnectionResetError("reset by peer")], ModelResponse(text="ok"))
    session = await host.open(define_harness(name="t/models", model=model), session_id=SID)
    task = asyncio.create_task(session.send("go"))
    for _ in range(2):
        await eventually(lambda: clock.sleepers == 1)
        clock.advance(120)
    assert (await task).text == "ok"


async def test_retries_exhausted_fail_the_turn_with_model_error(host, log, clock):
    errors = [ModelError(f"overloaded {i}", transient=True, status=529) for i in range(3)]
    model = Flaky(errors, ModelResponse(text="never"))
    h = define_harness(name="t/models", model=model, durability=Durability(model_retries=2))
    session = await host.open(h, session_id=SID)
    task = asyncio.create_task(session.send("go"))
    for _ in range(2):
        await eventually(lambda: clock.sleepers == 1)
        clock.advance(120)
    result = await task
    assert (result.outcome, result.code, model.calls) == ("failed", "model_error", 3)
    assert "failed 3 times" in (result.error or "") and "overloaded 2" in (result.error or "")
    assert [r["retry"] for r in await entries(log, SID, "harness.model.retry")] == [1, 2]


async def test_a_crash_during_backoff_resumes_with_the_same_count_and_deadline(hosts, log, clock):
    first = Flaky([ModelError("busy", transient=True, status=500)], ModelResponse(text="unused"))
    h1 = define_harness(name="t/models", model=first, durability=Durability(model_retries=2))
    s1 = await hosts(owner_id="a").open(h1, session_id=SID)
    task = asyncio.create_task(s1.send("go", input_id="in-1"))
    await eventually(lambda: clock.sleepers == 1)
    [retry] = await entries(log, SID, "harness.model.retry")
    await crash(s1)  # dies during the backoff wait
    task.cancel()
    deadline = retry["wait_until"] / 1000

    assert deadline > clock.now()
    errors = [ModelError("still busy", transient=True, status=502), ModelError("busy again", transient=True, status=502)]
    second = Flaky(errors, ModelResponse(text="unused"))
    h2 = define_harness(name="t/models", model=second, durability=Durability(model_retries=2))
    clock.advance(60)  # past the dead owner's lease (and the deadline)
    s2 = await hosts(owner_id="b").open(h2, session_id=SID)
    recovering = asyncio.create_task(s2.recover())
    await eventually(lambda: second.calls == 1 and clock.sleepers == 1)
    retries = await entries(log, SID, "harness.model.retry")
    assert [r["retry"] for r in retries] == [1, 2]  # the count went on from the log
    clock.advance(120)
    [result] = await recovering
    # Two retries used (one per owner): the third failure is the last.
    assert (result.outcome, result.code) == ("failed", "model_error")
    assert second.calls == 2


async def test_a_new_owner_waits_until_the_logged_deadline(hosts, log, clock):
    first = Flaky([ModelError("busy", transient=True, status=429, retry_after=50.0)], ModelResponse(text="x"))
    s1 = await hosts(owner_id="a").open(define_harness(name="t/models", model=first), session_id=SID)
    task = asyncio.create_task(s1.send("go", input_id="in-1"))
    await eventually(lambda: clock.sleepers == 1)
    await crash(s1)
    task.cancel()
    clock.advance(31)  # past the lease, 19 s before the logged deadline
    second = Flaky([], ModelResponse(text="resumed"))
    s2 = await hosts(owner_id="b").open(define_harness(name="t/models", model=second), session_id=SID)
    recovering = asyncio.create_task(s2.recover())
    await eventually(lambda: clock.sleepers == 1)
    assert second.calls == 0
    clock.advance(19)
    [result] = await recovering
    assert (result.text, second.calls) == ("resumed", 1)



def test_durations_of_durability_take_seconds_as_well_as_timedeltas() -> None:
    d = Durability(model_backoff=0.5, model_backoff_max=30, timeout=300)  # type: ignore[arg-type]
    assert (d.model_backoff, d.model_backoff_max, d.timeout) == (
        timedelta(seconds=0.5), timedelta(seconds=30), timedelta(minutes=5))
    for bad, says in (("5", "not str"), (True, "not bool"), (float("nan"), "finite"), (-1, "positive")):
        with pytest.raises(DefinitionError, match=says):
            Durability(timeout=bad)  # type: ignore[arg-type]


def test_backoff_is_exponential_jittered_capped_and_honours_retry_after():
    d = Durability(model_backoff=timedelta(seconds=1), model_backoff_max=timedelta(seconds=10))
    rng = random.Random(1)
    for retry, (low, high) in {1: (0.5, 1), 2: (1, 2), 3: (2, 4), 4: (4, 8), 5: (5, 10), 9: (5, 10)}.items():
        waits = [backoff_seconds(retry, d, None, rng) for _ in range(50)]
        assert all(low <= w <= high for w in waits) and len(set(waits)) > 1, retry
    assert backoff_seconds(1, d, 3.5, rng) == 3.5
    assert backoff_seconds(1, d, 3600, rng) == 10  # never longer than model_backoff_max
    # Retry-After 0 (or a date already past): the backoff, not an immediate retry
    assert all(1.0 <= backoff_seconds(2, d, 0.0, rng) <= 2.0 for _ in range(20))
    with pytest.raises(DefinitionError):
        Durability(model_retries=-1)
    with pytest.raises(DefinitionError):
        Durability(model_backoff=timedelta(seconds=5), model_backoff_max=timedelta(seconds=1))


def test_error_classification():
    assert classify_error(ModelError("x", transient=True, status=429, retry_after=2)).retry_after == 2
    assert classify_error(ModelError("x", transient=False, status=400)).transient is False
    assert classify_error(TimeoutError()).transient is True
    assert classify_error(ConnectionRefusedError()).transient is True
    assert classify_error(ValueError("bad")).transient is False
    assert classify_error(KeyError("k")).message.startswith("KeyError")


# -- streaming ----------------------------------------------------------------------------------


class Streaming:
    """A model that streams its answer in pieces (and waits for ``gate`` half-way)."""

    def __init__(self, pieces: list[str], gate: asyncio.Event | None = None) -> None:
        self.pieces = pieces
        self.gate = gate

    async def complete(
        self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec], *, stream: StreamSink | None = None
    ) -> ModelResponse:
        for i, piece in enumerate(self.pieces):
            if stream is not None:
                stream(piece)
            if i == len(self.pieces) // 2 and self.gate is not None:
                await self.gate.wait()
        return ModelResponse(text="".join(self.pieces), finish_reason="stop")


async def watch_until_settled(session: Any, seen: list[Any], *, at_wor: Any) -> None:
    """Every live event and record of ``session`` into ``seen``, up to its first settlement;
    ``at_wor()`` when the delta "wor" comes."""
    async for item in session.events(live=True):
        seen.append(item)
        if isinstance(item, LiveEvent) and item.text == "wor":
            at_wor()
        if isinstance(item, LogEntry) and item.type == "harness.input.settled":
            return


def test_model_keywords_are_read_once_at_definition_time():
    class Both:
        async def complete(self, messages: Any, tools: Any, *, stream: Any = None, secrets: Any = None) -> Any: ...

    class Catchall:
        async def complete(self, messages: Any, tools: Any, **kw: Any) -> Any: ...

    assert model_keywords(Both()) == {"stream", "secrets"}
    assert model_keywords(Streaming([])) == {"stream"}
    assert model_keywords(Catchall()) == frozenset() and model_keywords(ScriptedModel([])) == frozenset()
    assert define_harness(name="t/models", model=Both()).model_keywords == {"stream", "secrets"}


async def test_streamed_deltas_reach_live_subscribers_without_a_record_each(host, log):
    gate = asyncio.Event()
    model = Streaming(["Hel", "lo, ", "wor", "ld"], gate)
    session = await host.open(define_harness(name="t/models", model=model), session_id=SID)
    seen: list[Any] = []
    half = asyncio.Event()

    watcher = asyncio.create_task(watch_until_settled(session, seen, at_wor=half.set))
    await eventually(lambda: session._core.live.subscribers == 1)
    send = asyncio.create_task(session.send("hi", input_id="in-1"))
    await half.wait()
    # Half-way through the answer: deltas were delivered, the log has no response yet.
    assert "harness.model.response" not in await types(log, SID)
    gate.set()
    assert (await send).text == "Hello, world"
    await watcher
    deltas = [i for i in seen if isinstance(i, LiveEvent)]
    assert [(d.text, d.position, d.turn, d.index, d.retry) for d in deltas] == [
        ("Hel", 0, 1, 0, 0), ("lo, ", 3, 1, 0, 0), ("wor", 7, 1, 0, 0), ("ld", 10, 1, 0, 0),
    ]
    kinds = [i.type if isinstance(i, LogEntry) else "delta" for i in seen]
    # Every delta comes before the one response record that holds the whole text.
    assert kinds.index("harness.model.response") > max(i for i, k in enumerate(kinds) if k == "delta")
    log_types = await types(log, SID)
    assert log_types.count("harness.model.response") == 1 and len(log_types) == len([k for k in kinds if k != "delta"])


@pytest.mark.parametrize("quick", [False, True])
async def test_live_text_never_comes_before_its_turns_start_nor_after_its_response(host, log, quick):
    """A model streams its first deltas at once, before the turn's start is in the log
    (as a real SDK may, the start being held RIDE_S and then committed, then read back):
    a subscriber still sees harness.turn.started first. A quick answer rides with the start
    (one append): its deltas would come after the response holding them, so none are sent."""
    gate = asyncio.Event()
    model = Streaming(["Hel", "lo, ", "wor", "ld"], None if quick else gate)
    session = await host.open(define_harness(name="t/models", model=model), session_id=SID)
    seen: list[Any] = []

    watcher = asyncio.create_task(watch_until_settled(session, seen, at_wor=gate.set))
    await eventually(lambda: session._core.live.subscribers == 1)
    assert (await session.send("hi", input_id="in-1")).text == "Hello, world"
    await watcher
    kinds = [i.type if isinstance(i, LogEntry) else "delta" for i in seen]
    deltas = [i for i, k in enumerate(kinds) if k == "delta"]
    assert all(kinds.index("harness.turn.started") < i < kinds.index("harness.model.response") for i in deltas), kinds
    assert len(deltas) == (0 if quick else 4), kinds


async def test_events_without_live_yield_only_committed_records(host):
    model = Streaming(["a", "b"])
    session = await host.open(define_harness(name="t/models", model=model), session_id=SID)
    await session.send("hi", input_id="in-1")
    got = []
    async for item in session.events():
        got.append(item)
        if item.type == "harness.input.settled":
            break
    assert all(isinstance(i, LogEntry) for i in got)


async def test_a_model_taking_secrets_gets_the_sessions_secrets(host):
    seen: dict[str, str] = {}

    class KeyFromSecrets:
        async def complete(self, messages: Any, tools: Any, *, secrets: dict[str, str]) -> ModelResponse:
            seen.update(secrets)
            return ModelResponse(text="ok")

    session = await host.open(define_harness(name="t/models", model=KeyFromSecrets()), session_id=SID, secrets={"k": "v"})
    assert (await session.send("go")).text == "ok"
    assert seen == {"k": "v"}


async def test_client_events_live_on_a_log_without_a_live_topic_yield_records_only(host, log):
    from harness.client import HarnessClient

    session = await host.open(define_harness(name="t/models", model=Streaming(["a", "b"])), session_id=SID)
    await session.send("hi", input_id="in-1")
    client = HarnessClient(log=log)
    got = []
    async for item in client.events(SID, live=True):
        got.append(item)
        if isinstance(item, LogEntry) and item.type == "harness.input.settled":
            break
    assert got and all(isinstance(i, LogEntry) for i in got)


# -- plain mode and agent tools follow the same truncation rule ---------------------------------


async def test_chat_plain_mode_streams_and_never_runs_truncated_calls():
    from harness import chat

    runs: list[str] = []

    class Cut(Streaming):
        def __init__(self) -> None:
            super().__init__(["pa", "rt"])
            self.calls = 0

        async def complete(self, messages: Any, tools: Any, *, stream: StreamSink | None = None) -> ModelResponse:
            self.calls += 1
            if self.calls == 1:
                await super().complete(messages, tools, stream=stream)
                return ModelResponse(text="part", tool_calls=[ToolCall("c1", "work", {})], finish_reason="length")
            return ModelResponse(text="done")

    cut = Cut()
    deltas: list[str] = []
    out = await chat(model=cut, messages=[{"role": "user", "content": "go"}], tools=[counting_tool(runs)], stream=deltas.append)
    assert runs == [] and deltas == ["pa", "rt"] and out[-1]["content"] == "done"
    tool_msg = next(m for m in out if m["role"] == "tool")
    assert tool_msg["is_error"] and json.loads(tool_msg["content"])["error"] == "truncated"


async def test_agent_tool_sub_agent_truncated_calls_never_run(host, log):
    from harness import agent_tool

    runs: list[str] = []
    child_model = ScriptedModel(
        [
            ModelResponse(tool_calls=[ToolCall("k1", "work", {"order_id": "1"})], finish_reason="length"),
            ModelResponse(text="child done"),
        ]
    )
    child = define_harness(name="child", model=child_model, tools=[counting_tool(runs)])
    research = agent_tool(tool_definition(name="research", description="d", input_schema=Args), child)
    parent = ScriptedModel([ModelResponse(tool_calls=[ToolCall("p1", "research", {})]), ModelResponse(text="parent done")])
    session = await host.open(define_harness(name="t/models", model=parent, tools=[research]), session_id=SID)
    assert (await session.send("go")).text == "parent done"
    assert runs == []
    child_tool_msg = next(m for m in child_model.requests[1] if m["role"] == "tool")
    assert json.loads(child_tool_msg["content"])["error"] == "truncated"


async def test_live_deltas_never_carry_a_secret_even_split_over_two_deltas(host, log):
    secret = "sk-SECRET-123"
    gate = asyncio.Event()  # the answer waits for its turn's start (a quick one rides with it: no deltas)
    model = Streaming(["my key is sk-SEC", "RET-123", " and s", "k-S is not it"], gate)
    session = await host.open(define_harness(name="t/models", model=model), session_id=SID, secrets={"openai": secret})
    seen: list[LiveEvent] = []

    async def watch() -> None:
        async for item in session.events(live=True):
            if isinstance(item, LiveEvent):
                seen.append(item)
            elif item.type == "harness.turn.started":
                gate.set()
            elif item.type == "harness.input.settled":
                return

    watcher = asyncio.create_task(watch())
    await eventually(lambda: session._core.live.subscribers == 1)
    result = await session.send("go", input_id="in-1")
    await watcher
    assert result.text == "my key is [secret:openai] and sk-S is not it"
    assert all("SEC" not in e.text and "RET-1" not in e.text for e in seen)
    assert "".join(e.text for e in seen) == result.text  # exactly the logged text
    assert [e.position for e in seen] == [sum(len(x.text) for x in seen[:i]) for i in range(len(seen))]


class _LeaksCancel:
    """A model whose complete() lets a CancelledError of its own out (an HTTP client's
    task cancelled inside it) while nobody cancelled the call."""

    async def complete(self, messages: Any, tools: Any) -> Any:
        inner = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.sleep(0)
        inner.cancel()
        return await inner


@pytest.mark.timeout(20)
async def test_a_cancelled_error_out_of_the_model_fails_the_turn_not_stalls_it(host, log):
    """It was taken for the turn's own cancellation: the turn stopped, send() never
    returned. It fails the turn as a model error now; chat() raises it as one."""
    from harness import chat

    session = await host.open(define_harness(name="t/leak", model=_LeaksCancel()), session_id="s-1")
    result = await asyncio.wait_for(session.send("go"), 10)
    assert result.outcome == "failed" and result.code == "model_error"
    assert "CancelledError" in (result.error or "") and "nobody cancelled" in (result.error or "")
    with pytest.raises(ModelError, match="nobody cancelled"):
        await chat(model=_LeaksCancel(), messages=[{"role": "user", "content": "hi"}], tools=[])


@pytest.mark.parametrize(
    ("usage", "says"),
    [
        (Usage(input_tokens="lots"), "usage.input_tokens must be a whole number of tokens, not 'lots'"),  # type: ignore[arg-type]
        (Usage(output_tokens=None), "usage.output_tokens must be a whole number of tokens, not None"),  # type: ignore[arg-type]
        (Usage(input_tokens=float("nan")), "usage.input_tokens must be a whole number of tokens, not nan"),  # type: ignore[arg-type]
        (Usage(input_tokens=10**30), "usage.input_tokens must be a whole number of tokens, not 1000"),
        (Usage(cost="free"), "usage.cost must be a number of dollars or None, not 'free'"),  # type: ignore[arg-type]
        ({"input_tokens": 5}, "usage must be a harness.models.Usage or None, not dict"),
    ],
    ids=["str", "none", "nan", "huge", "cost-str", "dict"],
)
async def test_a_usage_the_log_cannot_hold_fails_the_model_call_not_send(host, log, usage: Any, says: str):
    """An adapter of one's own reporting usage it could not read (``None`` tokens, a
    string, NaN, a dict): ``send`` raised ValueError / TypeError / AttributeError /
    CodecError from inside the library. The model call fails (``model_error``) saying
    what is wrong, as for any value of the model's the log cannot hold."""
    model = ScriptedModel([ModelResponse(text="hi", usage=usage)])
    session = await host.open(define_harness(name="t/usage", model=model), session_id="s-1")
    result = await session.send("go")
    assert result.outcome == "failed" and result.code == "model_error"
    assert says in (result.error or ""), result.error
    assert (await session.send("again", input_id="in-2")).outcome == "failed"  # (the session goes on)
