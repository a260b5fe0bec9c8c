"""agent_tool: a tool that runs another harness inside its own call (SPEC 5.4)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from pydantic import BaseModel

from harness import agent_tool, chat, define_harness, durable_tool, tool_definition
from harness.models import ModelResponse, ScriptedModel, ToolCall

from .conftest import LEASE, Died, DyingLog, crash, entries

SID = "s-1"


class Topic(BaseModel):
    topic: str


class Ok(BaseModel):
    ok: bool


class Effects:
    def __init__(self) -> None:
        self.lookups = 0


def sub_agent(effects: Effects, *, ask: bool = False) -> Any:
    async def lookup(args: Topic, ctx: Any) -> dict[str, Any]:
        def fetch() -> str:
            effects.lookups += 1
            return f"facts about {args.topic}"

        found = await ctx.step.do("fetch", fetch)
        if ask:
            answer = await ctx.step.ask("approve", message=f"use {found}?", schema=Ok)
            if not answer.ok:
                return {"found": None}
        ctx.append([{"type": "research.done", "topic": args.topic}])
        return {"found": found}

    child_model = ScriptedModel(
        [
            ModelResponse(tool_calls=[ToolCall(id="c1", name="lookup", arguments={"topic": "kafka"})]),
            ModelResponse(text="kafka is a log"),
        ]
    )
    child = define_harness(
        name="researcher",
        model=child_model,
        tools=[durable_tool(tool_definition(name="lookup", description="look up", input_schema=Topic), lookup)],
    )
    research = agent_tool(
        tool_definition(name="research", description="research a topic", input_schema=Topic),
        child,
        prompt=lambda args: f"research {args.topic}",
    )
    parent_model = ScriptedModel(
        [
            ModelResponse(tool_calls=[ToolCall(id="p1", name="research", arguments={"topic": "kafka"})]),
            ModelResponse(text="done"),
        ]
    )
    return define_harness(name="boss", model=parent_model, tools=[research]), child_model, parent_model


def tool_result(model: ScriptedModel, call_id: str) -> dict[str, Any]:
    last = model.requests[-1]
    msg = next(m for m in last if m.get("role") == "tool" and m["tool_call_id"] == call_id)
    return {"content": json.loads(msg["content"]), "is_error": msg["is_error"]}


async def died_at_the_sub_agents_second_call(hosts, log, clock, parent) -> Any:  # type: ignore[no-untyped-def]
    """A first owner dies committing the sub-agent's second model response; the second
    owner's handle of the session, once the first one's lease ran out."""
    dying = DyingLog(log, lambda records: any(getattr(r, "name", "") == "agent:model:1" for r in records))
    first = await hosts(log_=dying, owner_id="first").open(parent, session_id=SID)
    with contextlib.suppress(Died):
        await first.send("go", input_id="in-1")
    await crash(first)
    clock.advance(LEASE.total_seconds() + 1)
    return await hosts(owner_id="second").open(parent, session_id=SID)


async def test_agent_tool_runs_the_sub_harness_and_returns_its_answer(host, log) -> None:
    effects = Effects()
    parent, child_model, parent_model = sub_agent(effects)
    session = await host.open(parent, session_id=SID)
    result = await session.send("go", input_id="in-1")
    assert result.outcome == "completed" and result.text == "done"
    assert tool_result(parent_model, "p1") == {"content": {"text": "kafka is a log"}, "is_error": False}
    assert child_model.requests[0][-1] == {"role": "user", "content": "research kafka"}
    assert effects.lookups == 1
    # The sub-agent's tool records land with the parent tool's result.
    assert await session.records() == [{"type": "research.done", "topic": "kafka"}]
    steps = [s["name"] for s in await entries(log, SID, "harness.step.result")]
    assert steps[0] == "agent:model:0" and "agent:0.c1:fetch" in steps and steps[-1] == "agent:model:1"


async def test_s5_4_agent_call_waiting_for_a_person_keeps_its_place_after_a_crash(hosts, log, clock) -> None:
    effects = Effects()
    parent, child_model, parent_model = sub_agent(effects, ask=True)
    first = await hosts(owner_id="first").open(parent, session_id=SID)
    waiting = await first.send("go", input_id="in-1")
    assert waiting.outcome == "waiting"
    [ask] = waiting.waiting
    assert (ask.tool_call_id, ask.name) == ("p1", "agent:0.c1:approve")
    await crash(first)

    clock.advance(LEASE.total_seconds() + 1)
    second = await hosts(owner_id="second").open(parent, session_id=SID)
    [still] = await second.recover()
    assert still.outcome == "waiting"  # kept its place: not cut
    assert len(child_model.requests) == 1  # the logged model response was not asked again
    done = await second.answer("p1", "agent:0.c1:approve", {"ok": True})
    assert done is not None and done.outcome == "completed"
    assert effects.lookups == 1  # the finished step was served from the log
    assert tool_result(parent_model, "p1")["content"] == {"text": "kafka is a log"}
    assert await second.records() == [{"type": "research.done", "topic": "kafka"}]


async def test_s5_4_agent_call_not_waiting_is_cut(hosts, log, clock) -> None:
    effects = Effects()
    parent, _child_model, parent_model = sub_agent(effects)
    second = await died_at_the_sub_agents_second_call(hosts, log, clock, parent)
    [result] = await second.recover()
    assert result.outcome == "completed"
    cut = tool_result(parent_model, "p1")
    assert cut["is_error"] and cut["content"]["error"] == "cut"
    assert effects.lookups == 1  # never run again
    assert await second.records() == []  # its records never landed


async def test_agent_tool_in_plain_chat() -> None:
    effects = Effects()

    async def lookup(args: Topic, ctx: Any) -> dict[str, Any]:
        return {"found": await ctx.step.do("fetch", lambda: f"facts about {args.topic}")}

    child = define_harness(
        name="researcher",
        model=ScriptedModel(
            [ModelResponse(tool_calls=[ToolCall(id="c1", name="lookup", arguments={"topic": "x"})]), ModelResponse(text="x!")]
        ),
        tools=[durable_tool(tool_definition(name="lookup", description="d", input_schema=Topic), lookup)],
    )
    research = agent_tool(tool_definition(name="research", description="d", input_schema=Topic), child)
    model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(id="p1", name="research", arguments={"topic": "x"})]), ModelResponse(text="ok")]
    )
    messages = await chat(model=model, messages=[{"role": "user", "content": "hi"}], tools=[research])
    tool_msg = next(m for m in messages if m["role"] == "tool")
    assert json.loads(tool_msg["content"]) == {"text": "x!"} and not tool_msg["is_error"]
    assert effects.lookups == 0


class FlakyChild:
    """A sub-agent model that is rate limited once (Retry-After 5 s), then answers."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]], tools: Any) -> ModelResponse:
        from harness.errors import ModelError

        self.calls += 1
        if self.calls == 1:
            raise ModelError("rate limited", transient=True, status=429, retry_after=5.0)
        return ModelResponse(text="after the wait")


async def test_a_sub_agents_transient_model_error_is_retried_inside_its_step(host, log, clock) -> None:
    import asyncio

    from .conftest import eventually

    child_model = FlakyChild()
    child = define_harness(name="researcher", model=child_model)
    research = agent_tool(tool_definition(name="research", description="d", input_schema=Topic), child)
    parent_model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(id="p1", name="research", arguments={"topic": "x"})]), ModelResponse(text="ok")]
    )
    session = await host.open(define_harness(name="boss", model=parent_model, tools=[research]), session_id=SID)
    sent = asyncio.ensure_future(session.send("go", input_id="in-1"))
    await eventually(lambda: child_model.calls == 1 and clock.sleepers >= 1)
    assert not sent.done()  # waiting out Retry-After on the session's clock
    clock.advance(5.1)
    result = await sent
    assert result.outcome == "completed" and child_model.calls == 2
    assert tool_result(parent_model, "p1") == {"content": {"text": "after the wait"}, "is_error": False}
    steps = [s["name"] for s in await entries(log, SID, "harness.step.result")]
    assert steps == ["agent:model:0"]  # one step: the retry left nothing in the log


async def test_a_sub_agents_model_usage_counts_in_the_session_once(hosts, log, clock) -> None:
    """Each model call of a sub-agent that reports usage lands a harness.model.usage of the
    agent tool call, in the same append as the call's step result: the session's totals
    include it, and a crash after it never counts it twice (the step is served)."""
    from harness.models import Usage
    from harness.records import ModelUsage, StepResult

    effects = Effects()
    parent, child_model, parent_model = sub_agent(effects)
    used = [Usage(input_tokens=100 + i, output_tokens=10 + i, model="child-m", cost=0.5) for i in range(2)]
    child_model._responses = [
        ModelResponse(text=r.text, tool_calls=r.tool_calls, usage=u)
        for r, u in zip(child_model._responses, used, strict=True)
    ]
    parent_model._responses = [
        ModelResponse(text=r.text, tool_calls=r.tool_calls, usage=Usage(input_tokens=1000, output_tokens=1, model="boss-m"))
        for r in parent_model._responses
    ]
    second = await died_at_the_sub_agents_second_call(hosts, log, clock, parent)
    [result] = await second.recover()
    assert result.outcome == "completed"

    records = [e.record for e in await log.read(SID)]
    mine = [r for r in records if isinstance(r, ModelUsage) and r.tool_call_id == "p1"]
    assert [(u.index, u.input_tokens, u.output_tokens, u.model) for u in mine] == [(0, 100, 10, "child-m")]
    at = records.index(mine[0])  # right after its step result: one append
    assert isinstance(records[at - 1], StepResult) and records[at - 1].name == "agent:model:0"
    totals = second.usage
    parents = [r for r in records if isinstance(r, ModelUsage) and r.tool_call_id is None]
    assert totals.calls == len(parents) + 1
    assert totals.input_tokens == 1000 * len(parents) + 100 and totals.cost == 0.5


async def test_a_sub_agents_answer_over_the_step_value_limit_says_so(host, log) -> None:
    """A sub-agent's model answer is a step value: over the limit, the message speaks of
    the model's answer and the limit to raise, not of data to store elsewhere."""
    from harness.errors import StepValueTooLarge

    child = define_harness(
        name="talker", model=ScriptedModel([ModelResponse(text="x" * 5000)]), tools=[],
        durability={"step_value_limit": 1000},
    )
    talk = agent_tool(tool_definition(name="talk", description="talk", input_schema=Topic), child)
    parent_model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(id="p1", name="talk", arguments={"topic": "t"})]), ModelResponse(text="ok")]
    )
    parent = define_harness(name="boss", model=parent_model, tools=[talk], durability={"step_value_limit": 1000})
    session = await host.open(parent, session_id=SID)
    result = await session.send("go", input_id="in-1")
    assert result.outcome == "completed"  # (the parent's model is told, as of any failed tool)
    failed = tool_result(parent_model, "p1")
    assert failed["is_error"] and failed["content"]["type"] == StepValueTooLarge.__name__
    message = failed["content"]["message"]
    assert message.startswith("the sub-agent's model answer (step 'agent:model:0') is 50")
    assert "over the step value limit of 1000" in message and "step_value_limit" in message
    assert "store the data elsewhere" not in message



async def test_a_sub_agents_answer_too_large_to_keep_still_logs_its_usage(host, log) -> None:
    """The provider was paid for an answer the log refuses (over the step value limit): its
    usage is logged with the tool call all the same, and the session's totals count it."""
    from harness.models import Usage
    from harness.records import ModelUsage

    child = define_harness(
        name="talker",
        model=ScriptedModel([ModelResponse(text="x" * 5000, usage=Usage(input_tokens=700, output_tokens=1250,
                                                                        model="child-m", cost=0.25))]),
        tools=[], durability={"step_value_limit": 1000},
    )
    talk = agent_tool(tool_definition(name="talk", description="talk", input_schema=Topic), child)
    parent_model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(id="p1", name="talk", arguments={"topic": "t"})]), ModelResponse(text="ok")]
    )
    parent = define_harness(name="boss", model=parent_model, tools=[talk], durability={"step_value_limit": 1000})
    session = await host.open(parent, session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "completed"
    assert tool_result(parent_model, "p1")["is_error"]
    [used] = [r for r in (e.record for e in await log.read(SID)) if isinstance(r, ModelUsage) and r.tool_call_id == "p1"]
    assert (used.input_tokens, used.output_tokens, used.model, used.cost) == (700, 1250, "child-m", 0.25)
    assert session.usage.input_tokens == 700 and session.usage.cost == 0.25

# -- the sub-agent's history policy and its overflow -------------------------------------------------------


class Page(BaseModel):
    page: int


def looping_sub_agent(*, history: Any, approve_at: int | None = None) -> tuple[Any, ScriptedModel, ScriptedModel]:
    """A sub-agent that reads pages 0..5 one tool round at a time (each result 200
    characters), then answers; page ``approve_at`` asks a person first."""

    async def read(args: Page, ctx: Any) -> dict[str, Any]:
        if args.page == approve_at:
            await ctx.step.ask("approve", message=f"read page {args.page}?", schema=Ok)
        return {"text": f"{args.page}" * 200}

    def next_page(messages: list[dict[str, Any]]) -> ModelResponse:
        # (a function script: the requests are trimmed, so no count of messages would do)
        last = messages[-1]
        page = 0 if last["role"] == "user" else int(json.loads(last["content"])["text"][0]) + 1
        if page == 6:
            return ModelResponse(text="read them all")
        return ModelResponse(tool_calls=[ToolCall(id=f"c{page}", name="read", arguments={"page": page})])

    child_model = ScriptedModel(next_page)
    child = define_harness(
        name="reader", model=child_model, history=history,
        tools=[durable_tool(tool_definition(name="read", description="read a page", input_schema=Page), read)],
    )
    reader = agent_tool(tool_definition(name="reader", description="d", input_schema=Topic), child,
                        prompt=lambda args: f"read about {args.topic}")
    parent_model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(id="p1", name="reader", arguments={"topic": "x"})]), ModelResponse(text="ok")]
    )
    return define_harness(name="boss", model=parent_model, tools=[reader]), child_model, parent_model


def pages_sent(request: list[dict[str, Any]]) -> list[int]:
    return [c["arguments"]["page"] for m in request if m["role"] == "assistant" for c in m.get("tool_calls", ())]


async def test_a_sub_agent_follows_its_harness_history_policy(host) -> None:
    """Its run is one turn: trim_current_turn drops its oldest rounds (whole), the prompt stays."""
    from harness import History

    parent, child_model, parent_model = looping_sub_agent(history=History(max_chars=500, trim_current_turn=True))
    session = await host.open(parent, session_id=SID)
    result = await session.send("go", input_id="in-1")
    assert result.outcome == "completed"
    assert tool_result(parent_model, "p1")["content"] == {"text": "read them all"}
    assert len(child_model.requests) == 7
    for request in child_model.requests:
        assert request[0] == {"role": "user", "content": "read about x"}
        made = [c["id"] for m in request if m["role"] == "assistant" for c in m.get("tool_calls", ())]
        assert made == [m["tool_call_id"] for m in request if m["role"] == "tool"]  # every call with its result
    assert [pages_sent(r) for r in child_model.requests] == [[], [0], [0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]


async def test_a_sub_agent_without_trim_current_turn_sends_its_whole_run(host) -> None:
    from harness import History

    parent, child_model, _ = looping_sub_agent(history=History(max_chars=500))
    session = await host.open(parent, session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "completed"
    assert pages_sent(child_model.requests[-1]) == [0, 1, 2, 3, 4, 5]


async def test_a_resumed_sub_agent_sends_the_same_trimmed_requests(hosts, log, clock) -> None:
    """Waiting for a person at page 4, the owner dies; the next owner's sub-agent (its
    steps served from the log) sends exactly the requests an uninterrupted run sends."""
    from harness import History

    policy = History(max_chars=500, trim_current_turn=True)
    parent, reference, _ = looping_sub_agent(history=policy, approve_at=4)
    alone = await hosts(owner_id="alone").open(parent, session_id="s-ref")
    assert (await alone.send("go", input_id="in-1")).outcome == "waiting"
    assert (await alone.answer("p1", "agent:4.c4:approve", {"ok": True})).outcome == "completed"

    parent, first_model, _ = looping_sub_agent(history=policy, approve_at=4)
    first = await hosts(owner_id="first").open(parent, session_id=SID)
    assert (await first.send("go", input_id="in-1")).outcome == "waiting"
    await crash(first)
    clock.advance(LEASE.total_seconds() + 1)
    parent, second_model, _ = looping_sub_agent(history=policy, approve_at=4)
    second = await hosts(owner_id="second").open(parent, session_id=SID)
    [still] = await second.recover()
    assert still.outcome == "waiting"
    done = await second.answer("p1", "agent:4.c4:approve", {"ok": True})
    assert done is not None and done.outcome == "completed"
    assert len(first_model.requests) == 5 and len(second_model.requests) == 2  # (the first 5 served from the log)
    assert first_model.requests + second_model.requests == reference.requests


async def test_a_sub_agents_overflow_says_how_to_shorten_a_sub_agents_run(host) -> None:
    """The session's advice (a history policy, a new session) does nothing for a sub-agent:
    its message speaks of its tool rounds, max_model_calls, tool results, trim_current_turn."""
    from harness import ContextTooLong
    from harness.errors import RequestTooLarge

    for error, code in [(ContextTooLong, "context_too_long"), (RequestTooLarge, "request_too_large")]:
        def overflow(messages: list[dict[str, Any]], error: type[ContextTooLong] = error) -> ModelResponse:
            if len(messages) > 1:
                raise error("openai: HTTP 400 bad_request: This model's maximum context length is 4096 tokens.",
                            status=400)
            return ModelResponse(tool_calls=[ToolCall(id=f"c{len(messages)}", name="read", arguments={"page": 1})])

        async def read(args: Page, ctx: Any) -> dict[str, Any]:
            return {"text": "page"}

        child = define_harness(name="reader", model=ScriptedModel(overflow), tools=[
            durable_tool(tool_definition(name="read", description="d", input_schema=Page), read)])
        reader = agent_tool(tool_definition(name="reader", description="d", input_schema=Topic), child)
        parent_model = ScriptedModel(
            [ModelResponse(tool_calls=[ToolCall(id="p1", name="reader", arguments={"topic": "x"})]),
             ModelResponse(text="ok")]
        )
        session = await host.open(define_harness(name="boss", model=parent_model, tools=[reader]),
                                  session_id=f"s-{code}")
        assert (await session.send("go", input_id="in-1")).outcome == "completed"
        failed = tool_result(parent_model, "p1")
        assert failed["is_error"] and failed["content"]["type"] == error.__name__, failed
        message = failed["content"]["message"]
        assert message.startswith("the sub-agent 'reader', at its model call 2 (after 1 tool round): openai: HTTP 400")
        assert message.endswith(error.SUB_AGENT_FIX)
        assert "max_model_calls" in message and "trim_current_turn=True" in message and "tool results" in message
        assert "start a new session" not in message
