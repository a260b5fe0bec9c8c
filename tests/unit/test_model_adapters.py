"""The provider adapters on their real SDKs against the local test server (no network):
exact request bodies, parsed answers, streaming, errors and their classification."""

from __future__ import annotations

import gc
import json
import os
import sys
import warnings
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from pydantic import BaseModel, SecretStr

from harness.errors import DefinitionError, MissingExtra, ModelError, StreamCallbackError
from harness.models import ModelResponse, Pricing, ToolCall, ToolSpec, Usage, from_uri
from harness.models.anthropic import AnthropicMessages
from harness.models.openai import OpenAIChat
from harness.testing.model_server import Fail, Hang, ModelServer, Reply
from harness.tools import tool_definition

KEY = "sk-test-0123456789abcdef"


class Lookup(BaseModel):
    """Arguments of the test tool."""

    query: str
    limit: int = 10


SPEC = tool_definition(name="lookup", description="Look something up", input_schema=Lookup).spec()

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "find cats and dogs"},
    {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {"id": "c1", "name": "lookup", "arguments": {"query": "cats"}},
            {"id": "c2", "name": "lookup", "arguments": {"query": "dogs", "limit": 2}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": '["tom"]', "is_error": False},
    {"role": "tool", "tool_call_id": "c2", "name": "lookup", "content": '{"error":"tool_failed","message":"down"}', "is_error": True},
]


MADE: list[Any] = []


@pytest_asyncio.fixture
async def server() -> AsyncIterator[ModelServer]:
    with ModelServer() as s:
        yield s
        while MADE:  # the adapters' HTTP clients, closed on the test's own loop
            await MADE.pop().aclose()


def openai(server: ModelServer, **kw: Any) -> OpenAIChat:
    model = OpenAIChat(model="gpt-test", base_url=server.openai_url, api_key=kw.pop("api_key", KEY), **kw)
    MADE.append(model)
    return model


def anthropic(server: ModelServer, **kw: Any) -> AnthropicMessages:
    model = AnthropicMessages(model="claude-test", base_url=server.anthropic_url, api_key=kw.pop("api_key", KEY), **kw)
    MADE.append(model)
    return model


def sent_key(request: Any) -> str:
    """The API key a request carried (``x-api-key``, or a bearer token: SDK versions differ)."""
    return str(request.headers.get("x-api-key") or request.headers["authorization"].removeprefix("Bearer "))


TWO_CALLS = Reply(
    text="On it.", tool_calls=(("t1", "lookup", {"query": "x"}), ("t2", "lookup", {"query": "y", "limit": 3})),
    usage=(120, 30),
)


# -- OpenAI -------------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False])
async def test_openai_exact_request_body_and_parsed_answer(server, streaming):
    server.script(TWO_CALLS)
    model = openai(server, streaming=streaming, temperature=0.2, max_tokens=300, extra_body={"seed": 7})
    deltas: list[str] = []
    response = await model.complete(CONVERSATION, [SPEC], stream=deltas.append)
    [request] = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    expected: dict[str, Any] = {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "find cats and dogs"},
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"query":"cats"}'}},
                    {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": '{"query":"dogs","limit":2}'}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '["tom"]'},
            {"role": "tool", "tool_call_id": "c2", "content": '{"error":"tool_failed","message":"down"}'},
        ],
        "tools": [
            {"type": "function", "function": {"name": "lookup", "description": "Look something up",
                                              "parameters": Lookup.model_json_schema()}}
        ],
        "temperature": 0.2,
        "max_tokens": 300,
        "seed": 7,
    }
    if streaming:
        expected |= {"stream": True, "stream_options": {"include_usage": True}}
    assert request.body == expected
    assert response == ModelResponse(
        text="On it.",
        tool_calls=[ToolCall("t1", "lookup", {"query": "x"}), ToolCall("t2", "lookup", {"query": "y", "limit": 3})],
        finish_reason="tool_calls",
        usage=Usage(120, 30, "gpt-test", None),
    )
    assert deltas == (["On i", "t."] if streaming else [])


async def test_openai_assistant_without_text_sends_null_content_and_raw_arguments_back(server):
    server.script(Reply(text="ok"))
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "lookup", "arguments": '{"query": "ca'}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{}", "is_error": True},
    ]
    await openai(server, streaming=False).complete(messages, [])
    sent = server.requests[0].body["messages"]
    assert sent[1] == {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"query": "ca'}}],
    }
    assert "tools" not in server.requests[0].body


@pytest.mark.parametrize("streaming", [True, False])
async def test_openai_truncated_answer_keeps_cut_arguments_as_text(server, streaming):
    server.script(Reply(text="Let me", tool_calls=(("t1", "lookup", '{"query": "ca'),), finish="length"))
    response = await openai(server, streaming=streaming).complete([{"role": "user", "content": "go"}], [SPEC])
    assert response.finish_reason == "length" and response.truncated
    assert response.tool_calls == [ToolCall("t1", "lookup", '{"query": "ca')]


@pytest.mark.parametrize("streaming", [True, False])
async def test_openai_usage_cost_from_pricing(server, streaming):
    server.script(Reply(text="hi", usage=(1_000_000, 500_000)))
    model = openai(server, streaming=streaming, pricing=Pricing(input_per_million=0.4, output_per_million=1.6))
    response = await model.complete([{"role": "user", "content": "go"}], [])
    assert response.usage == Usage(1_000_000, 500_000, "gpt-test", pytest.approx(1.2))


async def test_openai_stream_without_usage_for_servers_that_refuse_stream_options(server):
    server.script(Reply(text="hi"))
    response = await openai(server, stream_usage=False).complete([{"role": "user", "content": "go"}], [])
    assert "stream_options" not in server.requests[0].body and server.requests[0].body["stream"] is True
    assert response.text == "hi" and response.usage is None


# -- Anthropic ----------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False])
async def test_anthropic_exact_request_body_and_parsed_answer(server, streaming):
    server.script(TWO_CALLS)
    model = anthropic(server, streaming=streaming, temperature=0.5, top_k=3)
    deltas: list[str] = []
    response = await model.complete(CONVERSATION, [SPEC], stream=deltas.append)
    [request] = server.requests
    assert request.path == "/v1/messages"
    assert sent_key(request) == KEY
    expected: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 4096,
        "system": "You are terse.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "find cats and dogs"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "c1", "name": "lookup", "input": {"query": "cats"}},
                    {"type": "tool_use", "id": "c2", "name": "lookup", "input": {"query": "dogs", "limit": 2}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": '["tom"]'},
                    {"type": "tool_result", "tool_use_id": "c2", "content": '{"error":"tool_failed","message":"down"}',
                     "is_error": True},
                ],
            },
        ],
        "tools": [{"name": "lookup", "description": "Look something up", "input_schema": Lookup.model_json_schema()}],
        "temperature": 0.5,
        "top_k": 3,
    }
    if streaming:
        expected["stream"] = True
    assert request.body == expected
    assert response == ModelResponse(
        text="On it.",
        tool_calls=[ToolCall("t1", "lookup", {"query": "x"}), ToolCall("t2", "lookup", {"query": "y", "limit": 3})],
        finish_reason="tool_calls",
        usage=Usage(120, 30, "claude-test", None),
    )
    assert deltas == (["On i", "t."] if streaming else [])


async def test_anthropic_merges_same_role_turns_and_options_override_max_tokens(server):
    server.script(Reply(text="fine"))
    messages = [
        {"role": "system", "content": "one"},
        {"role": "system", "content": "two"},
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},  # a turn that failed without an answer, then the next
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "lookup", "arguments": {}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{}", "is_error": False},
        {"role": "user", "content": "c"},
    ]
    await anthropic(server, streaming=False, max_tokens=50).complete(messages, [])
    body = server.requests[0].body
    assert body["system"] == "one\n\ntwo" and body["max_tokens"] == 50
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "lookup", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "{}"}, {"type": "text", "text": "c"}]},
    ]


@pytest.mark.parametrize("streaming", [True, False])
async def test_anthropic_max_tokens_is_length_and_pricing_gives_cost(server, streaming):
    server.script(Reply(text="cut", tool_calls=(("t1", "lookup", '{"que'),), finish="length", usage=(2_000_000, 1000)))
    model = anthropic(server, streaming=streaming, pricing=Pricing(3.0, 15.0))
    response = await model.complete([{"role": "user", "content": "go"}], [SPEC])
    assert response.finish_reason == "length"
    assert response.usage == Usage(2_000_000, 1000, "claude-test", pytest.approx(6.015))
    # Streamed, the cut JSON arrives as text; not streamed, the API gives an (empty) object.
    assert response.tool_calls == [ToolCall("t1", "lookup", '{"que' if streaming else {})]


# -- errors, both providers --------------------------------------------------------------------------


MAKERS = {"openai": openai, "anthropic": anthropic}


@pytest.fixture(params=["openai", "anthropic"])
def make(request: pytest.FixtureRequest) -> Any:
    return MAKERS[request.param]


@pytest.mark.parametrize("streaming", [True, False])
async def test_429_with_retry_after_is_transient(server, make, streaming):
    server.script(Fail(429, "Rate limit reached", headers={"retry-after": "2.5"}))
    with pytest.raises(ModelError) as info:
        await make(server, streaming=streaming).complete([{"role": "user", "content": "go"}], [])
    error = info.value
    assert (error.transient, error.status, error.retry_after, error.kind) == (True, 429, 2.5, "rate_limited")
    assert "Rate limit reached" in error.message
    assert len(server.requests) == 1  # the SDK's own retries are off


async def test_retry_after_ms_wins(server, make):
    server.script(Fail(503, "busy", headers={"retry-after-ms": "1500", "retry-after": "9"}))
    with pytest.raises(ModelError) as info:
        await make(server).complete([{"role": "user", "content": "go"}], [])
    assert (info.value.transient, info.value.retry_after, info.value.kind) == (True, 1.5, "server_error")


@pytest.mark.parametrize("status", [500, 502, 529])
async def test_5xx_is_transient(server, make, status):
    server.script(Fail(status, "internal"))
    with pytest.raises(ModelError) as info:
        await make(server).complete([{"role": "user", "content": "go"}], [])
    assert info.value.transient and info.value.status == status and info.value.retry_after is None


@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_4xx_is_permanent_with_the_providers_message(server, make, status):
    server.script(Fail(status, "Invalid 'messages[1].content': expected a string"))
    with pytest.raises(ModelError) as info:
        await make(server).complete([{"role": "user", "content": "go"}], [])
    assert not info.value.transient and info.value.status == status
    assert "Invalid 'messages[1].content': expected a string" in info.value.message


async def test_the_key_never_appears_in_an_error(server, make):
    server.script(Fail(401, f"Incorrect API key provided: {KEY}. Also sk-abc***wxyz is wrong."))
    with pytest.raises(ModelError) as info:
        await make(server).complete([{"role": "user", "content": "go"}], [])
    text = str(info.value)
    assert KEY not in text and "sk-abc" not in text and "[api key]" in text
    assert info.value.__cause__ is None and info.value.__context__ is None  # no SDK exception kept, hidden or not


async def test_timeout_is_transient(server, make):
    server.script(Hang())
    model = make(server, timeout=0.2)  # a request option, passed through to the SDK
    try:
        with pytest.raises(ModelError) as info:
            await model.complete([{"role": "user", "content": "go"}], [])
    finally:
        server.release()
    assert info.value.transient and info.value.kind == "timeout"


async def test_a_stream_cut_half_way_is_transient(server, make):
    server.script(Reply(text="a long answer that will be cut", cut_after=4))
    deltas: list[str] = []
    with pytest.raises(ModelError) as info:
        await make(server).complete([{"role": "user", "content": "go"}], [], stream=deltas.append)
    assert info.value.transient and info.value.kind == "connection"
    assert deltas  # some text had arrived before the cut


async def test_a_stream_that_ends_before_the_answer_does_is_transient(server, make):
    server.script(Reply(text="an answer without its end", end_after=3))
    with pytest.raises(ModelError) as info:
        await make(server).complete([{"role": "user", "content": "go"}], [])
    assert info.value.transient and info.value.kind == "stream_cut"


async def test_an_error_event_in_the_stream_is_transient(server, make):
    server.script(Reply(text="partial answer", error_after=3))
    with pytest.raises(ModelError) as info:
        await make(server).complete([{"role": "user", "content": "go"}], [])
    assert info.value.transient and "failed during the stream" in info.value.message


async def test_a_stream_callback_that_raises_is_the_apps_error_not_the_providers(server, make):
    """The app's stream= callback raising (here ConnectionError, which a provider's failure
    would be retried for) is no ModelError: one line names the callback and what it raised,
    with no key in it."""
    server.script(Reply(text="a streamed answer"))

    def callback(text: str) -> None:
        raise ConnectionError(f"my socket closed\n(key {KEY})")

    with pytest.raises(StreamCallbackError) as info:
        await make(server).complete([{"role": "user", "content": "go"}], [], stream=callback)
    error = info.value
    assert not isinstance(error, ModelError)
    assert (error.error_type, error.detail) == ("ConnectionError", "my socket closed (key [api key])")
    assert str(error).startswith("the stream= callback raised ConnectionError: my socket closed (key [api key])")
    assert "\n" not in str(error) and KEY not in str(error)
    assert error.__cause__ is None and error.__context__ is None  # the callback's exception (with the key) kept nowhere
    assert len(server.requests) == 1


async def test_an_async_stream_callback_is_refused_not_left_unawaited(server, make):
    """An ``async def`` callback returned a coroutine per delta that nobody awaited: the
    deltas were lost and Python warned "coroutine ... was never awaited" once per delta.
    It is the app's error, said on one line at the first delta."""
    server.script(Reply(text="a streamed answer"))
    got: list[str] = []

    async def callback(text: str) -> None:
        got.append(text)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "never awaited" RuntimeWarning either
        with pytest.raises(StreamCallbackError) as info:
            await make(server).complete([{"role": "user", "content": "go"}], [], stream=callback)
        gc.collect()
    assert info.value.error_type == "TypeError" and "not async def" in str(info.value)
    assert "\n" not in str(info.value) and got == []


async def test_a_refused_connection_is_transient(make):
    with ModelServer() as gone:
        model, where = make(gone), gone.url
    # That server is closed: nothing listens on its port any more.
    try:
        with pytest.raises(ModelError) as info:
            await model.complete([{"role": "user", "content": "go"}], [])
    finally:
        await MADE.pop().aclose()
    assert info.value.transient and info.value.kind in ("connection", "timeout")
    if info.value.kind == "connection":  # it says where it tried (a wrong base_url, a server not started)
        assert f"connection to {where}/" in info.value.message, info.value.message


# -- credentials and definition ----------------------------------------------------------------------


async def test_api_key_from_the_sessions_secrets(server, make):
    server.script(Reply(text="a"), Reply(text="b"))
    model = make(server, api_key=None, api_key_secret="provider")
    await model.complete([{"role": "user", "content": "go"}], [], secrets={"provider": "sk-from-secret-1"})
    await model.complete([{"role": "user", "content": "go"}], [], secrets={"provider": "sk-from-secret-2"})
    sent = [sent_key(r) for r in server.requests]
    assert sent == ["sk-from-secret-1", "sk-from-secret-2"]
    with pytest.raises(ModelError) as info:
        await model.complete([{"role": "user", "content": "go"}], [], secrets={})
    assert not info.value.transient and "'provider'" in info.value.message and info.value.kind == "config"


async def test_no_key_anywhere_is_one_config_error_saying_where_a_key_goes(server, make, monkeypatch):
    """No api_key=, no secret, nothing in the SDK's variable: the SDKs say it differently
    (OpenAI refuses to make a client; Anthropic makes one whose requests raise a
    TypeError); both are one permanent error naming the three ways, known before any call
    (``config_problem``, which a worker logs at start)."""
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    model = make(server, api_key=None)
    variable = "OPENAI_API_KEY" if isinstance(model, OpenAIChat) else "ANTHROPIC_API_KEY"
    problem = model.config_problem()
    assert problem is not None and "no API key" in problem and variable in problem and "api_key_secret" in problem
    assert f"a server at {server.url}" in problem  # a local server: any key does
    with pytest.raises(ModelError) as info:
        await model.complete([{"role": "user", "content": "go"}], [])
    assert info.value.message == problem and not info.value.transient and info.value.kind == "config"
    assert server.requests == []
    monkeypatch.setenv(variable, "sk-from-the-environment-1")
    assert make(server, api_key=None).config_problem() is None
    assert make(server, api_key=None, api_key_secret="provider").config_problem() is None  # per session
    assert make(server).config_problem() is None


def test_keys_never_in_repr_and_secretstr_accepted(server):
    model = openai(server, api_key=SecretStr(KEY))
    assert KEY not in repr(model) and "gpt-test" in repr(model)
    assert KEY not in repr(anthropic(server))


def test_misuse_is_caught_when_the_adapter_is_made(server):
    for make_ in (openai, anthropic):
        with pytest.raises(DefinitionError):
            make_(server, stream=True)
        with pytest.raises(DefinitionError):
            make_(server, messages=[])
        with pytest.raises(DefinitionError):
            make_(server, api_key="k", api_key_secret="name")
        with pytest.raises(DefinitionError):
            make_(server, client_options={"max_retries": 3})
    with pytest.raises(DefinitionError):
        OpenAIChat(model="")


@pytest.mark.parametrize("module", ["openai", "anthropic"])
def test_a_missing_extra_names_the_pip_command(monkeypatch, module):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(MissingExtra) as info:
        from_uri(f"{module}:some-model")
    assert f"pip install 'durable-harness[{module}]'" in str(info.value)


# -- from_uri ---------------------------------------------------------------------------------------


def test_from_uri_forms():
    m = from_uri("openai:gpt-4.1-mini", api_key="k")
    assert isinstance(m, OpenAIChat) and (m.model, m.base_url) == ("gpt-4.1-mini", None)
    a = from_uri("anthropic:claude-sonnet-4-5", api_key="k", max_tokens=1000)
    assert isinstance(a, AnthropicMessages) and a.model == "claude-sonnet-4-5" and a.options == {"max_tokens": 1000}
    o = from_uri("openai+http://127.0.0.1:11434/v1:llama3.2", api_key="ollama")
    assert isinstance(o, OpenAIChat) and (o.model, o.base_url) == ("llama3.2", "http://127.0.0.1:11434/v1")
    tagged = from_uri("openai+https://example.test:8443/api/v1:llama3.2:3b", api_key="k")
    assert (tagged.model, tagged.base_url) == ("llama3.2:3b", "https://example.test:8443/api/v1")  # type: ignore[attr-defined]
    b = from_uri("anthropic+http://127.0.0.1:9/proxy:claude-x", api_key_secret="anthropic")
    assert isinstance(b, AnthropicMessages) and b.base_url == "http://127.0.0.1:9/proxy" and b.api_key_secret == "anthropic"
    read = from_uri("openai:gpt-4o \n", api_key="k")  # from a file: the model name was 'gpt-4o \n'
    assert read.model == "gpt-4o"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "uri",
    ["gpt-4", "nosuch:model", "openai:", "openai+ftp://x/v1:m", "openai+http://host:8000:model", "openai+http://host/v1",
     "openai:gpt 4o", "  openai:  "],
)
def test_from_uri_refuses_unknown_forms(uri):
    with pytest.raises(DefinitionError):
        from_uri(uri, api_key="k")


def test_tool_spec_parameters_are_the_pydantic_schema():
    assert ToolSpec("lookup", "Look something up", Lookup.model_json_schema()) == SPEC
    assert json.loads(json.dumps(SPEC.parameters)) == SPEC.parameters


def test_the_sdks_are_imported_only_when_an_adapter_is_made():
    import subprocess

    code = (
        "import sys, harness, harness.models, harness.runtime.session\n"
        "from harness.models import from_uri\n"
        "assert 'openai' not in sys.modules and 'anthropic' not in sys.modules, 'an SDK was imported'\n"
        "from_uri('openai:gpt-x', api_key='k')\n"
        "assert 'openai' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


def test_from_uri_suggests_each_providers_own_base_url_form():
    """The example for a URI with no path sent Anthropic users to .../v1, and their requests
    to /v1/v1/messages (Anthropic's SDK adds /v1 itself)."""
    with pytest.raises(DefinitionError) as anthropic:
        from_uri("anthropic+http://127.0.0.1:9:c", api_key="k")
    assert "anthropic+http://127.0.0.1:8080/:claude-sonnet-4-5 (the API root: the SDK adds /v1)" in str(anthropic.value)
    assert "/v1:" not in str(anthropic.value)
    with pytest.raises(DefinitionError) as openai:
        from_uri("openai+http://127.0.0.1:9:m", api_key="k")
    assert "openai+http://127.0.0.1:11434/v1:llama3.2" in str(openai.value)
