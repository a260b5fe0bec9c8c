"""What real users and OpenAI-compatible servers do that the happy path does not: keys read
from files (a trailing newline), servers that stream tool calls their own way, refusals,
arguments sent as an object, answers that are no API's answer. Real SDKs, real wire format
(the local test server, or the SDK's own HTTP client on an ``httpx.MockTransport``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio

from harness.errors import DefinitionError, ModelError
from harness.models.anthropic import AnthropicMessages
from harness.models.openai import OpenAIChat
from harness.testing.model_server import Fail, ModelServer, Reply

KEY = "gsk_0123456789abcdefWXYZ"  # not shaped like sk-...: only the adapter knows it is a key
GO = [{"role": "user", "content": "go"}]
MADE: list[Any] = []


@pytest_asyncio.fixture
async def server() -> AsyncIterator[ModelServer]:
    with ModelServer() as s:
        yield s
        while MADE:
            await MADE.pop().aclose()


def made(model: Any) -> Any:
    MADE.append(model)
    return model


def make(server: ModelServer, provider: str, **kw: Any) -> Any:
    if provider == "openai":
        return made(OpenAIChat(model="gpt-test", base_url=server.openai_url, **kw))
    return made(AnthropicMessages(model="claude-test", base_url=server.anthropic_url, **kw))


PROVIDERS = pytest.mark.parametrize("provider", ["openai", "anthropic"])


# -- keys with a line break -----------------------------------------------------------------------


@PROVIDERS
@pytest.mark.parametrize("key", [KEY + "\n", " " + KEY, KEY + "\r\n"])
def test_a_key_with_a_line_break_is_refused_when_the_adapter_is_made_and_never_quoted(server, provider, key):
    with pytest.raises(DefinitionError) as info:
        make(server, provider, api_key=key)
    assert "strip it" in str(info.value) and KEY not in str(info.value)


@PROVIDERS
async def test_a_key_with_a_line_break_in_a_session_secret_fails_at_once_and_is_never_quoted(server, provider):
    model = make(server, provider, api_key_secret="provider")
    with pytest.raises(ModelError) as info:
        await model.complete(GO, [], secrets={"provider": KEY + "\n"})
    assert not info.value.transient and info.value.kind == "config"
    assert "'provider'" in info.value.message and "strip it" in info.value.message
    assert KEY not in info.value.message and server.requests == []


async def test_a_key_with_a_line_break_in_the_environment_is_a_config_problem_never_quoted(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY + "\n")
    model = make(server, "openai")
    problem = model.config_problem()
    assert problem is not None and "OPENAI_API_KEY" in problem and KEY not in problem
    with pytest.raises(ModelError) as info:
        await model.complete(GO, [])
    assert not info.value.transient and KEY not in info.value.message and server.requests == []


@PROVIDERS
async def test_a_header_the_http_client_refuses_is_permanent_and_not_quoted(server, provider):
    """The safety net: h11 quotes a refused header whole (e.g. a token in default_headers)."""
    model = make(server, provider, api_key="sk-fine-0001",
                 client_options={"default_headers": {"x-team-token": "team-secret-42\n"}})
    server.script(Reply(text="never"))
    with pytest.raises(ModelError) as info:
        await model.complete(GO, [])
    assert not info.value.transient and info.value.kind == "config"
    assert "team-secret-42" not in info.value.message and "header" in info.value.message


@PROVIDERS
async def test_a_key_echoed_masked_is_removed_whatever_its_shape(server, provider):
    server.script(Fail(401, "Incorrect API key provided: gsk_0123************WXYZ. Find your key at https://example.test/keys"))
    with pytest.raises(ModelError) as info:
        await make(server, provider, api_key=KEY).complete(GO, [])
    assert "gsk_0123" not in info.value.message and "WXYZ" not in info.value.message
    assert "Incorrect API key provided: [api key]" in info.value.message and "example.test/keys" in info.value.message



@PROVIDERS
async def test_a_key_from_the_environment_echoed_by_the_server_is_removed_and_kept_nowhere(
    server, provider, monkeypatch
):
    """A key the SDK read from OPENAI_API_KEY / ANTHROPIC_API_KEY (not shaped like sk-...) came
    back whole in the ModelError, so in the worker's log lines and the session's log, and the
    SDK's exception quoting it stayed on as the error's __context__."""
    monkeypatch.setenv("OPENAI_API_KEY" if provider == "openai" else "ANTHROPIC_API_KEY", KEY)
    server.script(Fail(401, f"Incorrect API key provided: {KEY}. Find your key at https://example.test/keys"))
    with pytest.raises(ModelError) as info:
        await make(server, provider).complete(GO, [])
    assert KEY not in info.value.message and "Incorrect API key provided: [api key]" in info.value.message
    assert info.value.__context__ is None and info.value.__cause__ is None


@PROVIDERS
async def test_a_password_in_the_base_url_is_shown_nowhere(server, provider):
    host = server.openai_url if provider == "openai" else server.anthropic_url
    url = host.replace("http://", "http://bob:tok_PASSWORD123456@")
    model = made(OpenAIChat(model="gpt-test", base_url=url, api_key="none") if provider == "openai"
                 else AnthropicMessages(model="claude-test", base_url=url, api_key="none"))
    assert "tok_PASSWORD123456" not in repr(model) and "http://***@" in repr(model)
    server.script(Fail(400, f"no route {url}"))
    with pytest.raises(ModelError) as info:
        await model.complete(GO, [])
    assert "tok_PASSWORD123456" not in info.value.message

# -- the raw wire of OpenAI-compatible servers ------------------------------------------------------


def wire(answer: Callable[[httpx.Request], httpx.Response], *, key: str = "ollama", **kw: Any) -> OpenAIChat:
    """An OpenAIChat whose SDK client sends its requests to ``answer`` (no socket)."""
    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return made(OpenAIChat(model="llama3.2", base_url="http://127.0.0.1:11434/v1", api_key=key,
                           client_options={"http_client": client}, **kw))


def sse(*chunks: dict[str, Any]) -> Callable[[httpx.Request], httpx.Response]:
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    return lambda request: httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "llama3.2",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def call(cid: str | None, arguments: Any, index: int | None = 0, name: str | None = "lookup") -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if cid is not None:
        out["id"] = cid
    if index is not None:
        out["index"] = index
    return out


def completion(message: dict[str, Any], finish: str = "stop") -> Callable[[httpx.Request], httpx.Response]:
    body = {"id": "c", "object": "chat.completion", "created": 1, "model": "llama3.2",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    return lambda request: httpx.Response(200, json=body)


async def test_calls_streamed_whole_at_index_0_stay_two_calls():
    """Ollama sends each parallel call whole, every one at index 0."""
    model = wire(sse(
        chunk({"role": "assistant", "content": "", "tool_calls": [call("call_a", '{"q":"a"}')]}),
        chunk({"role": "assistant", "content": "", "tool_calls": [call("call_b", '{"q":"b"}')]}),
        chunk({}, "tool_calls"),
    ))
    answer = await model.complete(GO, [])
    assert [(c.id, c.name, c.arguments) for c in answer.tool_calls] == [
        ("call_a", "lookup", {"q": "a"}), ("call_b", "lookup", {"q": "b"}),
    ]


async def test_calls_streamed_without_an_index_stay_apart_and_pieces_join():
    model = wire(sse(
        chunk({"role": "assistant", "tool_calls": [call("c1", '{"q":', None), call("c2", '{"q":"b"}', None)]}),
        chunk({"tool_calls": [call("c2", "", None, name="lookup")]}),  # the id and name repeated: the same call
        chunk({"tool_calls": [call("c3", '{"q":', None), ]}),
        chunk({"tool_calls": [call(None, '"c"}', None, name=None)]}),  # no id, no index: the last call goes on
        chunk({}, "tool_calls"),
    ))
    answer = await model.complete(GO, [])
    assert [(c.id, c.name, c.arguments) for c in answer.tool_calls] == [
        ("c1", "lookup", '{"q":'), ("c2", "lookup", {"q": "b"}), ("c3", "lookup", {"q": "c"}),
    ]


async def test_openais_own_parallel_calls_still_join_by_index():
    model = wire(sse(
        chunk({"role": "assistant", "tool_calls": [call("c1", "", 0), ]}),
        chunk({"tool_calls": [call(None, '{"q"', 0, name=None)]}),
        chunk({"tool_calls": [call("c2", "", 1)]}),
        chunk({"tool_calls": [call(None, ':"x"}', 0, name=None), call(None, '{"q":"y"}', 1, name=None)]}),
        chunk({}, "tool_calls"),
    ))
    answer = await model.complete(GO, [])
    assert [(c.id, c.arguments) for c in answer.tool_calls] == [("c1", {"q": "x"}), ("c2", {"q": "y"})]


@pytest.mark.parametrize("streaming", [True, False])
async def test_arguments_sent_as_an_object_are_taken_as_they_are(streaming):
    if streaming:
        answer = sse(chunk({"role": "assistant", "tool_calls": [call("c1", {"q": "a"})]}), chunk({}, "tool_calls"))
    else:
        answer = completion({"content": None, "tool_calls": [call("c1", {"q": "a"}, None)]}, "tool_calls")
    result = await wire(answer, streaming=streaming).complete(GO, [])
    assert [(c.id, c.arguments) for c in result.tool_calls] == [("c1", {"q": "a"})]


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_refusal_is_the_answers_text_with_finish_reason_content_filter(streaming):
    if streaming:
        answer = sse(chunk({"role": "assistant", "content": None, "refusal": ""}),
                     chunk({"refusal": "I can't help "}), chunk({"refusal": "with that."}), chunk({}, "stop"))
    else:
        answer = completion({"content": None, "refusal": "I can't help with that."})
    result = await wire(answer, streaming=streaming).complete(GO, [])
    assert (result.text, result.finish_reason) == ("I can't help with that.", "content_filter")


async def test_a_200_that_is_no_chat_completions_answer_says_so():
    """A base_url that points at a web page, not at the API."""
    page = lambda request: httpx.Response(200, text="<html>Welcome</html>", headers={"content-type": "text/html"})  # noqa: E731
    with pytest.raises(ModelError) as info:
        await wire(page, streaming=False).complete(GO, [])
    assert not info.value.transient and info.value.kind == "bad_response"
    assert "http://127.0.0.1:11434/v1" in info.value.message and "base_url" in info.value.message


async def test_a_200_that_is_no_messages_api_answer_says_so():
    import anthropic

    http = anthropic._client.httpx2 if hasattr(anthropic._client, "httpx2") else httpx  # the SDK's own HTTP library
    page = lambda request: http.Response(200, text="<html>Welcome</html>", headers={"content-type": "text/html"})  # noqa: E731
    client = http.AsyncClient(transport=http.MockTransport(page))
    model = made(AnthropicMessages(model="claude-test", base_url="http://127.0.0.1:8080", api_key=KEY, streaming=False,
                                   client_options={"http_client": client}))
    with pytest.raises(ModelError) as info:
        await model.complete(GO, [])
    assert not info.value.transient and info.value.kind == "bad_response" and "base_url" in info.value.message


@PROVIDERS
async def test_a_429_for_a_spent_quota_is_permanent(server, provider):
    """OpenAI answers 429 insufficient_quota when the budget is spent: six retries would
    only delay the failure by minutes."""
    from harness.testing.model_server import Fail

    server.script(Fail(429, "You exceeded your current quota, please check your plan and billing details.",
                       error_type="insufficient_quota"), Fail(429, "Rate limit reached", headers={"retry-after": "1"}))
    model = make(server, provider, api_key=KEY)
    with pytest.raises(ModelError) as info:
        await model.complete(GO, [])
    assert (info.value.transient, info.value.kind, info.value.status) == (False, "quota", 429)
    assert "exceeded your current quota" in info.value.message
    with pytest.raises(ModelError) as info:
        await model.complete(GO, [])
    assert (info.value.transient, info.value.kind) == (True, "rate_limited")  # a plain 429 is still retried
