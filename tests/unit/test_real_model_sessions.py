"""Durable sessions on the real provider adapters (real SDKs) against the local test server:
the whole loop, streaming to live subscribers, retries on the fake clock, failures, truncation,
keys from the session's secrets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.live import LiveEvent
from harness.models import Pricing, from_uri
from harness.records import LogEntry
from harness.testing.model_server import Fail, ModelServer, Reply

from .conftest import LEASE, entries, raw_bytes, types

SID = "s-1"
KEY = "sk-live-secret-key-0001"


class Order(BaseModel):
    order_id: str


async def until(check: Callable[[], Any], *, timeout: float = 30.0) -> Any:
    """Poll ``check`` (real HTTP is involved) until truthy; fail after ``timeout`` (a guard, not a measure)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError("condition never became true")
        await asyncio.sleep(0.005)


@pytest_asyncio.fixture
async def server() -> AsyncIterator[ModelServer]:
    with ModelServer() as s:
        yield s


@pytest_asyncio.fixture
async def models() -> AsyncIterator[list[Any]]:
    made: list[Any] = []
    yield made
    for model in made:
        await model.aclose()


def provider_uri(server: ModelServer, provider: str) -> str:
    base = server.openai_url if provider == "openai" else server.anthropic_url + "/"
    return f"{provider}+{base}:test-model"


def checkout_harness(model: Any, charges: list[str]) -> Any:
    async def checkout(args: Order, ctx: Any) -> Any:
        charge = await ctx.step.do(f"charge:{args.order_id}", lambda: f"ch-{args.order_id}")
        charges.append(charge)
        return {"charge": charge}

    tool = durable_tool(tool_definition(name="checkout", description="Charge an order", input_schema=Order), checkout)
    return define_harness(name="t/real", model=model, tools=[tool], system_prompt="Be brief.")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_turn_end_to_end_on_a_real_sdk(host, log, server, models, provider):
    model = from_uri(provider_uri(server, provider), api_key=KEY, pricing=Pricing(1.0, 2.0))
    models.append(model)
    charges: list[str] = []
    server.script(
        Reply(text="Charging.", tool_calls=(("call_1", "checkout", {"order_id": "42"}), ("call_2", "checkout", {"order_id": "43"})),
              usage=(1000, 100)),
        Reply(text="Both orders are paid.", usage=(2000, 50)),
    )
    session = await host.open(checkout_harness(model, charges), session_id=SID)
    result = await session.send("pay orders 42 and 43", input_id="in-1")
    assert (result.outcome, result.text) == ("completed", "Both orders are paid.")
    assert sorted(charges) == ["ch-42", "ch-43"]
    first, second = (r.body for r in server.requests)
    # The second request holds the first answer's calls and both results, in the provider's shape.
    if provider == "openai":
        assert first["messages"][0] == {"role": "system", "content": "Be brief."}
        assistant, r1, r2 = second["messages"][2:5]
        assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == ['{"order_id":"42"}', '{"order_id":"43"}']
        assert (r1["role"], r1["tool_call_id"], json.loads(r1["content"])) == ("tool", "call_1", {"charge": "ch-42"})
        assert (r2["tool_call_id"], json.loads(r2["content"])) == ("call_2", {"charge": "ch-43"})
    else:
        assert first["system"] == "Be brief."
        assistant, results = second["messages"][1:3]
        assert [b["type"] for b in assistant["content"]] == ["text", "tool_use", "tool_use"]
        assert [(b["tool_use_id"], json.loads(b["content"])) for b in results["content"]] == [
            ("call_1", {"charge": "ch-42"}), ("call_2", {"charge": "ch-43"}),
        ]
    usage = await entries(log, SID, "harness.model.usage")
    assert [(u["model"], u["input_tokens"], u["output_tokens"]) for u in usage] == [
        ("test-model", 1000, 100), ("test-model", 2000, 50),
    ]
    assert session.usage.calls == 2 and session.usage.cost == pytest.approx((3000 * 1.0 + 150 * 2.0) / 1e6)
    responses = await entries(log, SID, "harness.model.response")
    assert [r["finish_reason"] for r in responses] == ["tool_calls", "stop"]


async def watch_until_settled(session: Any, seen: list[Any]) -> None:
    """Every live event and record of ``session`` into ``seen``, up to its first settlement."""
    async for item in session.events(live=True):
        seen.append(item)
        if isinstance(item, LogEntry) and item.type == "harness.input.settled":
            return


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_streamed_text_reaches_live_subscribers_and_the_log_holds_it_once(host, log, server, models, provider):
    model = from_uri(provider_uri(server, provider), api_key=KEY)
    models.append(model)
    server.script(Reply(text="The quick brown fox jumps.", chunk=5, pause_after=3))
    session = await host.open(define_harness(name="t/real", model=model), session_id=SID)
    seen: list[Any] = []
    watcher = asyncio.create_task(watch_until_settled(session, seen))
    await until(lambda: session._core.live.subscribers == 1)
    send = asyncio.create_task(session.send("tell me", input_id="in-1"))
    await until(lambda: any(isinstance(i, LiveEvent) for i in seen))
    assert await asyncio.to_thread(server.paused.wait, 30)
    # Half-way: deltas reached the subscriber, nothing of the answer is in the log yet.
    assert "harness.model.response" not in await types(log, SID)
    server.release()
    assert (await send).text == "The quick brown fox jumps."
    await watcher
    deltas = [i for i in seen if isinstance(i, LiveEvent)]
    assert "".join(d.text for d in deltas) == "The quick brown fox jumps."
    assert [d.position for d in deltas] == [0, 5, 10, 15, 20, 25]
    log_types = await types(log, SID)
    assert log_types.count("harness.model.response") == 1
    assert len([i for i in seen if isinstance(i, LogEntry)]) == len(log_types)  # no record per delta


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_subscriber_sees_turn_started_before_any_live_text_of_the_turn(host, log, server, models, provider):
    """On either SDK: the turn's start is appended while the answer streams, and read back
    by the subscriber later than deltas are pushed to it; each delta says the position it
    follows (the deterministic twin, a model that streams at once: test_model_calls)."""
    model = from_uri(provider_uri(server, provider), api_key=KEY)
    models.append(model)
    session = await host.open(define_harness(name="t/real", model=model), session_id=SID)
    answer = "The quick brown fox jumps."
    server.script(Reply(text=answer, chunk=5, pause_after=3))
    seen: list[Any] = []
    watcher = asyncio.create_task(watch_until_settled(session, seen))
    await until(lambda: session._core.live.subscribers == 1)
    send = asyncio.create_task(session.send("tell me", input_id="in-1"))
    assert await asyncio.to_thread(server.paused.wait, 30)
    await until(lambda: any(isinstance(i, LiveEvent) for i in seen))
    server.release()
    assert (await send).text == answer
    await watcher
    kinds = ["live" if isinstance(i, LiveEvent) else i.type for i in seen]
    assert kinds.index("harness.turn.started") < kinds.index("live"), kinds
    assert "".join(i.text for i in seen if isinstance(i, LiveEvent)) == answer
    started = next(i for i in seen if isinstance(i, LogEntry) and i.type == "harness.turn.started")
    assert all(i.after is not None and i.after >= started.seq for i in seen if isinstance(i, LiveEvent))


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_429_retry_after_then_success_on_the_fake_clock(host, log, clock, server, models, provider):
    model = from_uri(provider_uri(server, provider), api_key=KEY)
    models.append(model)
    server.script(Fail(429, "Too many requests", headers={"retry-after": "12"}), Reply(text="ok now"))
    session = await host.open(define_harness(name="t/real", model=model), session_id=SID)
    start = clock.now()
    task = asyncio.create_task(session.send("go", input_id="in-1"))
    await until(lambda: clock.sleepers == 1)
    [retry] = await entries(log, SID, "harness.model.retry")
    assert (retry["retry"], retry["status"], retry["kind"]) == (1, 429, "rate_limited")
    assert retry["wait_until"] == round((start + 12) * 1000)
    assert "Too many requests" in retry["error"]
    assert len(server.requests) == 1
    clock.advance(12)
    assert (await task).text == "ok now"
    assert len(server.requests) == 2 and server.requests[0].body == server.requests[1].body


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_stream_cut_half_way_is_retried_and_logged_once(host, log, clock, server, models, provider):
    model = from_uri(provider_uri(server, provider), api_key=KEY)
    models.append(model)
    server.script(Reply(text="this answer gets cut", cut_after=3), Reply(text="whole answer"))
    session = await host.open(define_harness(name="t/real", model=model), session_id=SID)
    task = asyncio.create_task(session.send("go", input_id="in-1"))
    await until(lambda: clock.sleepers == 1)
    clock.advance(60)
    assert (await task).text == "whole answer"
    [retry] = await entries(log, SID, "harness.model.retry")
    assert retry["status"] is None and retry["kind"] == "connection"
    assert [r["text"] for r in await entries(log, SID, "harness.model.response")] == ["whole answer"]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_400_fails_the_turn_at_once_and_the_key_stays_out(host, log, logs, server, models, provider):
    model = from_uri(provider_uri(server, provider), api_key=KEY)
    models.append(model)
    server.script(Fail(400, f"Invalid request: 'tools[0]' is malformed (key {KEY})"), Reply(text="next turn works"))
    session = await host.open(define_harness(name="t/real", model=model), session_id=SID)
    result = await session.send("go", input_id="in-1")
    assert (result.outcome, result.code) == ("failed", "model_error")
    assert "HTTP 400" in (result.error or "") and "'tools[0]' is malformed" in (result.error or "")
    assert KEY not in (result.error or "")
    assert len(server.requests) == 1 and "harness.model.retry" not in await types(log, SID)
    assert (await session.send("again", input_id="in-2")).text == "next turn works"
    assert KEY.encode() not in await raw_bytes(log, logs)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_truncated_answer_from_the_provider_runs_no_call(host, log, server, models, provider):
    model = from_uri(provider_uri(server, provider), api_key=KEY)
    models.append(model)
    charges: list[str] = []
    server.script(
        Reply(text="Charging", tool_calls=(("call_1", "checkout", {"order_id": "42"}), ("call_2", "checkout", '{"order_')),
              finish="length"),
        Reply(text="Sorry, I will be shorter."),
    )
    session = await host.open(checkout_harness(model, charges), session_id=SID)
    result = await session.send("pay", input_id="in-1")
    assert (result.outcome, result.text, charges) == ("completed", "Sorry, I will be shorter.", [])
    results = await entries(log, SID, "harness.tool.result")
    assert [(r["tool_call_id"], r["code"]) for r in results] == [("call_1", "truncated"), ("call_2", "truncated")]
    second = server.requests[1].body
    if provider == "openai":
        tool_msgs = [m for m in second["messages"] if m["role"] == "tool"]
        assert [json.loads(m["content"])["error"] for m in tool_msgs] == ["truncated", "truncated"]
    else:
        blocks = second["messages"][-1]["content"]
        assert [(b["tool_use_id"], b["is_error"]) for b in blocks] == [("call_1", True), ("call_2", True)]


async def test_api_key_from_the_sessions_secrets_never_in_the_log(host, log, logs, server, models):
    model = from_uri(provider_uri(server, "openai"), api_key_secret="openai")
    models.append(model)
    server.script(Reply(text=f"I must not repeat {KEY}"))
    session = await host.open(define_harness(name="t/real", model=model), session_id=SID, secrets={"openai": KEY})
    result = await session.send("go", input_id="in-1")
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert result.text == "I must not repeat [secret:openai]"
    assert KEY.encode() not in await raw_bytes(log, logs)
    other = await host.open(define_harness(name="t/real", model=model), session_id="s-2")  # no secret
    failed = await other.send("go")
    assert (failed.outcome, failed.code) == ("failed", "model_error") and "'openai'" in (failed.error or "")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_500_and_a_timeout_are_retried_with_backoff_then_succeed(host, log, clock, server, models, provider):
    from harness.testing.model_server import Hang

    model = from_uri(provider_uri(server, provider), api_key=KEY, timeout=0.3)
    models.append(model)
    server.script(Fail(500, "internal error"), Hang(), Reply(text="third time"))
    session = await host.open(define_harness(name="t/real", model=model), session_id=SID)
    task = asyncio.create_task(session.send("go", input_id="in-1"))
    for n in (1, 2):
        await until(lambda n=n: clock.sleepers == 1 and len(server.requests) == n)
        retries = await entries(log, SID, "harness.model.retry")
        assert len(retries) == n
        wait = retries[-1]["wait_until"] / 1000 - clock.now()
        assert 2 ** (n - 1) / 2 <= wait <= 2 ** (n - 1)  # 1 s, then 2 s, jittered in [half, all]
        clock.advance(wait)
    server.release()
    assert (await task).text == "third time"
    retries = await entries(log, SID, "harness.model.retry")
    assert [(r["retry"], r["status"], r["kind"]) for r in retries] == [(1, 500, "server_error"), (2, None, "timeout")]


async def test_a_worker_says_at_start_that_a_model_without_a_key_fails_every_turn(server, monkeypatch, caplog):
    import logging

    from harness.log.memory import MemoryLog
    from harness.runtime.worker import Worker

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    keyless = define_harness(name="keyless", model=from_uri(f"openai+{server.openai_url}:gpt-test"), tools=[])
    keyed = define_harness(name="keyed", model=from_uri(f"openai+{server.openai_url}:gpt-test", api_key=KEY), tools=[])
    worker = Worker(log=MemoryLog(), harnesses=[keyless, keyed])
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="harness.worker"):
        task = asyncio.create_task(worker.run(stop))
        await asyncio.wait_for(worker.ready.wait(), 30)
        stop.set()
        await task
    warned = [r.getMessage() for r in caplog.records if "every turn will fail" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("harness keyless:") and "OPENAI_API_KEY" in warned[0], warned


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_broken_json_arguments_from_the_provider_tell_the_model_what_is_wrong(host, log, server, models, provider):
    model = from_uri(provider_uri(server, provider), api_key=KEY)
    models.append(model)
    charges: list[str] = []
    server.script(
        Reply(text="Paying.", tool_calls=(("call_1", "checkout", '{"order_id": "42"'), ("call_2", "checkout", '"42"'))),
        Reply(text="Let me try again."),
    )
    session = await host.open(checkout_harness(model, charges), session_id=SID)
    assert (await session.send("pay", input_id="in-1")).outcome == "completed"
    assert charges == []
    results = {r["tool_call_id"]: r["content"] for r in await entries(log, SID, "harness.tool.result")}
    assert "not valid JSON" in results["call_1"]["message"] and "one JSON object" in results["call_1"]["message"]
    assert "not an object" in results["call_2"]["message"]
    assert all(r["error"] == "invalid_arguments" and "valid dictionary" not in r["message"] for r in results.values())


async def test_chat_gives_a_truncated_call_the_durability_s_error(server, models):
    from harness import chat

    model = from_uri(provider_uri(server, "openai"), api_key=KEY)
    models.append(model)
    charges: list[str] = []
    server.script(Reply(tool_calls=(("call_1", "checkout", '{"order_'),), finish="length"), Reply(text="Shorter now."))
    tools = list(checkout_harness(model, charges).tools.values())
    out = await chat(model=model, messages=[{"role": "user", "content": "pay"}], tools=tools,
                     durability={"truncated_call_error": "Your call was cut: send fewer items per call."})
    tool_message = next(m for m in out if m["role"] == "tool")
    assert json.loads(tool_message["content"])["message"] == "Your call was cut: send fewer items per call."
    assert (charges, out[-1]["content"]) == ([], "Shorter now.")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_chat_does_not_retry_a_stream_callback_that_raises_and_names_it(server, models, provider):
    """The app's callback raising TimeoutError is not the provider timing out: one request,
    StreamCallbackError with its type and message, the session's secret and the key removed."""
    from harness import chat
    from harness.errors import ModelError, StreamCallbackError

    model = from_uri(provider_uri(server, provider), api_key=KEY)
    models.append(model)
    server.script(Reply(text="Hello there."), Reply(text="Hello again."))

    def show(text: str) -> None:
        raise TimeoutError(f"screen busy; token=tok-secret-77 key={KEY}")

    with pytest.raises(StreamCallbackError) as info:
        await chat(model=model, messages=[{"role": "user", "content": "hi"}], stream=show,
                   secrets={"token": "tok-secret-77"}, durability={"model_retries": 2, "model_backoff": 0.01})
    assert not isinstance(info.value, ModelError)
    assert info.value.error_type == "TimeoutError"
    assert "stream= callback raised TimeoutError: screen busy" in str(info.value)
    assert "tok-secret-77" not in str(info.value) and KEY not in str(info.value)
    assert len(server.requests) == 1  # not retried


async def test_chat_names_a_failing_stream_callback_whatever_model_calls_it():
    from harness import chat
    from harness.errors import StreamCallbackError
    from harness.models import ModelResponse

    class Streaming:
        async def complete(self, messages: list[dict[str, Any]], tools: Any, *, stream: Any = None) -> ModelResponse:
            if stream is not None:
                stream("Hel")
            return ModelResponse(text="Hello")

    def show(text: str) -> None:
        raise ValueError("bad widget")

    with pytest.raises(StreamCallbackError, match=r"^the stream= callback raised ValueError: bad widget"):
        await chat(model=Streaming(), messages=[{"role": "user", "content": "hi"}], stream=show)


# -- Anthropic extended thinking with tools ---------------------------------------------------------

THINKING = (
    {"type": "thinking", "thinking": "The user wants order 42 paid. I should call checkout.",
     "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"},
    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"},
)
EXTENDED = {"type": "enabled", "budget_tokens": 2048}


def thinking_model(server: ModelServer, streaming: bool) -> Any:
    from harness.models.anthropic import AnthropicMessages

    return AnthropicMessages(model="claude-test", base_url=server.anthropic_url, api_key=KEY, streaming=streaming,
                             max_tokens=8192, thinking=EXTENDED)


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "whole"])
async def test_thinking_blocks_go_back_first_and_verbatim_on_the_turns_next_call(host, log, server, models, streaming):
    model = thinking_model(server, streaming)
    models.append(model)
    charges: list[str] = []
    server.script(
        Reply(thinking=THINKING, text="Paying.", tool_calls=(("toolu_1", "checkout", {"order_id": "42"}),), chunk=7),
        Reply(text="Order 42 is paid."),
    )
    session = await host.open(checkout_harness(model, charges), session_id=SID)
    result = await session.send("pay order 42", input_id="in-1")
    assert (result.outcome, result.text, charges) == ("completed", "Order 42 is paid.", ["ch-42"])
    assert len(server.requests) == 2  # (the server answers 400 to a tool-use continuation without them)
    first, second = (r.body for r in server.requests)
    assert first["thinking"] == EXTENDED and second["thinking"] == EXTENDED
    assistant = second["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][:2] == [dict(b) for b in THINKING]
    assert [b["type"] for b in assistant["content"][2:]] == ["text", "tool_use"]
    [logged, _] = await entries(log, SID, "harness.model.response")
    assert logged["thinking"] == [dict(b) for b in THINKING]


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "whole"])
async def test_thinking_blocks_come_back_from_the_log_in_a_new_host(hosts, log, other_log, clock, server, models,
                                                                    streaming):
    """The turn parks on an ask after the first call; another host, with a model adapter of
    its own, finishes it: the blocks it sends back can only come from the log."""

    class Ok(BaseModel):
        ok: bool

    async def approve(args: Order, ctx: Any) -> Any:
        answer = await ctx.step.ask("approve", message=f"pay {args.order_id}?", schema=Ok)
        return {"paid": answer.ok}

    def harness_with(model: Any) -> Any:
        tool = durable_tool(tool_definition(name="approve", description="Ask, then pay", input_schema=Order), approve)
        return define_harness(name="t/think", model=model, tools=[tool])

    server.script(
        Reply(thinking=THINKING, tool_calls=(("toolu_1", "approve", {"order_id": "42"}),)),
        Reply(text="Paid after approval."),
    )
    first_model = thinking_model(server, streaming)
    models.append(first_model)
    first = await hosts(owner_id="host-1").open(harness_with(first_model), session_id=SID)
    assert (await first.send("pay 42", input_id="in-1")).outcome == "waiting"
    await first.close()
    clock.advance(LEASE.total_seconds() + 1)

    second_model = thinking_model(server, streaming)
    models.append(second_model)
    second = await hosts(log_=other_log(), owner_id="host-2").open(harness_with(second_model), session_id=SID)
    result = await second.answer("toolu_1", "approve", {"ok": True})
    assert result is not None and (result.outcome, result.text) == ("completed", "Paid after approval.")
    [tool_result] = await entries(log, SID, "harness.tool.result")
    assert (tool_result["content"], tool_result["is_error"]) == ({"paid": True}, False)
    assert len(server.requests) == 2
    assistant = server.requests[1].body["messages"][1]
    assert assistant["content"][:2] == [dict(b) for b in THINKING]
    assert [b["type"] for b in assistant["content"][2:]] == ["tool_use"]


async def test_a_secret_in_thinking_is_replaced_in_the_log_as_in_text(host, log, logs, server, models):
    model = thinking_model(server, True)
    models.append(model)
    secret = "tok-very-secret-0042"
    blocks = ({"type": "thinking", "thinking": f"the token is {secret}", "signature": "c2ln"},)
    server.script(Reply(thinking=blocks, text="Done."))
    session = await host.open(define_harness(name="t/real", model=model), session_id=SID, secrets={"tok": secret})
    assert (await session.send("go", input_id="in-1")).text == "Done."
    [logged] = await entries(log, SID, "harness.model.response")
    assert logged["thinking"] == [{"type": "thinking", "thinking": "the token is [secret:tok]", "signature": "c2ln"}]
    assert secret.encode() not in await raw_bytes(log, logs)


# -- OpenAI-compatible streams without a finish_reason -----------------------------------------------


@pytest.mark.parametrize("calls", [False, True], ids=["text", "tool_calls"])
async def test_a_stream_ended_by_done_without_a_finish_reason_is_complete_and_not_called_again(
    host, log, clock, server, models, calls
):
    model = from_uri(provider_uri(server, "openai"), api_key=KEY)
    models.append(model)
    charges: list[str] = []
    tool_calls = (("call_1", "checkout", {"order_id": "42"}),) if calls else ()
    server.script(Reply(text="Paying." if calls else "Hello.", tool_calls=tool_calls, send_finish=False),
                  Reply(text="Paid.", send_finish=False))
    session = await host.open(checkout_harness(model, charges), session_id=SID)
    task = asyncio.create_task(session.send("go", input_id="in-1"))
    await until(lambda: task.done() or clock.sleepers)  # (a retry would wait on the fake clock)
    assert task.done(), "the answer was taken as cut: a retry is waiting"
    result = task.result()
    assert result.outcome == "completed"
    assert "harness.model.retry" not in await types(log, SID)
    responses = await entries(log, SID, "harness.model.response")
    if calls:
        assert (result.text, charges, len(server.requests)) == ("Paid.", ["ch-42"], 2)
        assert [r["finish_reason"] for r in responses] == ["tool_calls", "stop"]
    else:
        assert (result.text, len(server.requests)) == ("Hello.", 1)
        assert [r["finish_reason"] for r in responses] == ["stop"]


async def test_a_stream_without_done_nor_finish_reason_is_cut_and_retried(host, log, clock, server, models):
    model = from_uri(provider_uri(server, "openai"), api_key=KEY)
    models.append(model)
    server.script(Reply(text="maybe more", send_finish=False, send_done=False), Reply(text="whole answer"))
    session = await host.open(define_harness(name="t/real", model=model), session_id=SID)
    task = asyncio.create_task(session.send("go", input_id="in-1"))
    await until(lambda: clock.sleepers == 1)
    clock.advance(60)
    assert (await task).text == "whole answer"
    [retry] = await entries(log, SID, "harness.model.retry")
    assert retry["kind"] == "stream_cut"
    assert len(server.requests) == 2
    assert [r["text"] for r in await entries(log, SID, "harness.model.response")] == ["whole answer"]


async def test_chat_sends_thinking_blocks_back_too(server, models):
    from harness import chat

    model = thinking_model(server, True)
    models.append(model)
    charges: list[str] = []
    server.script(Reply(thinking=THINKING, tool_calls=(("toolu_1", "checkout", {"order_id": "7"}),)), Reply(text="Paid."))
    tools = list(checkout_harness(model, charges).tools.values())
    out = await chat(model=model, messages=[{"role": "user", "content": "pay 7"}], tools=tools)
    assert (out[-1]["content"], charges) == ("Paid.", ["ch-7"])
    assert next(m for m in out if m["role"] == "assistant")["thinking"] == [dict(b) for b in THINKING]
    assert server.requests[1].body["messages"][1]["content"][:2] == [dict(b) for b in THINKING]


# -- Anthropic extended thinking in an agent_tool sub-agent -------------------------------------------


def thinking_sub_agent(model: Any, charges: list[str], *, ask: bool = False) -> Any:
    """A parent (scripted) whose one tool is an agent_tool: the sub-agent ``model`` pays an
    order with its own checkout tool (which asks a person first when ``ask``)."""
    from harness import agent_tool
    from harness.models import ModelResponse, ScriptedModel, ToolCall

    class Ok(BaseModel):
        ok: bool

    async def checkout(args: Order, ctx: Any) -> Any:
        if ask and not (await ctx.step.ask("approve", message=f"pay {args.order_id}?", schema=Ok)).ok:
            return {"charge": None}
        charge = await ctx.step.do(f"charge:{args.order_id}", lambda: f"ch-{args.order_id}")
        charges.append(charge)
        return {"charge": charge}

    tool = durable_tool(tool_definition(name="checkout", description="Charge an order", input_schema=Order), checkout)
    child = define_harness(name="t/payer", model=model, tools=[tool], system_prompt="Pay orders.")
    pay = agent_tool(tool_definition(name="pay", description="Have an agent pay an order", input_schema=Order), child,
                     prompt=lambda args: f"pay order {args.order_id}")
    parent_model = ScriptedModel([
        ModelResponse(tool_calls=[ToolCall(id="p1", name="pay", arguments={"order_id": "42"})]),
        ModelResponse(text="The agent paid it."),
    ])
    return define_harness(name="t/boss", model=parent_model, tools=[pay]), parent_model


def sub_agent_result(parent_model: Any) -> Any:
    tool = next(m for m in parent_model.requests[-1] if m.get("role") == "tool" and m["tool_call_id"] == "p1")
    return json.loads(tool["content"]), tool["is_error"]


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "whole"])
async def test_an_agent_tool_sub_agent_sends_its_thinking_blocks_back_first_and_verbatim(host, log, server, models,
                                                                                        streaming):
    model = thinking_model(server, streaming)
    models.append(model)
    charges: list[str] = []
    server.script(
        Reply(thinking=THINKING, text="Paying.", tool_calls=(("toolu_1", "checkout", {"order_id": "42"}),), chunk=7),
        Reply(text="Order 42 is paid."),
    )
    parent, parent_model = thinking_sub_agent(model, charges)
    session = await host.open(parent, session_id=SID)
    result = await session.send("pay order 42", input_id="in-1")
    assert (result.outcome, result.text, charges) == ("completed", "The agent paid it.", ["ch-42"])
    assert sub_agent_result(parent_model) == ({"text": "Order 42 is paid."}, False)
    assert len(server.requests) == 2  # (the server answers 400 to a tool-use continuation without them)
    second = server.requests[1].body
    assert second["thinking"] == EXTENDED and second["system"] == "Pay orders."
    assistant = second["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][:2] == [dict(b) for b in THINKING]
    assert [b["type"] for b in assistant["content"][2:]] == ["text", "tool_use"]
    steps = {s["name"]: s["value"] for s in await entries(log, SID, "harness.step.result")}
    assert steps["agent:model:0"]["thinking"] == [dict(b) for b in THINKING]  # stored with the sub-agent's answer
    assert "thinking" not in steps["agent:model:1"]


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "whole"])
async def test_a_sub_agents_thinking_blocks_come_back_from_the_log_in_a_new_host(hosts, log, other_log, clock, server,
                                                                                models, streaming):
    """The sub-agent's tool parks on an ask after its first model call; another host, with a
    model adapter of its own, finishes it: the blocks it sends back can only come from the
    stored step (``agent:model:0``)."""
    server.script(
        Reply(thinking=THINKING, tool_calls=(("toolu_1", "checkout", {"order_id": "42"}),)),
        Reply(text="Paid after approval."),
    )
    charges: list[str] = []
    first_model = thinking_model(server, streaming)
    models.append(first_model)
    first_parent, _ = thinking_sub_agent(first_model, charges, ask=True)
    first = await hosts(owner_id="host-1").open(first_parent, session_id=SID)
    waiting = await first.send("pay 42", input_id="in-1")
    assert waiting.outcome == "waiting" and [a.name for a in waiting.waiting] == ["agent:0.toolu_1:approve"]
    await first.close()
    clock.advance(LEASE.total_seconds() + 1)

    second_model = thinking_model(server, streaming)
    models.append(second_model)
    second_parent, parent_model = thinking_sub_agent(second_model, charges, ask=True)
    second = await hosts(log_=other_log(), owner_id="host-2").open(second_parent, session_id=SID)
    result = await second.answer("p1", "agent:0.toolu_1:approve", {"ok": True})
    assert result is not None and (result.outcome, result.text) == ("completed", "The agent paid it.")
    assert sub_agent_result(parent_model) == ({"text": "Paid after approval."}, False)
    assert charges == ["ch-42"] and len(server.requests) == 2
    assistant = server.requests[1].body["messages"][1]
    assert assistant["content"][:2] == [dict(b) for b in THINKING]
    assert [b["type"] for b in assistant["content"][2:]] == ["tool_use"]


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_an_emoji_split_over_two_stream_events_and_a_lone_surrogate_keep_the_answer(
        host, log, server, models, provider, streaming):
    """A server that cuts text by UTF-16 code units sends an emoji's two surrogates as JSON
    escapes in two events; each decodes as a lone surrogate, which no log can hold: the paid
    answer was lost (the turn failed ``model_error``). Now the pair is joined (a lone one is
    U+FFFD), in the text, the live deltas and a tool call's arguments."""
    model = from_uri(provider_uri(server, provider), api_key=KEY, streaming=streaming)
    models.append(model)
    charges: list[str] = []
    server.script(
        Reply(tool_calls=(("call_1", "checkout", '{"order_id": "\ud83d\ude42"}'),), chunk=1),
        Reply(text="paid \ud83d\ude42 \ud800!", chunk=1),
    )
    if provider == "anthropic" and not streaming:  # (its JSON has the arguments as an object)
        server._script[0] = Reply(tool_calls=(("call_1", "checkout", {"order_id": "\ud83d\ude42"}),))
    session = await host.open(checkout_harness(model, charges), session_id=SID)
    seen: list[Any] = []
    watcher = asyncio.create_task(watch_until_settled(session, seen))
    await until(lambda: session._core.live.subscribers == 1)
    result = await session.send("pay", input_id="in-1")
    await watcher
    assert (result.outcome, result.text) == ("completed", "paid \U0001f642 \ufffd!")
    assert charges == ["ch-\U0001f642"]
    if streaming:
        assert "".join(i.text for i in seen if isinstance(i, LiveEvent)) == "paid \U0001f642 \ufffd!"


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_an_answer_with_unreadable_usage_is_kept(host, log, server, models, provider, streaming):
    """Usage fields a provider fills oddly (``"n/a"``, an object, null) count as 0 tokens: the
    answer is logged. They failed the turn (an ``int()`` error, permanent), the answer lost."""
    model = from_uri(provider_uri(server, provider), api_key=KEY, streaming=streaming)
    models.append(model)
    server.script(Reply(text="fine", usage=("n/a", {"tokens": 3})), Reply(text="again", usage=(None, "5")))
    session = await host.open(define_harness(name="t/real", model=model), session_id=SID)
    assert (await session.send("go", input_id="in-1")).text == "fine"
    assert (await session.send("more", input_id="in-2")).text == "again"
    usage = await entries(log, SID, "harness.model.usage")
    assert [u["input_tokens"] for u in usage] == [0, 0]
    # (Anthropic's stream says output tokens in message_delta; its message_start says 1.)
    assert usage[1]["output_tokens"] == 5
