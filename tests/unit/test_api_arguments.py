"""A wrong value given to a public call fails at that call, with a typed error that says
what is wrong and how to fix it (never an AttributeError from deep inside, later)."""

from __future__ import annotations

import asyncio
import gc
import re
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pydantic
import pytest
from pydantic import SecretStr

from harness import (
    FakeClock,
    Harness,
    HarnessClient,
    HarnessHost,
    Hooks,
    Tool,
    Worker,
    agent_tool,
    chat,
    define_harness,
    durable_tool,
    open_log,
    tool,
    tool_definition,
)
from harness.errors import DefinitionError, EmptyMessage, InvalidId, StepError, StepValueError
from harness.log import open_client_log
from harness.models import ModelResponse, ScriptedModel, ToolCall

from .conftest import Args, call, entries, script


@pytest.mark.parametrize("url", [123, None, b"memory:"], ids=["int", "none", "bytes"])
def test_open_log_takes_a_url_string(url):
    for opener in (open_log, open_client_log):
        with pytest.raises(TypeError, match=f"takes a log URL as a string, not {type(url).__name__}"):
            opener(url)


def test_open_log_of_a_folder_names_the_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    says = f"names the folder {tmp_path / 'adir'}, not a file: name the log's file in it"
    for opener in (open_log, open_client_log):
        with pytest.raises(ValueError, match=re.escape(says)):
            opener("sqlite:///adir")
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["adir"]  # nothing was created


@pytest.mark.parametrize("log", [None, 5, Path("harness.db")], ids=["none", "int", "path"])
def test_host_log_must_be_a_session_log_or_its_url(log):
    with pytest.raises(TypeError, match=f"log= takes a session log or its URL, not {type(log).__name__}"):
        HarnessHost(log=log)


@pytest.mark.parametrize("given", [5, 2.5, timedelta(seconds=5)])
async def test_host_lease_and_poll_interval_take_a_timedelta_or_seconds(given):
    async with HarnessHost(log="memory:", lease=given, poll_interval=given) as host:
        seconds = given.total_seconds() if isinstance(given, timedelta) else given
        assert host.lease == timedelta(seconds=seconds) and host.poll_interval == seconds


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (True, "takes a timedelta or a number of seconds as its duration, not bool"),
        ("5", "takes a timedelta or a number of seconds as its duration, not str"),
        (float("nan"), "give a finite duration"),
        (float("inf"), "give a finite duration"),
        (0, "must be a positive duration, not 0"),
        (-1.5, "must be a positive duration, not -1.5"),
        (timedelta(0), "must be a positive duration"),
    ],
)
@pytest.mark.parametrize("name", ["lease", "poll_interval"])
def test_host_lease_and_poll_interval_must_be_positive_durations(name, bad, says):
    with pytest.raises(DefinitionError, match=re.escape(f"HarnessHost({name}=)")) as refused:
        HarnessHost(log="memory:", **{name: bad})
    assert says in str(refused.value)


@pytest.mark.parametrize("bad", [0, True, "4", 2.0])
def test_host_sync_threads_is_a_whole_number(bad):
    with pytest.raises(DefinitionError, match=f"sync_threads must be a whole number of at least 1, not {bad!r}"):
        HarnessHost(log="memory:", sync_threads=bad)


# --- host.open, define_harness, chat -------------------------------------------------------


def _book() -> Tool:
    return tool(tool_definition(name="book", description="d", input_schema=Args), lambda a: {"ok": True})


def _harness() -> Harness:
    return define_harness(name="t/args", model=script("done"), tools=[_book()])


async def test_open_takes_a_harness(host, log):
    with pytest.raises(DefinitionError, match=r"host.open\(\) takes a Harness made by define_harness\(\), not str"):
        await host.open("notharness", session_id="s-1")  # type: ignore[arg-type]
    assert await log.read("s-1") == []


@pytest.mark.parametrize(
    ("secrets", "says"),
    [
        (["a"], "takes secrets= as a mapping of name -> value, not list"),
        ({"a": 5}, "secret 'a' must be a str or a pydantic SecretStr, not int"),
        ({"a": None}, "secret 'a' must be a str or a pydantic SecretStr, not NoneType"),
        ({5: "hunter2-hunter2"}, "a secret's name must be a non-empty string, not 5"),
    ],
)
async def test_open_and_chat_take_secrets_as_names_to_text(host, log, secrets, says):
    with pytest.raises(DefinitionError, match=re.escape(says)) as refused:
        await host.open(_harness(), session_id="s-1", secrets=secrets)
    assert str(refused.value).startswith("host.open()")
    with pytest.raises(DefinitionError, match=re.escape(says)) as refused:
        await chat(model=script("done"), messages=[{"role": "user", "content": "hi"}], secrets=secrets)
    assert str(refused.value).startswith("chat()") and "hunter2" not in str(refused.value)
    assert await log.read("s-1") == []


async def test_open_and_chat_take_secret_str_values(host):
    session = await host.open(_harness(), session_id="s-1", secrets={"a": SecretStr("sk_live_123456"), "b": "x"})
    assert dict(session.secrets) == {"a": "sk_live_123456", "b": "x"}


@pytest.mark.parametrize(
    ("tools", "says"),
    [
        (_book(), "tools= takes a list of tools, not Tool; one tool goes in a list too: tools=[book]"),
        (None, "tools= takes a list of tools, not NoneType"),
        ("book", "tools= takes a list of tools, not str"),
        ({"book": _book()}, "tools= takes a list of tools, not dict"),
        (["book"], "'book' is not a tool (use tool() or durable_tool())"),
        ([_book(), _book()], "has two tools named 'book'"),
    ],
)
def test_define_harness_and_chat_take_a_list_of_tools(tools, says):
    with pytest.raises(DefinitionError, match=re.escape(says)):
        define_harness(name="t/args", model=script("done"), tools=tools)
    with pytest.raises(DefinitionError, match=re.escape(says)):
        asyncio.run(chat(model=script("done"), messages=[], tools=tools))


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ("hi", "chat() takes messages= as a list of message dicts, not str"),
        ({"role": "user", "content": "hi"}, "chat() takes messages= as a list of message dicts, not dict"),
        (None, "chat() takes messages= as a list of message dicts, not NoneType"),
        (["hi"], "chat(): message 0 must be a dict, not str"),
        ([{"content": "hi"}], "chat(): message 0 needs a string 'role'"),
    ],
)
async def test_chat_takes_a_list_of_message_dicts(messages, says):
    model = script("done")
    with pytest.raises(DefinitionError, match=re.escape(says)):
        await chat(model=model, messages=messages)
    assert model.requests == []


@pytest.mark.parametrize("model", [None, "openai:gpt-4.1-mini", object()], ids=["none", "str", "object"])
async def test_chat_takes_a_model(model):
    with pytest.raises(DefinitionError, match=re.escape("model of chat() has no complete() method")):
        await chat(model=model, messages=[{"role": "user", "content": "hi"}])


async def test_chat_runs_with_tools_given_as_a_tuple():
    model = ScriptedModel([ModelResponse(tool_calls=[ToolCall(id="c1", name="book", arguments={})]),
                           ModelResponse(text="done")])
    out = await chat(model=model, messages=({"role": "user", "content": "hi"},), tools=(_book(),))
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "assistant"]


# --- step.do takes a function ----------------------------------------------------------------


async def fetch(x: int) -> int:
    return x


def _misuse(kind: str) -> Any:
    return fetch(1) if kind == "coroutine" else 5


@pytest.mark.parametrize("kind", ["coroutine", "int"])
@pytest.mark.parametrize("sync", [False, True], ids=["async-tool", "sync-tool"])
async def test_step_do_refuses_what_is_not_a_function_before_anything_is_written(host, log, kind, sync):
    refused: list[StepError] = []

    async def async_impl(args: Args, ctx: Any) -> dict[str, Any]:
        try:
            await ctx.step.do("s", _misuse(kind))
        except StepError as exc:
            refused.append(exc)
        return {"after": await ctx.step.do("s", lambda: 1)}  # the name was not taken

    def sync_impl(args: Args, ctx: Any) -> dict[str, Any]:
        try:
            ctx.step.do("s", _misuse(kind))
        except StepError as exc:
            refused.append(exc)
        return {"after": ctx.step.do("s", lambda: 1)}

    t = durable_tool(tool_definition(name="t", description="d", input_schema=Args), sync_impl if sync else async_impl)
    session = await host.open(define_harness(name="t/do", model=script([call("c1", "t")], "ok"), tools=[t]),
                              session_id="s-1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine never awaited would warn when collected
        assert (await session.send("go")).outcome == "completed"
        gc.collect()
    [error] = refused
    assert error.tool_call_id == "c1" and error.step_name == "s"
    assert str(error).startswith("step.do('s', fn) takes a function, not ")
    assert "pass the function, not its call: step.do('s', fetch) or step.do('s', lambda: fetch(x))" in str(error)
    if kind == "coroutine":
        assert "a coroutine object (the call of an async function)" in str(error)
    assert [e["value"] for e in await entries(log, "s-1", "harness.step.result")] == [1]
    [result] = await entries(log, "s-1", "harness.tool.result")
    assert result["content"] == {"after": 1}


async def test_step_do_refuses_a_coroutine_in_plain_mode():
    refused: list[str] = []

    async def impl(args: Args, ctx: Any) -> None:
        with pytest.raises(StepError, match="pass the function, not its call") as caught:
            await ctx.step.do("s", fetch(1))
        refused.append(str(caught.value))

    t = durable_tool(tool_definition(name="t", description="d", input_schema=Args), impl)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await chat(model=script([call("c1", "t")], "ok"), messages=[{"role": "user", "content": "go"}], tools=[t])
        gc.collect()
    assert len(refused) == 1


# --- session.records(type=) -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [5, b"app.memory", ["app.memory"]])
async def test_records_type_must_be_a_string_or_none(host, bad):
    session = await host.open(_harness(), session_id="s-1")
    await session.append_records([{"type": "app.memory", "n": 1}], input_id="r-1")
    says = f"records(type=) takes a record type or None; the type must be a string, not {type(bad).__name__}"
    with pytest.raises(TypeError, match=re.escape(says)) as refused:
        await session.records(type=bad)
    assert isinstance(refused.value, StepValueError)
    assert await session.records(type="app.memory") == await session.records() == [{"type": "app.memory", "n": 1}]


# --- chat() and define_harness options ---------------------------------------------------------

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("bad", [0, -1, "5", True, 2.5])
async def test_chat_max_model_calls_is_a_whole_number_of_at_least_one(bad):
    model = script("done")
    says = f"chat(): max_model_calls must be a whole number of at least 1, not {bad!r}"
    with pytest.raises(DefinitionError, match=re.escape(says)):
        await chat(model=model, messages=HI, max_model_calls=bad)
    assert model.requests == []


async def test_chat_max_model_calls_of_one_is_one_call():
    assert [m["role"] for m in await chat(model=script("done"), messages=HI, max_model_calls=1)] == ["user", "assistant"]


async def test_chat_takes_its_bound_of_model_calls_from_durability_unless_given():
    from pydantic import BaseModel

    from harness import tool
    from harness.errors import HarnessError

    class NoArgs(BaseModel):
        pass

    again = tool(tool_definition(name="again", description="d", input_schema=NoArgs), lambda args, ctx: "ok")
    model = ScriptedModel(lambda messages: ModelResponse(tool_calls=[ToolCall(id="c", name="again", arguments={})]))
    with pytest.raises(HarnessError, match="after 2 model calls"):
        await chat(model=model, messages=HI, tools=[again], durability={"max_model_calls": 2})
    with pytest.raises(HarnessError, match="after 3 model calls"):
        await chat(model=model, messages=HI, tools=[again], durability={"max_model_calls": 2}, max_model_calls=3)


def _before(event: Any) -> None:
    return None


HOOK_NAMES = "the hooks are on_before_tool_call and on_after_tool_call"


@pytest.mark.parametrize(
    ("hooks", "says"),
    [
        (_before, "takes hooks= as Hooks(on_before_tool_call=..., on_after_tool_call=...) or a dict of them, "
                  "not function"),
        ([_before], "or a dict of them, not list"),
        ({"before": _before}, f"hooks= has no hook 'before'; {HOOK_NAMES}"),
        ({"on_before_tool_call": 5}, "hooks: on_before_tool_call takes a function on_before_tool_call(event), "
                                     "sync or async, not int"),
        ({"on_after_tool_call": _before}, "hooks: on_after_tool_call is called as on_after_tool_call(event, "
                                          "outcome); this one takes (event)"),
        ({"on_before_tool_call": lambda: None}, "hooks: on_before_tool_call is called as "
                                                "on_before_tool_call(event); this one takes ()"),
    ],
    ids=["function", "list", "unknown-name", "not-callable", "after-one-argument", "before-no-argument"],
)
async def test_define_harness_and_chat_take_hooks_or_a_dict_of_them(hooks, says):
    with pytest.raises(DefinitionError, match=re.escape(says)):
        define_harness(name="t/args", model=script("done"), hooks=hooks)
    model = script("done")
    with pytest.raises(DefinitionError, match=re.escape(says)):
        await chat(model=model, messages=HI, hooks=hooks)
    assert model.requests == []


def test_hooks_refuses_what_it_cannot_call():
    with pytest.raises(DefinitionError, match=re.escape("hooks: on_after_tool_call takes a function")):
        Hooks(on_after_tool_call="log")  # type: ignore[arg-type]


DURABILITY_FIELDS = ("max_attempts, step_value_limit, cut_call_error, max_model_calls, truncated_call_error, "
                     "model_retries, model_backoff, model_backoff_max, timeout")


@pytest.mark.parametrize(
    ("durability", "says"),
    [
        ("strict", f"takes durability= as Durability(...) or a dict of its fields ({DURABILITY_FIELDS}), not str"),
        (5, "or a dict of its fields"),
        ({"retries": 1}, f"durability= has no field 'retries'; its fields are {DURABILITY_FIELDS}"),
        ({"model_retries": -1}, "durability.model_retries must be a whole number of at least 0, not -1"),
        ({"cut_call_error": 5}, "durability.cut_call_error is the text the model gets: a non-empty string, not int"),
        ({"truncated_call_error": " "}, "durability.truncated_call_error is the text the model gets: a non-empty "
                                        "string, not ' '"),
    ],
)
async def test_define_harness_and_chat_take_durability_or_a_dict_of_its_fields(durability, says):
    with pytest.raises(DefinitionError, match=re.escape(says)):
        define_harness(name="t/args", model=script("done"), durability=durability)
    model = script("done")
    with pytest.raises(DefinitionError, match=re.escape(says)):
        await chat(model=model, messages=HI, durability=durability)
    assert model.requests == []


async def test_chat_takes_hooks_and_durability_as_dicts():
    model = ScriptedModel([ModelResponse(tool_calls=[ToolCall(id="c1", name="book", arguments={})]),
                           ModelResponse(text="done")])
    out = await chat(model=model, messages=HI, tools=[_book()],
                     hooks={"on_before_tool_call": lambda event: {"answered": "by the hook"}},
                     durability={"model_retries": 0})
    assert [m["content"] for m in out if m["role"] == "tool"] == ['{"answered":"by the hook"}']


@pytest.mark.parametrize("bad", [5, ["be brief"]])
async def test_define_harness_and_chat_take_a_system_prompt_string(bad):
    says = f"takes system_prompt= as a string or None, not {type(bad).__name__}"
    with pytest.raises(DefinitionError, match=re.escape(f"harness 't/args' {says}")):
        define_harness(name="t/args", model=script("done"), system_prompt=bad)
    with pytest.raises(DefinitionError, match=re.escape(f"chat() {says}")):
        await chat(model=script("done"), messages=HI, system_prompt=bad)


async def test_chat_clock_and_stream_are_checked_at_the_call():
    with pytest.raises(DefinitionError, match=re.escape("chat() takes clock= as a Clock (now() and async "
                                                        "sleep_until()), e.g. FakeClock(), not float")):
        await chat(model=script("done"), messages=HI, clock=1.5)
    with pytest.raises(DefinitionError, match=re.escape("chat() takes stream= as a function called with each "
                                                        "text delta, not list")):
        await chat(model=script("done"), messages=HI, stream=[])
    assert (await chat(model=script("done"), messages=HI, clock=FakeClock(), stream=lambda delta: None))[-1] == {
        "role": "assistant", "content": "done"}


async def test_chat_refuses_an_async_stream_callback():
    """Its coroutines were never awaited: deltas lost, a RuntimeWarning per delta."""
    async def deltas(text: str) -> None:
        pass

    class Sink:
        async def __call__(self, text: str) -> None:
            pass

    for sink in (deltas, Sink()):
        with pytest.raises(DefinitionError, match=re.escape("chat() takes stream= as a plain function (def, not "
                                                            "async def)")):
            await chat(model=script("done"), messages=HI, stream=sink)


# --- Worker, HarnessHost, HarnessClient, tool_definition, agent_tool ---------------------------


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"harnesses": "H"}, "Worker takes harnesses= as a list of harnesses made by define_harness(), not str"),
        ({"harnesses": ["t/args"]}, "Worker(harnesses=): 't/args' is not a harness (make one with define_harness())"),
        ({"max_sessions": 0}, "max_sessions must be a whole number of at least 1 or None, not 0"),
        ({"max_sessions": "5"}, "max_sessions must be a whole number of at least 1 or None, not '5'"),
        ({"max_sessions": True}, "max_sessions must be a whole number of at least 1 or None, not True"),
        ({"drain_timeout": "20"}, "Worker(drain_timeout=) takes a timedelta or a number of seconds as its duration, "
                                  "not str, e.g. drain_timeout=timedelta(seconds=20) or drain_timeout=20"),
        ({"drain_timeout": -1}, "Worker(drain_timeout=) must be zero or more (zero: no drain), not -1 s"),
        ({"owner_id": 5}, "Worker(owner_id=) takes a non-empty string or None, not 5"),
        ({"instance_id": ""}, "Worker(instance_id=) takes a non-empty string or None, not ''"),
        ({"live": "no"}, "Worker(live=) takes True or False, not 'no'"),
        ({"clock": 5}, "HarnessHost takes clock= as a Clock (now() and async sleep_until()), e.g. FakeClock(), not int"),
    ],
    ids=lambda v: str(v)[:40] if not isinstance(v, dict) else "-".join(f"{k}={w!r}" for k, w in v.items()),
)
def test_worker_options_are_checked_at_construction(options, says):
    with pytest.raises(DefinitionError, match=re.escape(says)):
        Worker(log=open_log("memory:"), **({"harnesses": [_harness()]} | options))


def test_worker_takes_a_list_of_harnesses():
    with pytest.raises(DefinitionError, match=re.escape("not Harness; one harness goes in a list too: "
                                                        "harnesses=[harness]")):
        Worker(log=open_log("memory:"), harnesses=_harness())  # type: ignore[arg-type]


def test_worker_takes_a_drain_timeout_in_seconds():
    assert Worker(log=open_log("memory:"), harnesses=[_harness()], drain_timeout=2.5).drain_timeout == 2.5
    assert Worker(log=open_log("memory:"), harnesses=[_harness()], drain_timeout=0).drain_timeout == 0


def test_host_owner_id_is_a_string():
    with pytest.raises(DefinitionError, match=re.escape("HarnessHost(owner_id=) takes a non-empty string or None, "
                                                        "not 5")):
        HarnessHost(log="memory:", owner_id=5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"bootstrap": 9092}, "HarnessClient takes bootstrap= as a string 'host:port[,host:port]', not 9092: "
                              "e.g. bootstrap='127.0.0.1:9092'"),
        ({"bootstrap": "h:1", "partitions": "3"}, "HarnessClient(partitions=) must be a whole number of at least 1, "
                                                  "or None (read from the broker), not '3'"),
        ({"bootstrap": "h:1", "topic_prefix": ""}, "HarnessClient takes topic_prefix= as a non-empty string, not ''"),
        ({"log": "memory:", "client_config": [("sasl.password", "hunter2")]},
         "HarnessClient takes client_config= as a dict of librdkafka settings, not list"),
    ],
)
def test_client_options_are_checked_at_construction(options, says):
    with pytest.raises(DefinitionError, match=re.escape(says)) as refused:
        HarnessClient(**options)
    assert "hunter2" not in str(refused.value)


async def test_client_calls_check_their_arguments_before_anything_is_sent():
    log = open_log("memory:")
    async with HarnessClient(log=log) as client:
        with pytest.raises(DefinitionError, match=re.escape("send(harness=) takes the name of a harness "
                                                            "(define_harness(name=...)) or None, not 5")):
            await client.send("s-1", "hi", harness=5)  # type: ignore[arg-type]
        with pytest.raises(InvalidId, match="a tool call id must be a string, not int"):
            await client.answer("s-1", 5, "approve", True)  # type: ignore[arg-type]
        with pytest.raises(InvalidId, match=re.escape("the name of an ask must be a non-empty string, not 5")):
            await client.answer("s-1", "c1", 5, True)  # type: ignore[arg-type]
        assert await log.read("s-1") == []
        with pytest.raises(DefinitionError, match=re.escape("wait_settled() takes the receipt of "
                                                            "send/answer/append_records or an input id, not int")):
            await client.wait_settled("s-1", 5, timeout=1)  # type: ignore[arg-type]
        with pytest.raises(InvalidId, match="a session id must be a string, not int"):
            await client.wait_settled(5, "in-1", timeout=1)  # type: ignore[arg-type]
        for bad, says in (("1", "takes a timedelta or a number of seconds as its duration, not str"),
                          (-1, "must be zero or more seconds, or None, not -1")):
            with pytest.raises(DefinitionError, match=re.escape(f"wait_settled(timeout=) {says}")):
                await client.wait_settled("s-1", "in-1", timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(TimeoutError, match=re.escape("was not settled within 0.01 s")):
            await client.wait_settled("s-1", "in-1", timeout=timedelta(milliseconds=10))
        with pytest.raises(InvalidId, match="a session id must be a string, not int"):
            client.events(5)  # type: ignore[arg-type]
        with pytest.raises(DefinitionError, match=re.escape("events(after=) takes a position (the seq of the last "
                                                            "entry seen) or None, not '3'")):
            client.events("s-1", "3")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"description": 5}, "description of tool 'book' must be a string (the model reads it), not int"),
        ({"input_schema": Args()}, "input_schema of tool 'book' must be a pydantic BaseModel class, not an instance "
                                   "of it: input_schema=Args"),
        ({"input_schema": {"type": "object"}}, "must be a pydantic BaseModel class, not dict"),
    ],
)
def test_tool_definition_checks_its_description_and_schema(options, says):
    with pytest.raises(DefinitionError, match=re.escape(says)):
        tool_definition(**({"name": "book", "description": "d", "input_schema": Args} | options))


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"prompt": "say hi"}, "agent_tool() takes prompt= as a function arguments -> the sub-agent's message, "
                               "not str"),
        ({"max_model_calls": 0}, "agent_tool(): max_model_calls must be a whole number of at least 1, or None "
                                 "(the harness's durability.max_model_calls), not 0"),
        ({"max_model_calls": "5"}, "not '5'"),
    ],
)
def test_agent_tool_checks_its_options(options, says):
    definition = tool_definition(name="helper", description="d", input_schema=Args)
    with pytest.raises(DefinitionError, match=re.escape(says)):
        agent_tool(definition, _harness(), **options)


@pytest.mark.parametrize("bad", ["3", 2.0, True], ids=["str", "float", "bool"])
async def test_session_events_after_is_a_position_or_none(host, bad):
    """As HarnessClient.events: a wrong cursor is refused at the call, not a TypeError from the log's read
    ('>' not supported between int and str) when the loop first asks, nor True taken as position 1."""
    session = await host.open(_harness(), session_id="s-1")
    says = f"events(after=) takes a position (the seq of the last entry seen) or None, not {bad!r}"
    for live in (False, True):
        with pytest.raises(DefinitionError, match=re.escape(says)):
            session.events(after=bad, live=live)  # type: ignore[arg-type]
    await session.append_records([{"type": "app.memory", "n": 1}], input_id="r-1")
    first = await anext(aiter(session.events(after=0)))
    assert first.seq == 1


# --- FakeClock ----------------------------------------------------------------------------------


async def test_fake_clock_takes_timedeltas_and_aware_datetimes_and_refuses_the_rest():
    """advance(timedelta(days=2)) was a bare TypeError (float + timedelta); set(datetime) or
    advance(nan) were stored as they were and broke every sleep and lease reading the clock later."""
    from datetime import UTC, datetime

    from harness.errors import NaiveDatetime

    clock = FakeClock(start=datetime(2030, 1, 1, tzinfo=UTC))
    assert clock.now() == datetime(2030, 1, 1, tzinfo=UTC).timestamp()
    woke = asyncio.ensure_future(clock.sleep_until(clock.now() + 2 * 86400))
    await asyncio.sleep(0)
    clock.advance(timedelta(days=1))
    await asyncio.sleep(0)
    assert not woke.done()
    clock.advance(86400)
    await asyncio.wait_for(woke, 1)
    clock.set(datetime(2031, 1, 1, tzinfo=UTC))
    assert clock.now() == datetime(2031, 1, 1, tzinfo=UTC).timestamp()
    before = clock.now()
    for bad, says in (("5", "FakeClock.advance() takes a timedelta or a number of seconds as its duration, not str"),
                      (float("nan"), "FakeClock.advance() of nan seconds: give a finite duration"),
                      (-5, "FakeClock.advance() moves the clock forward, not by -5: use set()"),
                      (timedelta(seconds=-1), "moves the clock forward")):
        with pytest.raises(DefinitionError, match=re.escape(says)):
            clock.advance(bad)
    for bad in ("x", float("inf"), None):
        with pytest.raises(DefinitionError, match=re.escape("FakeClock.set() takes seconds since the epoch")):
            clock.set(bad)  # type: ignore[arg-type]
    with pytest.raises(NaiveDatetime, match=re.escape("FakeClock.set() was given 2030-01-01T00:00:00, which has "
                                                      "no timezone")):
        clock.set(datetime(2030, 1, 1))
    with pytest.raises(DefinitionError, match=re.escape("FakeClock(start=) takes")):
        FakeClock(start="now")  # type: ignore[arg-type]
    assert clock.now() == before  # nothing refused moved it


async def test_an_empty_message_is_refused_before_anything_is_written():
    """The CLI and the gateway refuse an empty message; so do the library's two ways in
    (an empty user turn is refused by the model providers, so it would fail the turn)."""
    log = open_log("memory:")
    h = define_harness(name="t/empty", model=ScriptedModel([ModelResponse(text="ok")]), tools=[])
    async with HarnessHost(log=log) as host:
        session = await host.open(h, session_id="s-1")
        with pytest.raises(EmptyMessage, match=re.escape("the message text to session 's-1' is empty: give the "
                                                         "message to send, e.g. send('hello')")):
            await session.send("")
    async with HarnessClient(log=log) as client:
        with pytest.raises(EmptyMessage, match="is empty"):
            await client.send("s-1", "")
    assert await log.read("s-1") == []
    assert issubclass(EmptyMessage, ValueError)


class _Opaque:
    pass


class _NoJsonSchema(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
    order_id: str
    hook: _Opaque | None = None


def test_an_input_schema_with_no_json_schema_is_refused_at_definition() -> None:
    """A tool's input model pydantic cannot make a JSON schema of (a field of an arbitrary
    class) was taken; the first ``send`` then raised PydanticInvalidForJsonSchema from
    inside the library, out of ``send`` itself."""
    with pytest.raises(DefinitionError) as refused:
        tool_definition(name="pay", description="d", input_schema=_NoJsonSchema)
    message = str(refused.value)
    assert message.startswith("input_schema of tool 'pay' has no JSON schema") and "\n" not in message


async def test_an_ask_schema_with_no_json_schema_is_a_step_error_of_the_call(host, log) -> None:
    async def execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.ask("approve", message="ok?", schema=_NoJsonSchema)

    t = durable_tool(tool_definition(name="pay", description="d", input_schema=Args), execute)
    session = await host.open(define_harness(name="t/ask", model=script([call("c1", "pay")], "ok"), tools=[t]),
                              session_id="s-1")
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, "s-1", "harness.tool.result")
    assert result["content"]["type"] == "StepError"
    assert result["content"]["message"].startswith("the schema of ask 'approve' has no JSON schema")
    assert await entries(log, "s-1", "harness.ask.opened") == []


def test_an_input_schema_whose_forward_references_resolve_later_is_still_taken() -> None:
    """(The JSON schema check must not refuse a model that is completed afterwards.)"""
    namespace: dict[str, Any] = {}
    exec(  # (a model with a forward reference, as a module would write it)
        "from pydantic import BaseModel\nclass Later(BaseModel):\n    item: 'Item'\n", namespace
    )
    tool_definition(name="pay", description="d", input_schema=namespace["Later"])
    exec("class Item(BaseModel):\n    x: int\n", namespace)
    namespace["Later"].model_rebuild(_types_namespace=namespace)
    assert namespace["Later"].model_json_schema()["required"] == ["item"]
