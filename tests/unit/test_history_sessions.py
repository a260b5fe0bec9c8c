"""The history policy in sessions and chat(): bounded model requests, a whole log, the same
request after a takeover."""

from __future__ import annotations

from typing import Any

import pytest

from harness import History, chat, define_harness, durable_tool, tool_definition
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.replay import conversation, fold

from .conftest import LEASE, Args, Died, DyingLog, crash

SID = "s-1"
SYSTEM = "Be brief."
POLICY = History(max_messages=6)


def one_lookup_per_turn(messages: list[dict[str, Any]]) -> ModelResponse:
    """A tool call after each user message, then the answer (4 messages a turn).

    A function script: a list script counts the assistant messages of the request, which
    dropped turns lower."""
    last = messages[-1]
    if last["role"] == "user":
        return ModelResponse(tool_calls=[ToolCall(id=f"c-{last['content']}", name="work", arguments={"order_id": "1"})])
    return ModelResponse(text=f"done {messages[-2]['tool_calls'][0]['id']}")


def harness_with(model: Any, **options: Any) -> Any:
    async def work(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("look", lambda: {"found": args.order_id})

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), work)
    return define_harness(name="t/history", model=model, tools=[t], system_prompt=SYSTEM, **options)


def non_system(request: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assert request[0] == {"role": "system", "content": SYSTEM}
    return request[1:]


def assert_whole_turns(request: list[dict[str, Any]]) -> None:
    rest = non_system(request)
    assert rest[0]["role"] == "user"
    made = {c["id"] for m in rest if m["role"] == "assistant" for c in m.get("tool_calls", ())}
    answered = [m["tool_call_id"] for m in rest if m["role"] == "tool"]
    assert sorted(answered) == sorted(made)


async def test_a_long_session_sends_bounded_requests_and_the_log_keeps_everything(host, log):
    model = ScriptedModel(one_lookup_per_turn)
    session = await host.open(harness_with(model, history=POLICY), session_id=SID)
    for n in range(8):
        result = await session.send(f"q{n}", input_id=f"in-{n}")
        assert result.text == f"done c-q{n}"
    assert len(model.requests) == 16
    for request in model.requests:
        assert len(non_system(request)) <= 6
        assert_whole_turns(request)
    # Each turn's first request carries the turn before it (1 + 4 messages), its second
    # only itself (3 messages: one more turn would be 7).
    first, second = model.requests[-2], model.requests[-1]
    assert [m["content"] for m in non_system(first) if m["role"] == "user"] == ["q6", "q7"]
    assert [m["content"] for m in non_system(second) if m["role"] == "user"] == ["q7"]
    # The log holds every turn: only the requests were bounded.
    whole = conversation(fold(SID, await log.read(SID)))
    assert [m["content"] for m in whole if m["role"] == "user"] == [f"q{n}" for n in range(8)]
    assert len(whole) == 32


async def test_without_a_policy_every_request_carries_the_whole_conversation(host):
    model = ScriptedModel(one_lookup_per_turn)
    session = await host.open(harness_with(model), session_id=SID)
    for n in range(3):
        await session.send(f"q{n}", input_id=f"in-{n}")
    assert len(non_system(model.requests[-1])) == 11


async def test_a_session_taken_over_sends_the_same_bounded_request(log, hosts, clock):
    """The process dies as it logs turn 5's final answer; the next owner asks the model
    again with exactly the request the first one sent."""
    dying = DyingLog(log, lambda batch: any(r.TYPE == "harness.model.response" and r.text == "done c-q5" for r in batch))
    first_model = ScriptedModel(one_lookup_per_turn)
    first = await hosts(log_=dying, owner_id="a").open(harness_with(first_model, history=POLICY), session_id=SID)
    for n in range(5):
        await first.send(f"q{n}", input_id=f"in-{n}")
    with pytest.raises(Died):
        await first.send("q5", input_id="in-5")
    await crash(first)
    sent_before = first_model.requests[-1]
    assert len(non_system(sent_before)) == 3  # trimmed: the log holds 23 messages by now
    assert len(conversation(fold(SID, await log.read(SID)))) == 23

    clock.advance(LEASE.total_seconds() + 1)
    second_model = ScriptedModel(one_lookup_per_turn)
    second = await hosts(owner_id="b").open(harness_with(second_model, history=POLICY), session_id=SID)
    [result] = await second.recover()
    assert result.text == "done c-q5"
    assert second_model.requests == [sent_before]


async def test_chat_sends_bounded_requests_and_returns_the_whole_conversation():
    model = ScriptedModel(one_lookup_per_turn)
    messages: list[dict[str, Any]] = []
    calls = 0

    async def work(args: Args, ctx: Any) -> Any:
        nonlocal calls
        calls += 1
        return {"found": args.order_id}

    from harness import tool

    t = tool(tool_definition(name="work", description="d", input_schema=Args), work)
    for n in range(4):
        messages = await chat(model=model, messages=[*messages, {"role": "user", "content": f"q{n}"}], tools=[t],
                              system_prompt=SYSTEM, history={"max_messages": 6})
    assert calls == 4
    assert [m["content"] for m in messages if m["role"] == "user"] == ["q0", "q1", "q2", "q3"]
    assert len(messages) == 1 + 16
    for request in model.requests:
        assert len(non_system(request)) <= 6
        assert_whole_turns(request)
    assert [m["content"] for m in model.requests[-1] if m["role"] == "user"] == ["q3"]
