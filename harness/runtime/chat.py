"""Plain mode: ``chat()`` runs the model loop with tools and no session log (SPEC 6)."""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import SecretStr

from harness.clock import Clock
from harness.definition import (
    Durability,
    History,
    Hooks,
    ToolCallEvent,
    check_durability,
    check_history,
    check_hooks,
    check_model,
    check_system_prompt,
    tools_by_name,
)
from harness.errors import DefinitionError, HarnessError
from harness.ids import model_call_id
from harness.jsonvalues import dumps, json_copy
from harness.models.base import Model, StreamSink, call_complete, guarded_sink, model_keywords, thinking_copy
from harness.replay import trim_history
from harness.runtime.execute import error_outcome, run_tool_call
from harness.runtime.model_call import ModelRetrier
from harness.secrets import SecretScrubber, given_secrets
from harness.step import PlainStep
from harness.tools import Tool

__all__ = ["chat"]


def _copied_messages(messages: object) -> list[dict[str, Any]]:
    """A deep copy of ``messages`` as dicts (the caller's list is never changed).

    Raises:
        DefinitionError: not a list of dicts with a string ``role``.
    """
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Iterable):
        raise DefinitionError(
            f"chat() takes messages= as a list of message dicts, not {type(messages).__name__}: "
            "e.g. messages=[{'role': 'user', 'content': 'hi'}]"
        )
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise DefinitionError(f"chat(): message {i} must be a dict, not {type(message).__name__}")
        if not isinstance(message.get("role"), str):
            raise DefinitionError(
                f"chat(): message {i} needs a string 'role': 'system', 'user', 'assistant' or 'tool'"
            )
        out.append(dict(copy.deepcopy(message)))
    return out


def _check_options(max_model_calls: object, clock: object, stream: object) -> None:
    """Refuse the options of ``chat()`` that would fail only later, inside its loop.

    Raises:
        DefinitionError: ``max_model_calls`` not a whole number of at least 1, ``clock``
            not a ``Clock``, ``stream`` not a function or an ``async def`` one.
    """
    if isinstance(max_model_calls, bool) or not isinstance(max_model_calls, int) or max_model_calls < 1:
        raise DefinitionError(
            f"chat(): max_model_calls must be a whole number of at least 1, not {max_model_calls!r}"
        )
    if clock is not None and not isinstance(clock, Clock):
        raise DefinitionError(
            f"chat() takes clock= as a Clock (now() and async sleep_until()), e.g. FakeClock(), "
            f"not {type(clock).__name__}"
        )
    if stream is not None and not callable(stream):
        raise DefinitionError(
            f"chat() takes stream= as a function called with each text delta, not {type(stream).__name__}"
        )
    if stream is not None and (inspect.iscoroutinefunction(stream)
                               or inspect.iscoroutinefunction(type(stream).__call__)):
        raise DefinitionError(
            "chat() takes stream= as a plain function (def, not async def): it is called with each text delta "
            "and must return at once; for async work, put the delta on an asyncio.Queue and await it elsewhere"
        )


async def chat(
    *,
    model: Model,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    hooks: Hooks | Mapping[str, Any] | None = None,
    secrets: Mapping[str, str | SecretStr] | None = None,
    max_model_calls: int | None = None,
    clock: Clock | None = None,
    stream: StreamSink | None = None,
    durability: Durability | Mapping[str, Any] | None = None,
    history: History | Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Call the model, run the tools it asks for, repeat until it answers in text.

    Returns the whole conversation (the given messages plus the new ones).
    Tools run as in a durable session, but ``step.do`` runs ``fn`` every time,
    ``step.sleep`` waits its full time, ``step.ask`` and ``ctx.append`` raise
    ``NotDurableError``. ``clock`` times the sleeps (a ``FakeClock`` in tests).
    ``stream`` gets the text deltas of models that stream. A response cut at the
    model's output limit (``finish_reason="length"``) runs none of its tool calls:
    each gets a ``truncated`` tool error. A transient model error (429, 5xx, a timeout, a
    connection reset: see ``ModelError``) is retried as in a durable session, with
    ``durability``'s ``model_retries``, ``model_backoff`` and ``model_backoff_max``
    (``Durability()`` by default; ``Retry-After`` honoured); nothing records the count, so
    it starts again with each ``chat()``. A permanent error, or the last transient one,
    is raised (``ContextTooLong`` when the provider refuses the request as longer than
    the model's context window; its subclass ``RequestTooLarge`` when the request's body
    is over the provider's size limit). A ``stream`` callback that raises stops the call
    with ``StreamCallbackError`` (its exception's type and message), never retried.

    ``hooks``, ``durability`` and ``history`` are a ``Hooks`` / ``Durability`` /
    ``History`` or a dict of their fields, as for ``define_harness``. ``history`` bounds
    what each model request carries (the leading system messages and the current turn,
    from the last user message on, always; older turns newest first while they fit); the
    returned conversation is always whole. ``max_model_calls`` bounds the model calls of this
    ``chat()``; by default ``durability.max_model_calls`` (50).

    Raises:
        DefinitionError: a model without an async ``complete()``, ``tools`` that is not a
            list of tools, ``messages`` that is not a list of message dicts, ``secrets``
            that is not a mapping of names to str or SecretStr values, a ``system_prompt``
            that is not a string, ``hooks``, ``durability`` or ``history`` that is neither,
            ``max_model_calls`` that is not a whole number of at least 1, a ``clock`` that
            is not a ``Clock`` or a ``stream`` that is not a plain function (``async def`` too).
    """
    check_model(model, "chat()")
    by_name = tools_by_name(tools, "chat()")
    plain_secrets = given_secrets(secrets, "chat()")
    system_prompt = check_system_prompt(system_prompt, "chat()")
    hooks = check_hooks(hooks, "chat()")
    durability = check_durability(durability, "chat()")
    policy = check_history(history, "chat()")
    if max_model_calls is None:  # (durability's, 50 unless it says otherwise)
        max_model_calls = durability.max_model_calls
    _check_options(max_model_calls, clock, stream)
    out = _copied_messages(messages)
    if system_prompt and not (out and out[0].get("role") == "system"):
        out.insert(0, {"role": "system", "content": system_prompt})
    specs = [t.definition.spec() for t in by_name.values()]
    scrubber = SecretScrubber(plain_secrets)
    keywords = model_keywords(model)
    chat_id = uuid.uuid4().hex  # a part of every idempotency key of this call (SPEC 2.4)
    retrying = ModelRetrier(durability, clock, scrubber)
    # A callback that raises is the app's bug: StreamCallbackError, never retried (whatever
    # model calls it), its message without the session's secrets.
    sink = guarded_sink(stream, scrubber.redact_text)
    seen: set[str] = set()  # the call ids of this chat(): the ids in its steps' idempotency keys
    for _ in range(max_model_calls):
        sent = out if policy is None else trim_history(  # (the model's request; ``out`` stays whole)
            out, max_messages=policy.max_messages, max_chars=policy.max_chars,
            trim_current_turn=policy.trim_current_turn,
        )
        response = await retrying.call(
            functools.partial(call_complete, model, sent, specs, keywords=keywords, stream=sink, secrets=plain_secrets)
        )
        calls = []
        for c in response.tool_calls:  # ids as in a session: unusable or repeated ones renamed
            call_id = model_call_id(c.id, uuid.uuid4().hex[:12], seen)
            seen.add(call_id)
            calls.append({"id": call_id, "name": c.name, "arguments": json_copy(c.arguments)})
        assistant: dict[str, Any] = {"role": "assistant", "content": response.text or ""}
        thinking = thinking_copy(response.thinking)
        if thinking:
            assistant["thinking"] = list(thinking)
        if calls:
            assistant["tool_calls"] = calls
        out.append(assistant)
        if not calls:
            return out
        if response.truncated:
            for call in calls:
                cut = error_outcome("truncated", durability.truncated_call_error)
                out.append(
                    {"role": "tool", "tool_call_id": call["id"], "name": call["name"],
                     "content": dumps(cut.content), "is_error": True}
                )
            continue
        runs = await asyncio.gather(
            *(
                run_tool_call(
                    tools=by_name,
                    hooks=hooks,
                    event=ToolCallEvent(None, c["id"], c["name"], c["arguments"], 1),
                    make_step=functools.partial(PlainStep, c["id"], clock=clock, chat_id=chat_id),
                    secrets=plain_secrets,
                    scrubber=scrubber,
                    log_id=None,
                    durable=False,
                )
                for c in calls
            )
        )
        for call, run in zip(calls, runs, strict=True):
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "name": call["name"],
                    "content": dumps(scrubber.redact(run.outcome.content)),
                    "is_error": run.outcome.is_error,
                }
            )
    raise HarnessError(f"chat() stopped after {max_model_calls} model calls without a final answer")
