"""SPEC 1: the public API: names, shapes, and misuse caught when a tool or harness is defined."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import BaseModel

import harness
import harness.errors
from harness import (
    Durability,
    HarnessHost,
    chat,
    define_harness,
    durable_tool,
    open_log,
    tool,
    tool_definition,
)
from harness.errors import DefinitionError, HarnessError
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.models.scripted import KEEP_REQUESTS

from .conftest import Args, call, script

PINNED_ALL = [
    "Clock",
    "ContextTooLong",
    "Durability",
    "FakeClock",
    "Harness",
    "HarnessClient",
    "HarnessError",
    "HarnessHost",
    "History",
    "Hooks",
    "InputReceipt",
    "LogEntry",
    "OpenAsk",
    "Session",
    "SessionLog",
    "StepInfo",
    "StepNotAwaited",
    "SystemClock",
    "Tool",
    "ToolCallEvent",
    "ToolContext",
    "ToolDefinition",
    "ToolOutcome",
    "TurnResult",
    "Worker",
    "agent_tool",
    "chat",
    "define_harness",
    "durable_tool",
    "open_log",
    "tool",
    "tool_definition",
]


def test_s1_all_is_pinned_and_sorted():
    assert harness.__all__ == PINNED_ALL
    assert harness.__all__ == sorted(harness.__all__)
    for name in harness.__all__:
        assert hasattr(harness, name), name


def test_s1_spec_names_import():
    for name in ("tool_definition", "durable_tool", "define_harness", "HarnessHost", "open_log", "chat", "tool"):
        assert callable(getattr(harness, name))
    from harness.models import ModelResponse, ScriptedModel, ToolCall  # noqa: F401 - the import is the test


def test_s1_errors_have_one_root():
    for name in harness.errors.__all__:
        cls = getattr(harness.errors, name)
        assert issubclass(cls, HarnessError), name
    assert issubclass(harness.errors.StepValueError, TypeError)


def test_s1_signatures_take_the_spec_keywords():
    assert {"name", "description", "input_schema", "replay"} <= set(inspect.signature(tool_definition).parameters)
    assert "replay" in inspect.signature(durable_tool).parameters
    assert {"name", "model", "tools", "system_prompt", "hooks", "durability"} <= set(
        inspect.signature(define_harness).parameters
    )
    assert {"log", "lease"} <= set(inspect.signature(HarnessHost).parameters)
    assert {"model", "messages", "tools"} <= set(inspect.signature(chat).parameters)
    assert {"harness", "session_id", "secrets"} <= set(inspect.signature(HarnessHost.open).parameters)
    for method in ("send", "recover", "answer", "append_records", "records", "events", "close"):
        assert callable(getattr(harness.Session, method)), method


async def test_s1_ctx_fields_and_read_only_secrets(host, log):
    seen: dict[str, Any] = {}

    async def execute(args: Args, ctx: Any) -> Any:
        seen.update(tool_call_id=ctx.tool_call_id, session_id=ctx.session_id, log_id=ctx.log_id)
        assert isinstance(ctx.secrets, Mapping) and ctx.secrets["api"] == "k-1"
        with pytest.raises(TypeError):
            ctx.secrets["api"] = "other"  # type: ignore[index]
        assert callable(ctx.append) and callable(ctx.step.do)
        return "ok"

    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    h = define_harness(name="test/api", model=script([call("c1", "work")], "done"), tools=[t])
    from pydantic import SecretStr

    session = await host.open(h, session_id="s-1", secrets={"api": SecretStr("k-1")})
    result = await session.send("go", input_id="in-1")
    assert (result.input_id, result.outcome, result.text) == ("in-1", "completed", "done")
    assert seen == {"tool_call_id": "c1", "session_id": "s-1", "log_id": f"{log.namespace}/s-1"}
    entries = await log.read("s-1")
    assert [e.seq for e in entries] == sorted(e.seq for e in entries)
    assert entries[0].type == "harness.input.message" and entries[0].data["text"] == "go"


async def test_s1_sync_and_async_execute_and_step_fns(host):
    async def async_fn() -> int:
        return 2

    def sync_tool(args: Args, ctx: Any) -> Any:
        return ctx.step.do("a", lambda info: info.idempotency_key.endswith(":c1:a"))

    async def async_tool(args: Args, ctx: Any) -> Any:
        return [await ctx.step.do("b", async_fn), await ctx.step.do("c", lambda: 3)]

    d = lambda n: tool_definition(name=n, description="d", input_schema=Args)  # noqa: E731
    model = script([call("c1", "sync_tool"), call("c2", "async_tool")], "done")
    h = define_harness(
        name="test/api", model=model, tools=[durable_tool(d("sync_tool"), sync_tool), durable_tool(d("async_tool"), async_tool)]
    )
    session = await host.open(h, session_id="s-1")
    await session.send("go")
    contents = [m["content"] for m in model.requests[-1] if m["role"] == "tool"]
    assert contents == ["true", "[2,3]"]


async def test_s1_events_yields_committed_records_in_order(host):
    h = define_harness(name="test/api", model=script("hello"), tools=[])
    session = await host.open(h, session_id="s-1")
    await session.send("hi", input_id="in-1")
    seen = []
    async for entry in session.events():
        seen.append(entry.type)
        if entry.type == "harness.input.settled":
            break
    assert seen[0] == "harness.input.message" and "harness.turn.finished" in seen


async def test_s1_scripted_model_counts_assistant_messages_and_keeps_requests():
    model = ScriptedModel([ModelResponse(text="zero"), ModelResponse(text="one")])
    assert (await model.complete([{"role": "user", "content": "a"}], [])).text == "zero"
    resumed = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "zero"},
        {"role": "user", "content": "b"},
    ]
    assert (await model.complete(resumed, [])).text == "one"
    assert model.requests == [[{"role": "user", "content": "a"}], resumed]
    resumed.append({"role": "x"})
    assert len(model.requests[1]) == 3  # a copy
    fn_model = ScriptedModel(lambda messages: ModelResponse(text=str(len(messages))))
    assert (await fn_model.complete(resumed, [])).text == "4"


async def test_s1_scripted_model_resumes_in_a_new_process(hosts, log, clock):
    """A fresh model (another process) continues the script from what the log holds."""
    from .conftest import crash

    h1 = define_harness(name="test/api", model=script("one", "two"), tools=[])
    s1 = await hosts(owner_id="a").open(h1, session_id="s-1")
    assert (await s1.send("a", input_id="in-1")).text == "one"
    await crash(s1)
    clock.advance(60)
    fresh = script("one", "two")
    s2 = await hosts(owner_id="b").open(define_harness(name="test/api", model=fresh, tools=[]), session_id="s-1")
    assert (await s2.send("b", input_id="in-2")).text == "two"
    assert [m["role"] for m in fresh.requests[0]] == ["user", "assistant", "user"]


def test_s1_open_log_urls(tmp_path):
    assert open_log("memory:") is not None
    with pytest.raises(ValueError):
        open_log("nosuch://x")


# --- definition-time errors --------------------------------------------------------------


class NotPydantic:
    order_id: str


@pytest.mark.parametrize("name", ["", "has space", "dots.not.ok", "x" * 65, "émoji", None])
def test_s1_bad_tool_name_raises_at_definition(name):
    with pytest.raises(DefinitionError):
        tool_definition(name=name, description="d", input_schema=Args)


@pytest.mark.parametrize("name", ["", " padded", "line\nbreak", "tab\there", "x" * 129, None, 5])
def test_s1_bad_harness_name_raises_at_definition(name):
    with pytest.raises(DefinitionError):
        define_harness(name=name, model=script("x"), tools=[])


@pytest.mark.parametrize("name", ["acme/assistant", "My Assistant", "x" * 128, "équipe/agent"])
def test_s1_harness_names_are_printable_text(name):
    assert define_harness(name=name, model=script("x"), tools=[]).name == name


@pytest.mark.parametrize("limits", [{"max_attempts": 1.5}, {"max_attempts": "3"}, {"max_attempts": True},
                                    {"max_attempts": 0}, {"max_model_calls": 0}, {"step_value_limit": -1},
                                    {"model_retries": -1}, {"model_retries": 2.0}])
def test_s1_durability_limits_are_whole_numbers_checked_at_definition(limits):
    with pytest.raises(DefinitionError) as refused:
        Durability(**limits)
    assert f"durability.{next(iter(limits))} must be a whole number" in str(refused.value)


def test_s1_a_model_whose_complete_is_not_async_is_refused_at_definition():
    class SyncModel:
        def complete(self, messages: Any, tools: Any) -> ModelResponse:
            return ModelResponse(text="hi")

    with pytest.raises(DefinitionError) as refused:
        define_harness(name="h", model=SyncModel(), tools=[])
    assert "complete() must be 'async def'" in str(refused.value)


def test_s1_a_model_class_given_for_its_instance_is_refused_at_definition():
    """``model=ScriptedModel`` (the class, not a model): define_harness and chat() took it,
    and every turn failed with "complete() missing 1 required positional argument"."""
    from harness import chat

    with pytest.raises(DefinitionError) as refused:
        define_harness(name="h", model=ScriptedModel, tools=[])
    assert "the class ScriptedModel, not a model: make one, e.g. ScriptedModel(...)" in str(refused.value)
    with pytest.raises(DefinitionError, match="the class ScriptedModel, not a model"):
        asyncio.run(chat(model=ScriptedModel, messages=[{"role": "user", "content": "hi"}], tools=[]))


async def test_s1_a_complete_that_returns_no_awaitable_fails_the_turn_saying_to_make_it_async():
    class CallableComplete:  # not a function: only the call shows what it returns
        def __call__(self, messages: Any, tools: Any) -> ModelResponse:
            return ModelResponse(text="hi")

    class Model:
        complete = CallableComplete()

    host = HarnessHost(log="memory:")
    try:
        session = await host.open(define_harness(name="h", model=Model(), tools=[]), session_id="s-1")
        result = await session.send("hi")
        assert (result.outcome, result.code) == ("failed", "model_error")
        failed = [e.record for e in await host.log.read("s-1") if e.type == "harness.turn.finished"]
        assert "make it 'async def complete'" in (failed[-1].error or "")
    finally:
        await host.close()


@pytest.mark.parametrize("bad", ["", " s-1", "s-1 ", "line\nbreak", "tab\tin", "nul\x00", "x" * 513, "lone \ud800", None, 7])
async def test_s1_session_and_input_ids_must_be_printable_nonempty_text(bad):
    """Ids are log keys, table cells and command arguments: an empty one or one with a
    newline broke `harness sessions`' table and could not be named on the command line."""
    from harness import HarnessClient
    from harness.errors import InvalidId

    host = HarnessHost(log="memory:")
    h = define_harness(name="h", model=script("ok"), tools=[])
    try:
        with pytest.raises(InvalidId):
            await host.open(h, session_id=bad)
        session = await host.open(h, session_id="s-1")
        calls = [lambda: session.cancel(bad)]
        if bad is not None:  # (None: the default, a new id)
            calls += [lambda: session.send("hi", input_id=bad),
                      lambda: session.append_records([{"type": "a.b"}], input_id=bad)]
        client = HarnessClient(log=host.log)
        calls.append(lambda: client.send(bad, "hi", harness="h"))
        if bad is not None:
            calls.append(lambda: client.send("s-1", "hi", harness="h", input_id=bad))
        for call_with_bad_id in calls:
            with pytest.raises(InvalidId):
                await call_with_bad_id()
        assert [e.type for e in await host.log.read("s-1")] == []  # nothing was written
    finally:
        await host.close()


async def test_s1_a_message_or_records_may_not_take_the_id_of_an_answer_or_a_cancel():
    """A message sent as ``cancel:in-1`` took the id of the cancel of ``in-1``: that cancel
    was then refused, for good, as a resend with another payload."""
    from harness import HarnessClient
    from harness.errors import InvalidId

    host = HarnessHost(log="memory:")
    try:
        session = await host.open(define_harness(name="h", model=script("ok", "ok"), tools=[]), session_id="s-1")
        client = HarnessClient(log=host.log)
        for bad in ("cancel:in-1", "answer:c1:approval"):
            for call in (session.send("hi", input_id=bad),
                         session.append_records([{"type": "a.b"}], input_id=bad),
                         client.send("s-1", "hi", harness="h", input_id=bad),
                         client.append_records("s-1", [{"type": "a.b"}], input_id=bad)):
                with pytest.raises(InvalidId, match="kept for the ids of answers and cancels"):
                    await call
        assert [e.type for e in await host.log.read("s-1")] == []
        assert (await session.send("hi", input_id="in-1")).outcome == "completed"
        assert (await session.send("hi", input_id="cancelled:1")).outcome == "completed"  # (only the prefix)
    finally:
        await host.close()


@pytest.mark.parametrize("good", ["s-1", "a b", "t/acme/order-42", "équipe:7", "x" * 512])
async def test_s1_ids_may_hold_spaces_inside_and_any_printable_character(good):
    host = HarnessHost(log="memory:")
    try:
        session = await host.open(define_harness(name="h", model=script("ok"), tools=[]), session_id=good)
        assert (await session.send("hi", input_id=good)).outcome == "completed"
    finally:
        await host.close()


@pytest.mark.parametrize("schema", [NotPydantic, dict, Args(), None])
def test_s1_non_pydantic_schema_raises_at_definition(schema):
    with pytest.raises(DefinitionError):
        tool_definition(name="t", description="d", input_schema=schema)


def test_s1_wrong_execute_arity_raises_at_definition():
    d = tool_definition(name="t", description="d", input_schema=Args)
    with pytest.raises(DefinitionError):
        durable_tool(d, lambda args: None)
    with pytest.raises(DefinitionError):
        durable_tool(d, lambda args, ctx, extra: None)
    with pytest.raises(DefinitionError):
        tool(d, lambda: None)
    with pytest.raises(DefinitionError):
        tool(d, lambda a, b, c: None)
    with pytest.raises(DefinitionError):
        durable_tool(d, "not callable")  # type: ignore[arg-type]
    assert tool(d, lambda args: None).takes_ctx is False
    assert tool(d, lambda args, ctx: None).takes_ctx is True


def test_s1_duplicate_tool_names_raise_at_definition():
    d = tool_definition(name="t", description="d", input_schema=Args)
    with pytest.raises(DefinitionError):
        define_harness(name="h", model=script("x"), tools=[tool(d, lambda a: 1), durable_tool(d, lambda a, c: 1)])


def test_s1_bad_replay_raises_at_definition():
    with pytest.raises(DefinitionError):
        tool_definition(name="t", description="d", input_schema=Args, replay="maybe")  # type: ignore[arg-type]
    d = tool_definition(name="t", description="d", input_schema=Args)
    with pytest.raises(DefinitionError):
        durable_tool(d, lambda a, c: 1, replay="sometimes")  # type: ignore[arg-type]
    assert durable_tool(d, lambda a, c: 1).replay == "safe"
    assert tool(d, lambda a: 1).replay == "never"


def test_s1_bad_harness_raises_at_definition():
    with pytest.raises(DefinitionError):
        define_harness(name="", model=script("x"))
    with pytest.raises(DefinitionError):
        define_harness(name="h", model=object())  # type: ignore[arg-type]
    with pytest.raises(DefinitionError):
        define_harness(name="h", model=script("x"), tools=[lambda a: 1])  # type: ignore[list-item]
    with pytest.raises(DefinitionError):
        define_harness(name="h", model=script("x"), durability={"max_attempts": 0})


def test_s1_tool_spec_is_the_pydantic_schema():
    class Q(BaseModel):
        query: str
        limit: int = 10

    spec = tool_definition(name="search", description="Search", input_schema=Q).spec()
    assert (spec.name, spec.description) == ("search", "Search")
    assert spec.parameters == Q.model_json_schema()
    assert ToolCall(id="1", name="search").arguments == {}


async def test_s1_scripted_model_keeps_its_latest_requests_only():
    """A scripted model in a long-running worker must not hold every request it answered."""
    model = ScriptedModel(lambda messages: ModelResponse(text="ok"), keep_requests=3)
    for n in range(10):
        await model.complete([{"role": "user", "content": str(n)}], [])
    assert model.requests == [[{"role": "user", "content": str(n)}] for n in (7, 8, 9)]
    default = ScriptedModel(lambda messages: ModelResponse(text="ok"))
    for n in range(KEEP_REQUESTS + 5):
        await default.complete([{"role": "user", "content": str(n)}], [])
    assert len(default.requests) == KEEP_REQUESTS
    assert default.requests[-1] == [{"role": "user", "content": str(KEEP_REQUESTS + 4)}]
    everything = ScriptedModel(lambda messages: ModelResponse(text="ok"), keep_requests=None)
    none = ScriptedModel(lambda messages: ModelResponse(text="ok"), keep_requests=0)
    for n in range(5):
        await everything.complete([{"role": "user", "content": str(n)}], [])
        await none.complete([{"role": "user", "content": str(n)}], [])
    assert len(everything.requests) == 5 and none.requests == []
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="keep_requests"):
            ScriptedModel([], keep_requests=bad)  # type: ignore[arg-type]
