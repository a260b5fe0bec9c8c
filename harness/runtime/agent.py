"""``agent_tool``: a tool that runs another harness, durably, inside its own call.

The sub-agent's whole run lives in the parent tool call's steps (names start with
``agent:``), so it needs no session, no partition and no owner of its own:

* each model call of the sub-agent is a step (``agent:model:<k>``): after a crash the
  logged responses come back and the model is not asked again; a transient model error
  is retried inside the step with the sub-agent's ``Durability`` backoff (not logged);
* each of its tool calls runs with a step namespace of its own
  (``agent:<call id>:<step name>``) and ends in a result step
  (``agent:<call id>:result``); a call that started on an earlier run and has no
  result is run again if its tool is ``replay="safe"``, else it gets the cut error;
* its asks are asks of the parent call, so the parent is "waiting for a person"
  while the sub-agent is, and after a crash keeps its place (SPEC 5.4); at any other
  cut the parent call gets the cut error like a ``replay="never"`` tool;
* records its tools append land with the parent tool's result;
* its requests follow its own harness's ``history`` policy (``trim_history``), from the
  messages alone, which the logged steps rebuild: a sub-agent resumed in another process
  sends the same requests. Its run is one turn, which the policy sends whole unless
  ``History(trim_current_turn=True)`` (then its oldest tool rounds go first); a request
  refused as too long says how to shorten a sub-agent's run (``ContextTooLong.SUB_AGENT_FIX``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel

from harness.context import ToolContext
from harness.definition import Harness, ToolCallEvent
from harness.errors import ContextTooLong, DefinitionError, HarnessError, RequestTooLarge
from harness.ids import id_problem, model_call_id
from harness.jsonvalues import dumps, json_copy
from harness.models.base import ModelResponse, call_complete, thinking_copy
from harness.replay import trim_history
from harness.runtime.arguments import SECRET_ARGUMENTS_CODE, refusal
from harness.runtime.execute import error_outcome, run_tool_call
from harness.runtime.model_call import ModelRetrier
from harness.secrets import SecretScrubber
from harness.step import DurableStep, HandedSteps, PlainStep, SleepDuration
from harness.tools import Tool, ToolDefinition

__all__ = ["agent_tool"]

M = TypeVar("M", bound=BaseModel)


class _PrefixedStep:
    """The parent call's ``step`` with every name under a prefix (one child call's namespace)."""

    def __init__(self, inner: Any, prefix: str, tool_call_id: str = "") -> None:
        self._inner = inner
        self._prefix = prefix
        self._handed = HandedSteps(None, tool_call_id)  # the child call's own (a child tool may forget an await)

    @property
    def clock(self) -> Any:
        return self._inner.clock

    def do(self, name: str, fn: Callable[..., Any]) -> Coroutine[Any, Any, Any]:
        return self._handed.keep(self._do(name, fn))

    async def _do(self, name: str, fn: Callable[..., Any]) -> Any:
        return await self._inner._do(self._prefix + name, fn)

    def begin(self, name: str) -> tuple[Any, Any]:
        begun: tuple[Any, Any] = self._inner.begin(self._prefix + name)
        return begun

    async def finish(self, name: str, raw: Any, *, extra: Any = None) -> Any:
        return await self._inner.finish(self._prefix + name, raw, extra=extra)

    async def _model_call(self, name: str, index: int, fn: Callable[..., Any]) -> Any:
        return await self._inner._model_call(self._prefix + name, index, fn)

    def sleep(
        self, name: str, duration: SleepDuration | None = None, *, until: datetime | None = None
    ) -> Coroutine[Any, Any, None]:
        return self._handed.keep(self._sleep(name, duration, until=until))

    async def _sleep(self, name: str, duration: SleepDuration | None = None, *, until: datetime | None = None) -> None:
        await self._inner._sleep(self._prefix + name, duration, until=until)

    def ask(
        self, name: str, *, message: str, schema: type[M], expires_at: datetime | None = None
    ) -> Coroutine[Any, Any, M]:
        return self._handed.keep(self._ask(name, message=message, schema=schema, expires_at=expires_at))

    async def _ask(self, name: str, *, message: str, schema: type[M], expires_at: datetime | None = None) -> M:
        result: M = await self._inner._ask(self._prefix + name, message=message, schema=schema, expires_at=expires_at)
        return result

    def check_awaited(self, cause: BaseException | None = None) -> None:
        """Raise ``StepNotAwaited`` if the child tool left a ``step.*`` call never awaited."""
        self._handed.check(cause)

    def close(self) -> None:
        """The parent's step stays open: the parent call is still running."""
        self._handed.close()


def _response_json(response: ModelResponse, scrubber: SecretScrubber, k: int) -> dict[str, Any]:
    """The sub-agent's ``k``-th model response as a step value, ids and secrets handled as
    at the top level: its text redacted, a call whose arguments hold a secret marked refused
    (it never runs), a call id holding one refused with ``SecretInName`` (the model call
    fails), an id that is no usable id, or repeated in the response, renamed
    (``harness.ids.model_call_id``; the child calls' step names hold ``k``, so ids of
    other responses may repeat)."""
    if not isinstance(response, ModelResponse):
        raise TypeError(f"the sub-agent's model returned {type(response).__name__}, not ModelResponse")
    calls: list[dict[str, Any]] = []
    taken: set[str] = set()
    for pos, c in enumerate(response.tool_calls):
        if id_problem(c.id, "tool call id") is None:  # the model's id is kept
            scrubber.check_name("tool call id", c.id)
        call_id = model_call_id(c.id, f"{k}.{pos}", taken)
        taken.add(call_id)
        if isinstance(c.arguments, str):  # not a JSON object: the child call gets invalid_arguments
            arguments: Any = scrubber.redact_text(c.arguments)
            refused = None
        else:
            arguments = json_copy(dict(c.arguments), what="tool arguments")
            refused = refusal(scrubber, arguments)
        call: dict[str, Any] = {"id": call_id, "name": c.name, "arguments": arguments}
        if refused is not None:
            call["arguments"] = scrubber.redact(arguments)
            call["refused"] = refused
        calls.append(call)
    text = scrubber.redact_text(response.text) if response.text is not None else None
    out: dict[str, Any] = {"text": text, "tool_calls": calls}
    thinking = thinking_copy(response.thinking)
    if thinking:  # sent back to the model with this response, secrets replaced as in its text
        out["thinking"] = scrubber.redact(list(thinking))
    if response.truncated:  # cut at the output limit: its calls never run (as at the top level)
        out["finish_reason"] = response.finish_reason
    usage = response.usage
    if usage is not None:  # becomes a harness.model.usage record of the tool call (DurableStep._model_call)
        out["usage"] = {
            "model": str(usage.model) if usage.model is not None else None,
            "input_tokens": max(0, int(usage.input_tokens)),
            "output_tokens": max(0, int(usage.output_tokens)),
            "cost": float(usage.cost) if usage.cost is not None else None,
        }
    return out


def agent_tool(
    definition: ToolDefinition,
    harness: Harness,
    *,
    prompt: Callable[[Any], str] | None = None,
    max_model_calls: int | None = None,
) -> Tool:
    """A tool whose call runs ``harness`` on a prompt made from the call's arguments.

    Args:
        definition: what the parent model sees (its input schema validates arguments).
        harness: the sub-agent: its model, tools, system prompt and hooks.
        prompt: arguments -> the sub-agent's user message (default: the arguments as JSON).
        max_model_calls: the sub-agent's model calls per call (default: its durability's).

    Returns:
        a tool whose result is ``{"text": <the sub-agent's final answer>}``.
    """
    if not isinstance(definition, ToolDefinition):
        raise DefinitionError("agent_tool() takes a ToolDefinition made by tool_definition()")
    if not isinstance(harness, Harness):
        raise DefinitionError("agent_tool() takes a Harness made by define_harness()")
    if prompt is not None and not callable(prompt):
        raise DefinitionError(
            f"agent_tool() takes prompt= as a function arguments -> the sub-agent's message, not {type(prompt).__name__}"
        )
    if max_model_calls is not None and (
        isinstance(max_model_calls, bool) or not isinstance(max_model_calls, int) or max_model_calls < 1
    ):
        raise DefinitionError(
            f"agent_tool(): max_model_calls must be a whole number of at least 1, or None (the harness's "
            f"durability.max_model_calls), not {max_model_calls!r}"
        )
    limit = max_model_calls or harness.durability.max_model_calls
    specs = [t.definition.spec() for t in harness.tools.values()]

    async def execute(args: Any, ctx: ToolContext) -> dict[str, Any]:
        text = prompt(args) if prompt is not None else json.dumps(args.model_dump(mode="json"))
        messages: list[dict[str, Any]] = []
        if harness.system_prompt:
            messages.append({"role": "system", "content": harness.system_prompt})
        messages.append({"role": "user", "content": text})
        scrubber = SecretScrubber(ctx.secrets)
        # A transient model error is retried inside the step (the count is not logged: a
        # crash during a backoff starts the step's retries again).
        retrier = ModelRetrier(harness.durability, getattr(ctx.step, "clock", None), scrubber)
        policy = harness.history
        for k in range(limit):
            snapshot = [dict(m) for m in messages]
            if policy is not None:  # (from the messages alone: a resumed sub-agent sends the same)
                snapshot = trim_history(
                    snapshot,
                    max_messages=policy.max_messages,
                    max_chars=policy.max_chars,
                    trim_current_turn=policy.trim_current_turn,
                )

            async def call_model(snapshot: list[dict[str, Any]] = snapshot, k: int = k) -> dict[str, Any]:
                try:
                    response = await retrier.call(
                        lambda: call_complete(
                            harness.model, snapshot, specs, keywords=harness.model_keywords, secrets=ctx.secrets
                        )
                    )
                except ContextTooLong as exc:  # the session's advice (a history policy) does not fit a sub-agent
                    raise _sub_agent_overflow(exc, harness.name, k) from None
                return _response_json(response, scrubber, k)

            response = await _model_step(ctx)._model_call(f"agent:model:{k}", k, call_model)
            calls = response["tool_calls"]
            assistant: dict[str, Any] = {"role": "assistant", "content": response["text"] or ""}
            if response.get("thinking"):
                assistant["thinking"] = response["thinking"]
            if calls:
                assistant["tool_calls"] = [{"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in calls]
            messages.append(assistant)
            if not calls:
                return {"text": response["text"]}
            if response.get("finish_reason") == "length":
                cut = error_outcome("truncated", harness.durability.truncated_call_error)
                outcomes = [{"content": cut.content, "is_error": True} for _ in calls]
            else:
                outcomes = await asyncio.gather(*(_run_child(ctx, harness, call, k, scrubber) for call in calls))
            for call, outcome in zip(calls, outcomes, strict=True):
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call["id"],
                        "name": call["name"],
                        "content": dumps(outcome["content"]),
                        "is_error": outcome["is_error"],
                    }
                )
        raise HarnessError(f"the sub-agent {harness.name!r} made {limit} model calls without a final answer")

    return Tool(definition=definition, execute=execute, replay="never", durable=True, agent=True)


def _sub_agent_overflow(exc: ContextTooLong, name: str, k: int) -> ContextTooLong:
    """A sub-agent's request refused as too long, with the fix that fits a sub-agent."""
    cls = RequestTooLarge if isinstance(exc, RequestTooLarge) else ContextTooLong
    return cls(
        f"the sub-agent {name!r}, at its model call {k + 1} (after {k} tool round{'' if k == 1 else 's'}): "
        f"{exc.provider_message}",
        status=exc.status,
        fix=cls.SUB_AGENT_FIX,
    )


def _model_step(ctx: ToolContext) -> DurableStep | PlainStep | _PrefixedStep:
    """The step an agent tool's model calls go through (an agent tool is async: its step
    is never a sync tool's ``SyncStep``)."""
    step: Any = ctx.step
    if not isinstance(step, DurableStep | PlainStep | _PrefixedStep):
        raise HarnessError(f"an agent tool runs with a durable or plain step, not {type(step).__name__}")
    return step


async def _run_child(
    ctx: ToolContext, harness: Harness, call: dict[str, Any], k: int, scrubber: SecretScrubber
) -> dict[str, Any]:
    """One tool call of the sub-agent; its outcome is a step of the parent call."""
    cid = f"{k}.{call['id']}"
    prefix = f"agent:{cid}:"
    started_now: list[int] = []

    def mark(info: Any) -> int:
        started_now.append(info.attempt)
        return int(info.attempt)

    if call.get("refused") is not None:  # its arguments hold a secret: it never runs
        return {"content": call["refused"], "is_error": True, "code": SECRET_ARGUMENTS_CODE, "records": []}

    async def run() -> dict[str, Any]:
        await ctx.step.do(prefix + "started", mark)
        tool = harness.tools.get(call["name"])
        if not started_now and (tool is None or tool.replay != "safe"):
            # It started on an earlier run and did not finish: nobody knows what it did.
            cut = error_outcome("cut", harness.durability.cut_call_error)
            return {"content": cut.content, "is_error": True, "code": "cut", "records": []}
        outcome = await run_tool_call(
            tools=harness.tools,
            hooks=harness.hooks,
            event=ToolCallEvent(ctx.session_id, cid, call["name"], call["arguments"], 1),
            make_step=lambda: _PrefixedStep(ctx.step, prefix, cid),  # type: ignore[arg-type, return-value]
            secrets=ctx.secrets,
            scrubber=scrubber,
            log_id=ctx.log_id,
            durable=ctx._durable,
        )
        keep = not outcome.outcome.is_error or outcome.replaced_by_hook
        return {
            "content": scrubber.redact(outcome.outcome.content),
            "is_error": outcome.outcome.is_error,
            "code": outcome.outcome.code,
            "records": outcome.records if keep else [],
        }

    result: dict[str, Any] = await ctx.step.do(prefix + "result", run)
    if result.get("records") and ctx._durable:
        # Staged on every run (the step keeps them): they land once, with the parent's result.
        ctx.append(result["records"])
    return result
