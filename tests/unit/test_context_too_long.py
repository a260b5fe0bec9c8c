"""A request over the model's context window: the adapters raise ``ContextTooLong`` (real
SDKs against the local provider server), it is never retried, and the turn fails with code
``context_too_long`` and a reason saying how to fix it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from harness import ContextTooLong, chat, define_harness
from harness.errors import ModelError
from harness.models import from_uri
from harness.testing.model_server import Fail, ModelServer, Reply

from .conftest import entries, types

SID = "s-1"
KEY = "sk-test-0123456789abcdef"

OPENAI_OVERFLOW = Fail(
    400,
    "This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. "
    "Please reduce the length of the messages.",
    code="context_length_exceeded",
)
ANTHROPIC_OVERFLOW = Fail(400, "prompt is too long: 208310 tokens > 200000 maximum")
OVERFLOW = {"openai": OPENAI_OVERFLOW, "anthropic": ANTHROPIC_OVERFLOW}


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


def make_model(server: ModelServer, provider: str, models: list[Any], **options: Any) -> Any:
    base = server.openai_url if provider == "openai" else server.anthropic_url + "/"
    model = from_uri(f"{provider}+{base}:test-model", api_key=KEY, **options)
    models.append(model)
    return model


GO = [{"role": "user", "content": "go"}]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("streaming", [True, False])
async def test_the_providers_overflow_refusal_is_context_too_long(server, models, provider, streaming):
    server.script(OVERFLOW[provider])
    with pytest.raises(ContextTooLong) as info:
        await make_model(server, provider, models, streaming=streaming).complete(GO, [])
    error = info.value
    assert isinstance(error, ModelError)
    assert (error.transient, error.status, error.kind) == (False, 400, "context_too_long")
    assert OVERFLOW[provider].message in error.provider_message
    assert error.message.endswith(ContextTooLong.FIX) and "history=History(" in error.message
    assert "\n" not in error.message


@pytest.mark.parametrize(
    ("status", "message", "error_type"),
    [
        (400, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
              "(4000 in the messages, 1000 in the completion).", None),  # vLLM, DeepSeek
        (400, "the request exceeds the available context size, try increasing it", "exceed_context_size_error"),  # llama.cpp
        (400, "the input length exceeds the context length", None),  # Ollama
        (413, "Request too large: the prompt exceeds the context window of this model", None),
    ],
)
async def test_openai_compatible_servers_say_it_their_own_way(server, models, status, message, error_type):
    server.script(Fail(status, message, error_type=error_type))
    with pytest.raises(ContextTooLong) as info:
        await make_model(server, "openai", models).complete(GO, [])
    assert not info.value.transient and info.value.status == status


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize(
    "message",
    ["Invalid 'messages[1].content': expected a string", "max_tokens is too large: 100000. This model supports "
     "at most 16384 completion tokens"],
)
async def test_other_bad_requests_stay_plain_model_errors(server, models, provider, message):
    server.script(Fail(400, message))
    with pytest.raises(ModelError) as info:
        await make_model(server, provider, models).complete(GO, [])
    assert not isinstance(info.value, ContextTooLong) and info.value.kind == "bad_request"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_an_overflow_fails_the_turn_with_its_code_and_is_not_retried(host, log, server, models, provider):
    server.script(OVERFLOW[provider], Reply(text="a new session would work"))
    session = await host.open(define_harness(name="t/long", model=make_model(server, provider, models)), session_id=SID)
    result = await session.send("one message too many", input_id="in-1")
    assert (result.outcome, result.code) == ("failed", "context_too_long")
    said = OVERFLOW[provider].message.removesuffix(".")  # (its full stop gives way to the fix's '; ')
    assert f"{said}; to fix it, bound what each request sends" in (result.error or ""), result.error
    assert ".;" not in (result.error or "")
    assert "history=History(" in (result.error or "") and "start a new session" in (result.error or "")
    assert len(server.requests) == 1  # permanent: no second try
    assert "harness.model.retry" not in await types(log, SID)
    [finished] = await entries(log, SID, "harness.turn.finished")
    assert finished["code"] == "context_too_long"


async def test_chat_raises_context_too_long_without_retrying(server, models):
    server.script(OPENAI_OVERFLOW, Reply(text="never asked"))
    with pytest.raises(ContextTooLong):
        await chat(model=make_model(server, "openai", models), messages=GO)
    assert len(server.requests) == 1


async def test_an_adapter_of_your_own_gets_the_same_code(host):
    class Small:
        async def complete(self, messages: list[dict[str, Any]], tools: Any = ()) -> Any:
            raise ContextTooLong("mine: 9000 tokens > 8192", status=400)

    session = await host.open(define_harness(name="t/own", model=Small()), session_id=SID)
    result = await session.send("hi", input_id="in-1")
    assert (result.outcome, result.code) == ("failed", "context_too_long")
    assert (result.error or "").startswith("mine: 9000 tokens > 8192; ")


async def test_a_refusal_ending_in_a_full_stop_reads_as_one_sentence(host):
    class Small:
        async def complete(self, messages: list[dict[str, Any]], tools: Any = ()) -> Any:
            raise ContextTooLong("Your prompt is 9000 tokens, over the 8192 of this model. ")

    session = await host.open(define_harness(name="t/own", model=Small()), session_id=SID)
    result = await session.send("hi", input_id="in-1")
    assert (result.error or "").startswith("Your prompt is 9000 tokens, over the 8192 of this model; to fix it, ")
    assert ContextTooLong("cut off...").message.startswith("cut off...; ")  # (an ellipsis stays)
