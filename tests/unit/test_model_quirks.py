"""What real users and OpenAI-compatible servers do that the happy path does not: keys read
from files (a trailing newline), servers that stream tool calls their own way, refusals,
arguments sent as an object, answers that are no API's answer. Real SDKs, real wire format
(the local test server, or the SDK's own HTTP client on an ``httpx.MockTransport``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from harness.errors import DefinitionError, ModelError
from harness.models.anthropic import AnthropicMessages
from harness.models.openai import OpenAIChat
from harness.testing.model_server import ModelServer, Reply

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
    from harness.testing.model_server import Fail

    server.script(Fail(401, "Incorrect API key provided: gsk_0123************WXYZ. Find your key at https://example.test/keys"))
    with pytest.raises(ModelError) as info:
        await make(server, provider, api_key=KEY).complete(GO, [])
    assert "gsk_0123" not in info.value.message and "WXYZ" not in info.value.message
    assert "Incorrect API key provided: [api key]" in info.value.message and "example.test/keys" in info.value.message
