"""``OpenAIChat``: OpenAI Chat Completions with tools, on the official ``openai`` SDK.

Also every OpenAI-compatible server (vLLM, Ollama, LM Studio, llama.cpp server,
Together, Groq ...) through ``base_url``. Extra ``[openai]``; the SDK is imported
when the first call is made.

Mapping (the harness' chat-completions-shaped messages -> the request body):

* system / user messages as they are; several system messages stay in place;
* an assistant message's ``tool_calls`` -> ``[{"id", "type": "function", "function":
  {"name", "arguments": <compact JSON text>}}]`` (``content`` null when it has no text);
* a tool result -> ``{"role": "tool", "tool_call_id", "content"}``. Chat Completions has
  no error flag: an error result's content is the harness' error JSON
  (``{"error": <code>, "message": ...}``), which says so itself;
* tools -> ``{"type": "function", "function": {"name", "description", "parameters":
  <the pydantic model's JSON schema>}}``;
* ``**options`` (temperature, max_tokens, max_completion_tokens, tool_choice,
  parallel_tool_calls, seed, reasoning_effort, extra_body, extra_headers, timeout ...)
  go to ``chat.completions.create`` as they are.

The answer: text, every tool call (several per response), ``finish_reason`` (``length``
= cut at the output limit), usage (``prompt_tokens``/``completion_tokens``, the model
name, and cost from ``pricing=`` or a ``usage.cost`` the server reports); a refusal
(``message.refusal``, no content) is the text, with ``finish_reason`` ``content_filter``.
Compatible servers' ways of streaming tool calls (every call whole at index 0, no index,
the arguments as an object) give the same calls as OpenAI's (see ``_StreamedCalls``). Streaming
(``streaming=True``, the default) asks for ``stream_options.include_usage`` unless
``stream_usage=False`` (for servers that refuse it). A stream is complete when a chunk
carried a ``finish_reason`` or the stream ended with ``data: [DONE]``: some servers (older
llama.cpp and vLLM builds) never send a finish reason, which is then ``tool_calls`` if the
answer has calls, else ``stop``. A stream that ends with neither was cut: a transient
error (retried). An error in the middle of a stream is an error whether the server wraps
it (``data: {"error": {...}}``) or not (older vLLM: ``data: {"object": "error", "message":
..., "code": 400}``); a context overflow is ``ContextTooLong`` either way.

The SDK's own retries are off (``max_retries=0``): the harness retries, durably.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from harness.errors import ModelError, StreamCallbackError
from harness.models._provider import ProviderModel, Utf16Joiner, parse_arguments, tokens, utf16_text
from harness.models.base import ModelResponse, StreamSink, ToolCall, ToolSpec, Usage, guarded_sink

__all__ = ["OpenAIChat", "to_openai_messages", "to_openai_tools"]

_FINISH = {"stop": "stop", "tool_calls": "tool_calls", "function_call": "tool_calls", "length": "length",
           "content_filter": "content_filter"}


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments  # the model's own text (not a JSON object): sent back as it was
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False, separators=(",", ":"))


def to_openai_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The harness' messages as a Chat Completions ``messages`` list."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role in ("system", "user"):
            out.append({"role": role, "content": m.get("content") or ""})
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            message: dict[str, Any] = {"role": "assistant", "content": m.get("content") or (None if calls else "")}
            if calls:
                message["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": _arguments_text(c.get("arguments"))},
                    }
                    for c in calls
                ]
            out.append(message)
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": m.get("content") or ""})
        else:
            raise ModelError(f"openai: a message with role {role!r} cannot be sent", transient=False, kind="bad_request")
    return out


def to_openai_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ]


class OpenAIChat(ProviderModel):
    """A model served by the OpenAI Chat Completions API (or any compatible server).

    Args:
        model: the model name (``gpt-4.1-mini``, ``llama3.2`` ...).
        base_url: another server's API root (``http://127.0.0.1:11434/v1``); default OpenAI.
        api_key: the key; or ``api_key_secret``: the name of the session secret holding it;
            neither: the SDK reads ``OPENAI_API_KEY``.
        pricing: US dollars per million tokens, for ``Usage.cost``.
        streaming: stream answers (text deltas reach live subscribers); default True.
        stream_usage: ask a streamed answer for its usage (``stream_options``); default True.
        client_options: more ``AsyncOpenAI`` settings (``organization``, ``default_headers``,
            ``timeout``, ``http_client`` ...).
        **options: passed to ``chat.completions.create`` as they are.
    """

    provider: ClassVar[str] = "openai"
    extra: ClassVar[str] = "openai"
    sdk_module: ClassVar[str] = "openai"
    reserved_options: ClassVar[frozenset[str]] = frozenset({"model", "messages", "tools", "stream", "stream_options"})
    key_variable: ClassVar[str] = "OPENAI_API_KEY"

    def __init__(self, *, model: str, stream_usage: bool = True, **kwargs: Any) -> None:
        super().__init__(model=model, **kwargs)
        self.stream_usage = stream_usage

    def _make_client(self, api_key: str | None) -> Any:
        return self.sdk.AsyncOpenAI(api_key=api_key, base_url=self.base_url, max_retries=0, **self._client_options)

    def _means_no_key(self, exc: Exception) -> bool:
        # The client's constructor raises OpenAIError itself only for missing credentials.
        return type(exc) is self.sdk.OpenAIError

    def request_body(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` (without ``stream``)."""
        body: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(messages)}
        if tools:
            body["tools"] = to_openai_tools(tools)
        body.update(self.options)
        return body

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: Sequence[ToolSpec],
        *,
        stream: StreamSink | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> ModelResponse:
        client, key = self.client(secrets)
        stream = guarded_sink(stream, lambda text: self.scrub(text, key))
        error: Exception
        body = self.split_options(client.chat.completions.create, self.request_body(messages, tools))
        try:
            if not self.streaming:
                return self._parse(await client.chat.completions.create(**body))
            extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if self.stream_usage else {}
            chunks = await client.chat.completions.create(**body, stream=True, **extra)
            done = _watch_done(chunks)
            try:
                return await self._read_stream(chunks, stream, done)
            finally:
                await chunks.close()
        except StreamCallbackError as exc:  # the app's callback failed, not the provider
            error = exc
        except Exception as exc:  # noqa: BLE001 - classified: transient (retried) or permanent
            error = self.model_error(exc, key)
        # Raised here, not in the except: the SDK's exception (which may quote the key) is
        # then not kept as its __context__ for whoever walks the chain.
        raise error

    def _usage(self, usage: Any, model: str | None) -> Usage | None:
        if usage is None:
            return None
        tokens_in = tokens(getattr(usage, "prompt_tokens", 0))
        tokens_out = tokens(getattr(usage, "completion_tokens", 0))
        return Usage(tokens_in, tokens_out, model, self.cost(tokens_in, tokens_out, getattr(usage, "cost", None)))

    def _parse(self, completion: Any) -> ModelResponse:
        if not hasattr(completion, "choices"):  # a body that is no JSON object (an HTML page ...)
            raise self.not_the_api(completion, "Chat Completions")
        if not completion.choices:
            raise ModelError("openai: the answer has no choices", transient=False, kind="bad_response")
        choice = completion.choices[0]
        message = choice.message
        calls = [
            ToolCall(id=c.id, name=c.function.name, arguments=parse_arguments(c.function.arguments))
            for c in (message.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        content = utf16_text(message.content) if isinstance(message.content, str) else message.content
        text, finish = _refused(content, getattr(message, "refusal", None), calls, choice.finish_reason)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            finish_reason=_FINISH.get(finish, finish),
            usage=self._usage(completion.usage, completion.model),
        )

    async def _read_stream(self, chunks: Any, sink: StreamSink | None, done: _DoneWatch | None = None) -> ModelResponse:
        parts: list[str] = []
        refusal: list[str] = []
        calls = _StreamedCalls()
        joiner = Utf16Joiner()  # (an emoji's surrogates may come in two chunks)
        finish: str | None = None
        usage: Any = None
        model: str | None = None
        async for chunk in chunks:
            if getattr(chunk, "object", None) == "error":
                # Older vLLM builds send the error object itself ({"object": "error", "message": ...,
                # "code": 400}), not {"error": {...}}: the SDK passes it on as a chunk with no choices.
                raise self._error_chunk(chunk, chunks)
            model = chunk.model or model
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices or ():
                if choice.index not in (0, None):
                    continue
                delta = choice.delta
                if delta is not None and delta.content:
                    piece = joiner.feed(delta.content)
                    parts.append(piece)
                    if sink is not None and piece:
                        sink(piece)
                if delta is not None and getattr(delta, "refusal", None):
                    refusal.append(delta.refusal)
                for tc in (delta.tool_calls if delta is not None else None) or ():
                    calls.add(tc)
                if choice.finish_reason:
                    finish = choice.finish_reason
        if rest := joiner.end():
            parts.append(rest)
            if sink is not None:
                sink(rest)
        tool_calls = calls.tool_calls()
        if finish is None and done is not None and done.seen:
            finish = "tool_calls" if tool_calls else "stop"  # a server that sends no finish_reason
        if finish is None:
            raise ModelError("openai: the stream ended before the answer was complete", transient=True, kind="stream_cut")
        text, finish = _refused("".join(parts) or None, "".join(refusal) or None, tool_calls, finish)
        return ModelResponse(
            text=text,
            tool_calls=tool_calls,
            finish_reason=_FINISH.get(finish, finish),
            usage=self._usage(usage, model),
        )

    def _error_chunk(self, chunk: Any, chunks: Any) -> BaseException:
        """An error object sent as a chunk, as the SDK's own error event (``APIError`` with the
        object as its body), so that :meth:`model_error` reads it as it reads ``{"error": ...}``."""
        body = chunk.to_dict() if hasattr(chunk, "to_dict") else dict(vars(chunk))
        message = body.get("message") if isinstance(body.get("message"), str) else "the server sent an error object"
        request = getattr(getattr(chunks, "response", None), "request", None)
        error: BaseException = self.sdk.APIError(message, request, body=body)
        return error


class _DoneWatch:
    """The SDK stream's SSE decoder, passed through, noting whether ``data: [DONE]`` came.

    The SDK ends its iteration the same way at ``[DONE]`` and at a body that just stops,
    so the events are watched where it reads them (``AsyncStream._decoder``, made in its
    constructor and first used when iteration begins)."""

    def __init__(self, decoder: Any) -> None:
        self._decoder = decoder
        self.seen = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._decoder, name)

    async def aiter_bytes(self, iterator: Any) -> Any:
        async for sse in self._decoder.aiter_bytes(iterator):
            if isinstance(getattr(sse, "data", None), str) and sse.data.startswith("[DONE]"):
                self.seen = True
            yield sse


def _watch_done(chunks: Any) -> _DoneWatch | None:
    """A watch on ``chunks``' ``[DONE]``; None when this SDK's stream has no decoder to
    watch (then a stream without a finish reason counts as cut, as before)."""
    decoder = getattr(chunks, "_decoder", None)
    if decoder is None or not hasattr(decoder, "aiter_bytes"):
        return None
    watch = _DoneWatch(decoder)
    chunks._decoder = watch
    return watch


def _refused(content: str | None, refusal: str | None, calls: Sequence[ToolCall], finish: str) -> tuple[str | None, str]:
    """An answer that is a refusal (``message.refusal``, no content): its text is the
    refusal and its finish reason ``content_filter``, so neither is lost."""
    if refusal and not content and not calls:
        return refusal, "content_filter"
    return content, finish


class _StreamedCalls:
    """The tool calls of a streamed answer, put together from their deltas.

    OpenAI sends each call's first delta with its ``index`` and ``id``, then pieces of its
    arguments under the same index. Compatible servers differ: some send every call whole
    at index 0 (Ollama), some send no index at all, some repeat the id or the name in every
    delta, some send the arguments as an object. A delta with an id other than the call's
    at its index starts a new call; one without an index continues the last call unless
    its id is new.
    """

    def __init__(self) -> None:
        self._calls: list[dict[str, str]] = []
        self._at: dict[int, dict[str, str]] = {}

    def add(self, tc: Any) -> None:
        index = getattr(tc, "index", None)
        cid = getattr(tc, "id", None) or ""
        entry = self._at.get(index) if isinstance(index, int) else (self._calls[-1] if self._calls else None)
        if entry is None or (cid and entry["id"] and cid != entry["id"]):
            entry = {"id": "", "name": "", "arguments": ""}
            self._calls.append(entry)
        if isinstance(index, int):
            self._at[index] = entry
        if cid:
            entry["id"] = cid
        function = getattr(tc, "function", None)
        if function is None:
            return
        name = function.name or ""
        if name and name != entry["name"]:  # (a name repeated in every delta is kept once)
            entry["name"] += name
        arguments = function.arguments
        if arguments is not None and not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        entry["arguments"] += arguments or ""

    def tool_calls(self) -> list[ToolCall]:
        return [ToolCall(id=c["id"], name=c["name"], arguments=parse_arguments(c["arguments"])) for c in self._calls]
