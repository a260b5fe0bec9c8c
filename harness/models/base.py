"""The model adapter contract and the shapes a model returns.

A model is any object with ``async complete(messages, tools) -> ModelResponse``.
It may also take, as keyword-only parameters, any of:

* ``stream``: a :data:`StreamSink` or None; the model calls it with each piece of the
  answer's text as it arrives (it must not block). Durable sessions always pass a
  sink (deltas go to live subscribers, never to the log); plain ``chat()`` passes
  None unless given one.
* ``secrets``: the session's secrets (name -> value), e.g. to take an API key from them.

Which of these a model takes is read once from its ``complete`` signature when the
harness is defined (:func:`model_keywords`); a model without them keeps working.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from harness.errors import ModelError, StreamCallbackError

__all__ = [
    "FINISH_REASONS",
    "Model",
    "ModelResponse",
    "Pricing",
    "StreamSink",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "THINKING_FIELDS",
    "call_complete",
    "guarded_sink",
    "model_keywords",
    "thinking_copy",
]

StreamSink = Callable[[str], None]
"""Takes one text delta of a streamed answer. Called on the event loop; must not block.
A plain function (``def``): an ``async def`` one is refused (``StreamCallbackError``)."""


def guarded_sink(sink: StreamSink | None, scrub: Callable[[str], str] | None = None) -> StreamSink | None:
    """``sink``, raising :class:`~harness.errors.StreamCallbackError` for whatever it raises.

    So a model tells the app's failing callback from its provider's failures (which it
    classifies, and may retry). ``scrub`` removes credentials from the message; a sink
    guarded twice (``chat()`` around an adapter's) keeps one error, scrubbed by both.
    """
    if sink is None:
        return None
    clean = scrub or (lambda text: text)

    def guarded(text: str) -> None:
        error: StreamCallbackError | None = None
        try:
            returned = sink(text)
            if inspect.isawaitable(returned):  # an async def: its deltas would be lost, unawaited
                if inspect.iscoroutine(returned):
                    returned.close()
                raise TypeError("it returned an awaitable; stream= must be a plain function (def, not async "
                                "def) that returns at once: put the delta on an asyncio.Queue for async work")
        except StreamCallbackError as exc:
            error = StreamCallbackError(exc.error_type, clean(exc.detail))
        except Exception as exc:  # noqa: BLE001 - the app's bug, named as such
            error = StreamCallbackError(type(exc).__name__, clean(str(exc)))
        if error is not None:
            # Raised here, not in the except: the callback's exception (whose text may quote
            # a key) is not kept as its __context__.
            raise error

    return guarded

FINISH_REASONS = ("stop", "tool_calls", "length", "content_filter")
"""Normalised finish reasons (a provider's other reasons pass through as they are).
``length`` means the answer was cut at the output limit: its tool calls never run."""

OPTIONAL_KEYWORDS = ("stream", "secrets")

THINKING_FIELDS = ("type", "thinking", "signature", "data")
"""The fields a thinking block may have (all strings; ``type`` always there). The log's
schema holds exactly these (``harness.model.response``, ``thinking``)."""


def thinking_copy(blocks: object) -> tuple[dict[str, str], ...]:
    """``ModelResponse.thinking`` as plain dicts, checked.

    Raises:
        TypeError: not a sequence of mappings with a string ``type`` and only string
            :data:`THINKING_FIELDS`.
    """
    if isinstance(blocks, (str, bytes, Mapping)) or not isinstance(blocks, Sequence):
        raise TypeError(f"ModelResponse.thinking must be a sequence of blocks (dicts), not {type(blocks).__name__}")
    out = []
    for i, block in enumerate(blocks):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise TypeError(f"ModelResponse.thinking[{i}] must be a dict with a string 'type'; got {block!r:.80}")
        extra = sorted(str(k) for k in block if k not in THINKING_FIELDS)
        if extra:
            raise TypeError(f"ModelResponse.thinking[{i}] has fields the log cannot hold: {', '.join(extra)} "
                            f"(a block has only {', '.join(THINKING_FIELDS)})")
        bad = sorted(k for k, v in block.items() if not isinstance(v, str))
        if bad:
            raise TypeError(f"ModelResponse.thinking[{i}]: {', '.join(bad)} must be strings")
        out.append(dict(block))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the model asks for.

    ``arguments`` is the JSON object the model produced. When a provider sent
    arguments that are not a JSON object (a weak model, or an answer cut at the
    output limit), adapters keep the raw text as a ``str``: the tool is then not
    run and the model gets an ``invalid_arguments`` tool error.
    """

    id: str
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Usage:
    """What one model call cost: tokens, the model that answered, and money when known."""

    input_tokens: int = 0
    output_tokens: int = 0
    model: str | None = None
    cost: float | None = None
    """In US dollars; None when unknown (no ``pricing`` given, none reported by the provider)."""


@dataclass(frozen=True, slots=True)
class Pricing:
    """Prices of a model in US dollars per million tokens (to compute ``Usage.cost``)."""

    input_per_million: float
    output_per_million: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_million + output_tokens * self.output_per_million) / 1_000_000


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """What a model answers: text, tool calls, or both; why it stopped; what it cost.

    ``finish_reason`` is normalised (:data:`FINISH_REASONS`); ``"length"`` (the
    provider stopped at its output limit) marks the response truncated: its tool
    calls are logged but never run (each gets a tool error), and the model is
    called again. ``usage`` is None when the model does not report it.

    ``thinking``: the provider's reasoning blocks that must go back to it unchanged with
    this assistant message (Anthropic extended thinking: ``{"type": "thinking",
    "thinking", "signature"}`` and ``{"type": "redacted_thinking", "data"}``), in the
    order they came. They are logged with the response and sent back as the assistant
    message's ``thinking``; adapters without such blocks leave it empty and ignore it.
    """

    text: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    finish_reason: str | None = None
    usage: Usage | None = None
    thinking: Sequence[Mapping[str, str]] = ()

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it."""

    name: str
    description: str
    parameters: dict[str, Any]


@runtime_checkable
class Model(Protocol):
    """A chat model. ``messages`` are chat-completions shaped dicts (system first)."""

    async def complete(
        self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]
    ) -> ModelResponse: ...


def model_keywords(model: object) -> frozenset[str]:
    """The optional keywords (``stream``, ``secrets``) that ``model.complete`` names.

    Only named parameters count: a ``**kwargs`` catch-all is not taken as a promise.
    """
    complete = getattr(model, "complete", None)
    if complete is None:
        return frozenset()
    try:
        params = inspect.signature(complete).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no introspection
        return frozenset()
    return frozenset(
        name
        for name in OPTIONAL_KEYWORDS
        if name in params
        and params[name].kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )


async def call_complete(
    model: Any,
    messages: list[dict[str, Any]],
    tools: Sequence[ToolSpec],
    *,
    keywords: frozenset[str],
    stream: StreamSink | None = None,
    secrets: Mapping[str, str] | None = None,
) -> ModelResponse:
    """Call ``model.complete`` with the optional keywords it takes (``keywords``).

    Raises:
        TypeError: the model returned something other than a ``ModelResponse``.
    """
    extra: dict[str, Any] = {}
    if "stream" in keywords:
        extra["stream"] = stream
    if "secrets" in keywords:
        extra["secrets"] = dict(secrets or {})
    pending = model.complete(messages, tools, **extra)
    if not inspect.isawaitable(pending):
        raise TypeError(
            f"the model's complete() returned {type(pending).__name__} without being awaitable: make it "
            "'async def complete' (blocking client code inside it: await asyncio.to_thread(...))"
        )
    try:
        response = await pending
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # the call is being cancelled (a cancel input, the deadline, a close)
        # The model's own code let it out: taken for the call's cancellation, it left the
        # turn where it was for good; it is the model call's failure.
        raise ModelError(
            "the model's complete() raised CancelledError though nobody cancelled the call (a task of its "
            "own, cancelled and then awaited): catch it in the adapter, or raise ModelError(transient=True) "
            "to have the call retried", transient=False, kind="cancelled",
        ) from None
    if not isinstance(response, ModelResponse):
        raise TypeError(f"the model returned {type(response).__name__}, not ModelResponse")
    return response
