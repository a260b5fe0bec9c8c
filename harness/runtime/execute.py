"""Running one tool call: argument validation, hooks, the tool, its outcome.

Shared by durable sessions and plain ``chat()``, so a tool behaves the same in
both; only the ``step`` it gets differs. Nothing here writes to a log.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from harness.context import ToolContext
from harness.definition import Hooks, ToolCallEvent, ToolOutcome
from harness.errors import LogError, RecordTooLarge, StepValueError
from harness.jsonvalues import json_copy, storable_text
from harness.secrets import SecretScrubber
from harness.step import DurableStep, PlainStep, RunSync, SyncStep, on_thread
from harness.tools import Tool

__all__ = ["CallRun", "apply_after_hook", "error_outcome", "run_tool_call"]

log = logging.getLogger("harness.tool")


def _log_failure(event: ToolCallEvent, exc: BaseException, scrubber: SecretScrubber) -> None:
    """A tool raised: the developer sees it (WARNING, with the traceback), the session's
    secrets replaced; the model gets the error as the call's result."""
    where = f" of session {event.session_id}" if event.session_id else ""
    trace = "".join(traceback.format_exception(exc)).rstrip()
    log.warning(
        "%s", scrubber.redact_text(f"tool {event.name} (call {event.tool_call_id}{where}) failed: "
                                   f"{type(exc).__name__}: {exc}\n{trace}")
    )


@dataclass(slots=True)
class CallRun:
    outcome: ToolOutcome
    replaced_by_hook: bool = False
    records: list[dict[str, Any]] = field(default_factory=list)


def error_outcome(code: str, message: str, **extra: Any) -> ToolOutcome:
    return ToolOutcome(content={"error": code, "message": message, **extra}, is_error=True, code=code)


_LEAKED_CANCEL = (
    "raised CancelledError though nobody cancelled it (a task it cancelled and then awaited, "
    "or a library's cancel scope): catch it there, or await such tasks with "
    "asyncio.gather(..., return_exceptions=True)"
)


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _as_outcome(value: Any) -> ToolOutcome:
    if isinstance(value, ToolOutcome):
        return ToolOutcome(json_copy(value.content, what="hook result"), value.is_error, value.code)
    return ToolOutcome(json_copy(value, what="hook result"))


def _result_value(value: Any) -> Any:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return json_copy(value, what="tool result")


def _invalid_arguments(name: str, exc: ValidationError) -> ToolOutcome:
    fields = [
        {"field": ".".join(str(p) for p in err["loc"]) or "(arguments)", "message": err["msg"]}
        for err in exc.errors()
    ]
    names = ", ".join(f["field"] for f in fields)
    return error_outcome(
        "invalid_arguments", f"invalid arguments for tool {name!r}: {names}", fields=fields
    )


def _not_an_object(name: str, raw: str) -> ToolOutcome:
    """Arguments the model sent as text that is no JSON object (broken JSON, a bare string):
    the model is told so, not that its arguments should be "a valid dictionary"."""
    try:
        json.loads(raw)
        why = "they are JSON, but not an object"
    except ValueError as exc:
        why = f"they are not valid JSON ({exc})"
    message = f"the arguments of tool {name!r} must be one JSON object; {why}"
    return error_outcome("invalid_arguments", message, fields=[{"field": "(arguments)", "message": why}])


async def apply_after_hook(
    hooks: Hooks, event: ToolCallEvent, outcome: ToolOutcome
) -> tuple[ToolOutcome, bool]:
    """Run ``on_after_tool_call``; a non-None return replaces the outcome (SPEC 5.6)."""
    if hooks.on_after_tool_call is None:
        return outcome, False
    try:
        replacement = await _maybe_await(hooks.on_after_tool_call(event, outcome))
        if replacement is None:
            return outcome, False
        return _as_outcome(replacement), True
    except Exception as exc:  # noqa: BLE001 - a hook's failure becomes the call's error, never the session's
        return error_outcome("hook_failed", storable_text(f"{type(exc).__name__}: {exc}")), False
    except asyncio.CancelledError:
        if not _cancel_leaked():
            raise
        return error_outcome("hook_failed", f"on_after_tool_call {_LEAKED_CANCEL}"), False


def _cancel_leaked() -> bool:
    """A CancelledError caught now came out of user code (a hook's, a tool's), not from a
    cancel of this call (a cancel input, the deadline, a close): taken for the call's own
    cancellation, it would leave the turn where it is for good."""
    task = asyncio.current_task()
    return task is not None and not task.cancelling()


async def run_tool_call(
    *,
    tools: Mapping[str, Tool],
    hooks: Hooks,
    event: ToolCallEvent,
    make_step: Callable[[], DurableStep | PlainStep],
    secrets: Mapping[str, str],
    scrubber: SecretScrubber,
    log_id: str | None,
    durable: bool,
    run_sync: RunSync | None = None,
) -> CallRun:
    """Run one call to its outcome. Only BaseExceptions (cancellation) escape.

    A sync tool runs on ``run_sync`` (the host's bounded thread pool; the loop's
    default executor when None), never on the event loop.
    """
    run = await _run(tools, hooks, event, make_step, secrets, scrubber, log_id, durable, run_sync)
    run.outcome, replaced = await apply_after_hook(hooks, event, run.outcome)
    run.replaced_by_hook = run.replaced_by_hook or replaced
    return run


async def _run(
    tools: Mapping[str, Tool],
    hooks: Hooks,
    event: ToolCallEvent,
    make_step: Callable[[], DurableStep | PlainStep],
    secrets: Mapping[str, str],
    scrubber: SecretScrubber,
    log_id: str | None,
    durable: bool,
    run_sync: RunSync | None,
) -> CallRun:
    tool = tools.get(event.name)
    if tool is None:
        return CallRun(
            error_outcome(
                "unknown_tool",
                f"there is no tool named {event.name!r}; the tools are: {', '.join(sorted(tools)) or 'none'}",
            )
        )
    if isinstance(event.arguments, str) and event.arguments.strip():
        return CallRun(_not_an_object(event.name, event.arguments))
    try:
        args = tool.definition.input_schema.model_validate(event.arguments or {})
    except ValidationError as exc:
        return CallRun(_invalid_arguments(event.name, exc))

    if hooks.on_before_tool_call is not None:
        try:
            early = await _maybe_await(hooks.on_before_tool_call(event))
            if early is not None:
                return CallRun(_as_outcome(early), replaced_by_hook=True)
        except Exception as exc:  # noqa: BLE001 - a hook's failure becomes the call's error
            return CallRun(error_outcome("hook_failed", storable_text(f"{type(exc).__name__}: {exc}")))
        except asyncio.CancelledError:
            if not _cancel_leaked():
                raise
            return CallRun(error_outcome("hook_failed", f"on_before_tool_call {_LEAKED_CANCEL}"))

    step = make_step()
    ctx = ToolContext(
        step=step,
        tool_call_id=event.tool_call_id,
        session_id=event.session_id,
        log_id=log_id,
        secrets=secrets,
        scrubber=scrubber,
        durable=durable,
    )
    try:
        try:
            if tool.is_async:
                value = await (tool.execute(args, ctx) if tool.takes_ctx else tool.execute(args))
            else:
                ctx.step = SyncStep(step, asyncio.get_running_loop())
                fn = tool.execute
                run = functools.partial(fn, args, ctx) if tool.takes_ctx else functools.partial(fn, args)
                call = functools.partial(on_thread, run)
                if run_sync is not None:
                    value = await run_sync(call)
                else:
                    value = await asyncio.get_running_loop().run_in_executor(None, call)
                if inspect.isawaitable(value):
                    # A def that hands back a coroutine (``lambda args, ctx: impl(args, ctx)``):
                    # it runs here, on the loop, where a blocking ctx.step would wait for the
                    # loop itself, for good: it gets the awaitable steps.
                    ctx.step = step
                    value = await value
        except LogError:
            raise  # (below: the session's failure, whatever the tool left)
        except asyncio.CancelledError as exc:
            if not _cancel_leaked():
                raise  # this call is being cancelled (a cancel input, the deadline, a close)
            # The tool's own code raised it (a task it cancelled, then awaited): its error,
            # not the call's cancellation, which would leave the turn where it is for good.
            _log_failure(event, exc, scrubber)
            return CallRun(
                error_outcome("tool_failed", f"the tool {_LEAKED_CANCEL}", type="CancelledError"), records=ctx.staged_records
            )
        except Exception as exc:
            # A step the tool never awaited explains the failure (e.g. "'coroutine' object is
            # not subscriptable" on its value): it is the call's error, the tool's as its cause.
            step.check_awaited(exc)
            raise
        step.check_awaited()  # a step.* the tool called and never awaited did not run
        content = _result_value(value)
    except RecordTooLarge as exc:  # a step's value (or an ask) the log refused: nothing of it was written
        _log_failure(event, exc, scrubber)
        what = "a record of this call (a step's value, an ask)"
        return CallRun(
            error_outcome("tool_failed", exc.explained(what), type=type(exc).__name__),
            records=ctx.staged_records,
        )
    except LogError:
        raise  # the session log failed (or fenced this owner): not the tool's failure
    except StepValueError as exc:
        _log_failure(event, exc, scrubber)
        # The staged records go along: the session drops them unless a hook replaces the outcome.
        return CallRun(error_outcome("tool_failed", str(exc), type=type(exc).__name__), records=ctx.staged_records)
    except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's business
        _log_failure(event, exc, scrubber)
        return CallRun(
            error_outcome("tool_failed", storable_text(f"{exc}"), type=type(exc).__name__), records=ctx.staged_records
        )
    finally:
        if isinstance(ctx.step, SyncStep):
            ctx.step.close()
        step.close()
        ctx.close()
    return CallRun(ToolOutcome(content), records=ctx.staged_records)
