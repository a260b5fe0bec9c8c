"""A request over the model's context window: the adapters raise ``ContextTooLong`` (real
SDKs against the local provider server), it is never retried, and the turn fails with code
``context_too_long`` and a reason saying how to fix it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from harness import ContextTooLong, chat, define_harness
from harness.errors import ModelError, RequestTooLarge
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


# -- a request body over the provider's size limit (HTTP 413) -------------------------------------------

ANTHROPIC_413 = Fail(413, "Request exceeds the maximum allowed number of bytes.", error_type="request_too_large")
NGINX_413 = ("<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n"
             "<center><h1>413 Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize(
    ("provider", "answer", "said"),
    [
        ("anthropic", ANTHROPIC_413, "Request exceeds the maximum allowed number of bytes"),
        ("openai", Fail(413, "Request Entity Too Large: the body is over 32 MB"), "Request Entity Too Large: the body"),
        ("openai", Fail(413, "", html=NGINX_413), "413 Request Entity Too Large 413 Request Entity Too Large nginx"),
        ("anthropic", Fail(413, "", html=NGINX_413), "413 Request Entity Too Large"),
    ],
    ids=["anthropic", "openai-compatible", "openai-proxy-page", "anthropic-proxy-page"],
)
async def test_a_413_is_request_too_large_one_line_saying_to_send_less(server, models, provider, answer, said, streaming):
    server.script(answer, Reply(text="never asked"))
    with pytest.raises(RequestTooLarge) as info:
        await make_model(server, provider, models, streaming=streaming).complete(GO, [])
    error = info.value
    assert isinstance(error, ContextTooLong)  # (except ContextTooLong catches it too: the cure is the same)
    assert (error.transient, error.status, error.kind, error.code) == (False, 413, "request_too_large", "request_too_large")
    assert said in error.message and "<" not in error.message and "\n" not in error.message and "\r" not in error.message
    assert error.message.endswith(RequestTooLarge.FIX)
    assert "over the provider's size limit" in error.message and "history=History(max_chars=" in error.message
    assert len(server.requests) == 1


async def test_a_413_that_says_context_is_still_context_too_long(server, models):
    server.script(Fail(413, "Request too large: the prompt exceeds the context window of this model"))
    with pytest.raises(ContextTooLong) as info:
        await make_model(server, "openai", models).complete(GO, [])
    assert type(info.value) is ContextTooLong and info.value.code == "context_too_long"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_413_fails_the_turn_with_request_too_large_and_is_not_retried(host, log, server, models, provider):
    server.script(ANTHROPIC_413, Reply(text="never asked"))
    session = await host.open(define_harness(name="t/big", model=make_model(server, provider, models)), session_id=SID)
    result = await session.send("a huge message", input_id="in-1")
    assert (result.outcome, result.code) == ("failed", "request_too_large")
    assert "Request exceeds the maximum allowed number of bytes; the request is over the provider's size limit; " \
           "to fix it, send less" in (result.error or ""), result.error
    assert len(server.requests) == 1
    assert "harness.model.retry" not in await types(log, SID)
    [finished] = await entries(log, SID, "harness.turn.finished")
    assert finished["code"] == "request_too_large"


# -- an overflow refused in the middle of a stream (after 200 OK) ---------------------------------------

MID_STREAM_OVERFLOW = {
    # Anthropic: event: error {"type": "error", "error": {"type": "invalid_request_error", ...}}
    "anthropic": Reply(text="never seen", error_after=1, error_type="invalid_request_error",
                       error_message="prompt is too long: 208310 tokens > 200000 maximum"),
    # vLLM: data: {"error": {"type": "BadRequestError", "code": 400, ...}}
    "vllm": Reply(text="never seen", error_after=1, error_type="BadRequestError", error_code=400,
                  error_message="This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."),
    # llama.cpp: data: {"error": {"type": "exceed_context_size_error", "code": 400, ...}}
    "llama.cpp": Reply(text="never seen", error_after=1, error_type="exceed_context_size_error", error_code=400,
                       error_message="the request exceeds the available context size, try increasing it"),
}


@pytest.mark.parametrize("server_kind", list(MID_STREAM_OVERFLOW))
async def test_an_overflow_error_event_mid_stream_is_context_too_long(server, models, server_kind):
    provider = "anthropic" if server_kind == "anthropic" else "openai"
    server.script(MID_STREAM_OVERFLOW[server_kind])
    with pytest.raises(ContextTooLong) as info:
        await make_model(server, provider, models).complete(GO, [])
    error = info.value
    assert type(error) is ContextTooLong
    assert (error.transient, error.kind) == (False, "context_too_long")
    assert MID_STREAM_OVERFLOW[server_kind].error_message.removesuffix(".") in error.message
    assert "error during the stream" in error.message and error.message.endswith(ContextTooLong.FIX)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_other_error_events_mid_stream_keep_their_classification(server, models, provider):
    server.script(Reply(text="partial", error_after=2, error_type="overloaded_error",
                        error_message="Overloaded: the context of the cluster is full"))
    with pytest.raises(ModelError) as info:
        await make_model(server, provider, models).complete(GO, [])
    assert not isinstance(info.value, ContextTooLong) and info.value.transient  # retried, as ever
    if provider == "anthropic":  # an invalid request that is no overflow stays a permanent bad_request
        server.script(Reply(text="partial", error_after=2, error_type="invalid_request_error",
                            error_message="messages.1.content: Input should be a valid list"))
        with pytest.raises(ModelError) as info:
            await make_model(server, provider, models).complete(GO, [])
        assert not isinstance(info.value, ContextTooLong)
        assert (info.value.transient, info.value.kind) == (False, "bad_request")
    else:  # OpenAI-compatible: any other error event is retried, as ever
        server.script(Reply(text="partial", error_after=2, error_type="BadRequestError", error_code=400,
                            error_message="invalid tool schema"))
        with pytest.raises(ModelError) as info:
            await make_model(server, provider, models).complete(GO, [])
        assert not isinstance(info.value, ContextTooLong) and info.value.transient


@pytest.mark.parametrize("server_kind", ["anthropic", "vllm"])
async def test_a_mid_stream_overflow_fails_the_turn_at_once(host, log, server, models, server_kind):
    provider = "anthropic" if server_kind == "anthropic" else "openai"
    server.script(MID_STREAM_OVERFLOW[server_kind], Reply(text="never asked"))
    session = await host.open(define_harness(name="t/long", model=make_model(server, provider, models)), session_id=SID)
    # (a retry would wait on the fake clock for ever: a time-out here means it was retried)
    result = await asyncio.wait_for(session.send("one message too many", input_id="in-1"), timeout=20)
    assert (result.outcome, result.code) == ("failed", "context_too_long")
    assert len(server.requests) == 1
    assert "harness.model.retry" not in await types(log, SID)


# -- older vLLM: the error object not wrapped in "error" -----------------------------------------------

VLLM_BARE = "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."


@pytest.mark.parametrize("streaming", [True, False])
async def test_older_vllms_unwrapped_error_answer_is_context_too_long(server, models, streaming):
    """HTTP 400 with {"object": "error", "message": ..., "type": "BadRequestError", "code": 400}."""
    server.script(Fail(400, VLLM_BARE, bare=True), Reply(text="never asked"))
    with pytest.raises(ContextTooLong) as info:
        await make_model(server, "openai", models, streaming=streaming).complete(GO, [])
    error = info.value
    assert type(error) is ContextTooLong and (error.transient, error.status) == (False, 400)
    assert VLLM_BARE.removesuffix(".") in error.message and error.message.endswith(ContextTooLong.FIX)
    assert len(server.requests) == 1


async def test_older_vllms_unwrapped_error_chunk_mid_stream_is_context_too_long(host, log, server, models):
    """data: {"object": "error", "message": ..., "type": "BadRequestError", "code": 400} after 200 OK."""
    server.script(Reply(text="never seen", error_after=1, error_type="BadRequestError", error_code=400,
                        error_message=VLLM_BARE, error_bare=True))
    with pytest.raises(ContextTooLong) as info:
        await make_model(server, "openai", models).complete(GO, [])
    error = info.value
    assert type(error) is ContextTooLong and (error.transient, error.kind) == (False, "context_too_long")
    assert VLLM_BARE.removesuffix(".") in error.message and "error during the stream" in error.message

    server.script(Reply(text="never seen", error_after=1, error_type="BadRequestError", error_code=400,
                        error_message=VLLM_BARE, error_bare=True), Reply(text="never asked"))
    session = await host.open(define_harness(name="t/long", model=make_model(server, "openai", models)), session_id=SID)
    result = await asyncio.wait_for(session.send("one message too many", input_id="in-1"), timeout=20)
    assert (result.outcome, result.code) == ("failed", "context_too_long")
    assert len(server.requests) == 2  # (one above, one here: never retried)


async def test_older_vllms_other_unwrapped_errors_mid_stream_are_errors_not_answers(server, models):
    """Any other error object of that shape mid-stream is an error during the stream
    (retried), not a chunk with no choices read as an empty answer."""
    server.script(Reply(text="partial", error_after=2, error_type="InternalServerError", error_code=500,
                        error_message="the engine died", error_bare=True))
    with pytest.raises(ModelError) as info:
        await make_model(server, "openai", models).complete(GO, [])
    assert not isinstance(info.value, ContextTooLong) and info.value.transient
    assert "the engine died" in info.value.message
