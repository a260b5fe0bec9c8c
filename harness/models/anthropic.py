"""``AnthropicMessages``: the Anthropic Messages API with tool use, on the official ``anthropic`` SDK.

Extra ``[anthropic]``; the SDK is imported when the adapter is made.

Mapping (the harness' chat-completions-shaped messages -> the request body):

* system messages -> the top-level ``system`` string (several are joined by a blank line);
* user text -> ``{"type": "text"}`` blocks; an assistant message -> its ``thinking``
  blocks (as they came, first), its text block (if any), then one ``{"type": "tool_use",
  "id", "name", "input"}`` block per tool call;
* tool results -> ``{"type": "tool_result", "tool_use_id", "content", "is_error": true}``
  blocks (``is_error`` only on errors) in the user message that follows the assistant's;
* consecutive messages of one role are merged into one message (the API alternates
  user and assistant), tool results first;
* tools -> ``{"name", "description", "input_schema": <the pydantic model's JSON schema>}``;
* ``max_tokens`` defaults to 4096; every other ``**options`` entry (temperature, top_p,
  top_k, stop_sequences, tool_choice, metadata, thinking, extra_headers, extra_body,
  timeout ...) goes to ``messages.create`` as it is.

The answer: text, every ``tool_use`` block, ``stop_reason`` normalised (``end_turn`` and
``stop_sequence`` -> ``stop``, ``tool_use`` -> ``tool_calls``, ``max_tokens`` and
``model_context_window_exceeded`` -> ``length``, ``refusal`` -> ``content_filter``), usage
(input tokens, cache reads and writes included; output tokens; the model) and cost from
``pricing=``.

Extended thinking (``thinking={"type": "enabled", "budget_tokens": N}``): the answer's
``{"type": "thinking", "thinking", "signature"}`` and ``{"type": "redacted_thinking",
"data"}`` blocks are kept in ``ModelResponse.thinking`` (streamed: put together from
``thinking_delta`` and ``signature_delta`` events; thinking text never reaches the stream
sink), logged with the response, and sent back first in that assistant message, as the
API requires for a tool-use turn's next call. The log replaces session secrets in them as
in the text: a thinking block that held one no longer matches its signature, and the
API refuses that turn's next call (400).

The SDK's own retries are off (``max_retries=0``): the harness retries, durably.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from harness.errors import ModelError, StreamCallbackError
from harness.models._provider import ProviderModel, Utf16Joiner, parse_arguments, tokens, utf16_text
from harness.models.base import ModelResponse, StreamSink, ToolCall, ToolSpec, Usage, guarded_sink

__all__ = ["AnthropicMessages", "to_anthropic_messages", "to_anthropic_tools"]

DEFAULT_MAX_TOKENS = 4096

_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
           "model_context_window_exceeded": "length", "refusal": "content_filter"}


def to_anthropic_messages(messages: Sequence[Mapping[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """The harness' messages as (``system``, ``messages``) of a Messages API request."""
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            merged = out[-1]["content"] + blocks
            # In a user message, tool results come before any text.
            merged.sort(key=lambda b: 0 if b["type"] == "tool_result" else 1)
            out[-1]["content"] = merged
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        role = m.get("role")
        content = m.get("content") or ""
        if role == "system":
            if content:
                system.append(content)
        elif role == "user":
            add("user", [{"type": "text", "text": content}] if content else [])
        elif role == "assistant":
            # Thinking blocks go back first and unchanged (their signature covers them).
            blocks: list[dict[str, Any]] = [dict(b) for b in m.get("thinking") or ()]
            if content:
                blocks.append({"type": "text", "text": content})
            for c in m.get("tool_calls") or []:
                arguments = c.get("arguments")
                # The API takes only an object: arguments the model sent as broken text go as {}.
                blocks.append(
                    {"type": "tool_use", "id": c["id"], "name": c["name"], "input": arguments if isinstance(arguments, dict) else {}}
                )
            add("assistant", blocks)
        elif role == "tool":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": content}
            if m.get("is_error"):
                block["is_error"] = True
            add("user", [block])
        else:
            raise ModelError(f"anthropic: a message with role {role!r} cannot be sent", transient=False, kind="bad_request")
    return ("\n\n".join(system) if system else None), out


def to_anthropic_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]


class AnthropicMessages(ProviderModel):
    """A model served by the Anthropic Messages API.

    Args:
        model: the model name (``claude-sonnet-4-5`` ...).
        base_url: another API root (a proxy, a gateway); default Anthropic's.
        api_key: the key; or ``api_key_secret``: the name of the session secret holding it;
            neither: the SDK reads ``ANTHROPIC_API_KEY``.
        pricing: US dollars per million tokens, for ``Usage.cost``.
        streaming: stream answers (text deltas reach live subscribers); default True.
        client_options: more ``AsyncAnthropic`` settings (``default_headers``, ``timeout`` ...).
        **options: passed to ``messages.create`` as they are (``max_tokens`` defaults to 4096).
    """

    provider: ClassVar[str] = "anthropic"
    extra: ClassVar[str] = "anthropic"
    sdk_module: ClassVar[str] = "anthropic"
    reserved_options: ClassVar[frozenset[str]] = frozenset({"model", "messages", "tools", "system", "stream"})
    key_variable: ClassVar[str] = "ANTHROPIC_API_KEY"

    def _make_client(self, api_key: str | None) -> Any:
        return self.sdk.AsyncAnthropic(api_key=api_key, base_url=self.base_url, max_retries=0, **self._client_options)

    def _has_credentials(self, client: Any) -> bool:
        # The client is made without any (its requests fail); a bearer token
        # (ANTHROPIC_AUTH_TOKEN) or an Authorization header in default_headers also do.
        headers = {k.lower() for k in (self._client_options.get("default_headers") or {})}
        return bool(client.api_key or client.auth_token or {"authorization", "x-api-key"} & headers)

    def request_body(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` (without ``stream``)."""
        system, converted = to_anthropic_messages(messages)
        body: dict[str, Any] = {"model": self.model, "max_tokens": DEFAULT_MAX_TOKENS, "messages": converted}
        if system is not None:
            body["system"] = system
        if tools:
            body["tools"] = to_anthropic_tools(tools)
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
        body = self.split_options(client.messages.create, self.request_body(messages, tools))
        try:
            if not self.streaming:
                return self._parse(await client.messages.create(**body))
            events = await client.messages.create(**body, stream=True)
            try:
                return await self._read_stream(events, stream)
            finally:
                await events.close()
        except StreamCallbackError as exc:  # the app's callback failed, not the provider
            error = exc
        except Exception as exc:  # noqa: BLE001 - classified: transient (retried) or permanent
            error = self.model_error(exc, key)
        # Raised here, not in the except: the SDK's exception (which may quote the key) is
        # then not kept as its __context__ for whoever walks the chain.
        raise error

    def _usage(self, usage: Any, model: str | None, output_tokens: int | None = None) -> Usage | None:
        if usage is None:
            return None
        tokens_in = sum(
            tokens(getattr(usage, name, 0))
            for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )
        tokens_out = output_tokens if output_tokens is not None else tokens(getattr(usage, "output_tokens", 0))
        return Usage(tokens_in, tokens_out, model, self.cost(tokens_in, tokens_out, None))

    def _parse(self, message: Any) -> ModelResponse:
        if not hasattr(message, "content"):  # a body that is no JSON object (an HTML page ...)
            raise self.not_the_api(message, "Messages API")
        texts: list[str] = []
        calls: list[ToolCall] = []
        thinking: list[dict[str, str]] = []
        for block in message.content or ():
            if block.type == "text":
                texts.append(utf16_text(block.text))
            elif block.type == "thinking":
                thinking.append({"type": "thinking", "thinking": block.thinking or "", "signature": block.signature or ""})
            elif block.type == "redacted_thinking":
                thinking.append({"type": "redacted_thinking", "data": block.data or ""})
            elif block.type == "tool_use":
                calls.append(ToolCall(id=block.id, name=block.name, arguments=block.input if isinstance(block.input, dict) else {}))
        reason = message.stop_reason
        return ModelResponse(
            text="".join(texts) if texts else None,
            tool_calls=calls,
            finish_reason=_FINISH.get(reason, reason) if reason is not None else None,
            usage=self._usage(message.usage, message.model),
            thinking=tuple(thinking),
        )

    async def _read_stream(self, events: Any, sink: StreamSink | None) -> ModelResponse:
        texts: list[str] = []
        blocks: dict[int, dict[str, Any]] = {}
        thinking: dict[int, dict[str, str]] = {}  # index -> a thinking block being put together
        start_usage: Any = None
        model: str | None = None
        reason: str | None = None
        output_tokens: int | None = None
        joiner = Utf16Joiner()  # (an emoji's surrogates may come in two events)
        stopped = False
        async for event in events:
            kind = event.type
            if kind == "message_start":
                start_usage, model = event.message.usage, event.message.model
            elif kind == "content_block_start":
                block = event.content_block
                if block.type == "tool_use":
                    blocks[event.index] = {"id": block.id, "name": block.name, "json": ""}
                elif block.type == "thinking":
                    thinking[event.index] = {"type": "thinking", "thinking": block.thinking or "",
                                             "signature": getattr(block, "signature", None) or ""}
                elif block.type == "redacted_thinking":  # comes whole, with no deltas
                    thinking[event.index] = {"type": "redacted_thinking", "data": block.data or ""}
            elif kind == "content_block_delta":
                delta = event.delta
                if delta.type == "text_delta":
                    piece = joiner.feed(delta.text)
                    texts.append(piece)
                    if sink is not None and piece:
                        sink(piece)
                elif delta.type == "input_json_delta" and event.index in blocks:
                    blocks[event.index]["json"] += delta.partial_json
                elif delta.type == "thinking_delta" and event.index in thinking:
                    thinking[event.index]["thinking"] += delta.thinking
                elif delta.type == "signature_delta" and event.index in thinking:
                    thinking[event.index]["signature"] = delta.signature  # whole, in one delta (as the SDK takes it)
            elif kind == "message_delta":
                reason = event.delta.stop_reason or reason
                if event.usage is not None and event.usage.output_tokens is not None:
                    output_tokens = tokens(event.usage.output_tokens)
            elif kind == "message_stop":
                stopped = True
        if rest := joiner.end():
            texts.append(rest)
            if sink is not None:
                sink(rest)
        if not stopped:
            raise ModelError("anthropic: the stream ended before the answer was complete", transient=True, kind="stream_cut")
        return ModelResponse(
            text="".join(texts) if texts else None,
            tool_calls=[
                ToolCall(id=b["id"], name=b["name"], arguments=parse_arguments(b["json"]))
                for _, b in sorted(blocks.items())
            ],
            finish_reason=_FINISH.get(reason, reason) if reason is not None else None,
            usage=self._usage(start_usage, model, output_tokens),
            thinking=tuple(b for _, b in sorted(thinking.items())),
        )
