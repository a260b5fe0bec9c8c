"""Tool definitions: plain tools and durable tools.

Misuse is caught here, when a tool is defined, not in the middle of a run.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, PydanticUserError
from pydantic.errors import PydanticInvalidForJsonSchema

from harness.errors import DefinitionError
from harness.models.base import ToolSpec
from harness.replay.planner import ToolPolicy

__all__ = ["Replay", "Tool", "ToolDefinition", "durable_tool", "tool", "tool_definition"]

Replay = Literal["safe", "never"]
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """What the model sees of a tool, and the policy a plain tool runs with."""

    name: str
    description: str
    input_schema: type[BaseModel]
    replay: Replay | None = None

    def spec(self) -> ToolSpec:
        """The tool as the model sees it (its JSON schema is built once per input model)."""
        return ToolSpec(self.name, self.description, _json_schema(self.input_schema))


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool ready to run: its definition, its function and its replay policy."""

    definition: ToolDefinition
    execute: Callable[..., Any]
    replay: Replay
    durable: bool
    agent: bool = False
    takes_ctx: bool = True

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def is_async(self) -> bool:
        """An ``async def`` (a ``functools.partial`` of one too), or an object whose
        ``__call__`` is one: it runs on the loop, its steps awaited."""
        fn = self.execute
        return inspect.iscoroutinefunction(fn) or (
            not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)
        )

    @property
    def policy(self) -> ToolPolicy:
        return ToolPolicy(replay=self.replay, agent=self.agent)


@functools.lru_cache(maxsize=1024)
def _json_schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def _check_replay(replay: object) -> Replay:
    if replay not in ("safe", "never"):
        raise DefinitionError(f"replay must be 'safe' or 'never', not {replay!r}")
    return replay


def tool_definition(
    *,
    name: str,
    description: str,
    input_schema: type[BaseModel],
    replay: Replay | None = None,
) -> ToolDefinition:
    """Define a tool the model can call; ``input_schema`` validates its arguments."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise DefinitionError(f"tool name {name!r} must match {_NAME.pattern}")
    if description is not None and not isinstance(description, str):
        raise DefinitionError(f"description of tool {name!r} must be a string (the model reads it), "
                              f"not {type(description).__name__}")
    if not isinstance(input_schema, type) or not issubclass(input_schema, BaseModel):
        given = (f"an instance of it: input_schema={type(input_schema).__name__}" if isinstance(input_schema, BaseModel)
                 else type(input_schema).__name__)
        raise DefinitionError(f"input_schema of tool {name!r} must be a pydantic BaseModel class, not {given}")
    if replay is not None:
        _check_replay(replay)
    problem = json_schema_problem(input_schema)
    if problem is not None:  # (the model is sent it with every request: found here, not at the first turn)
        raise DefinitionError(f"input_schema of tool {name!r} has no JSON schema: {problem}")
    return ToolDefinition(name=name, description=description or "", input_schema=input_schema, replay=replay)


def json_schema_problem(model: type[BaseModel]) -> str | None:
    """Why pydantic cannot make ``model``'s JSON schema (its first line, and the fix), or None."""
    try:
        _json_schema(model)
    except PydanticInvalidForJsonSchema as exc:  # (a field of an arbitrary class, a Callable ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"{first}; give its fields JSON types (str, int, lists, nested models ...)"
    except PydanticUserError:  # not fully defined yet: its forward references resolve later (model_rebuild())
        return None
    return None


def _arity(fn: Callable[..., Any], tool_name: str, *, allowed: tuple[int, ...]) -> int:
    if not callable(fn):
        raise DefinitionError(f"execute of tool {tool_name!r} is not callable")
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
    except (TypeError, ValueError):
        return allowed[-1]
    if len(params) not in allowed:
        raise DefinitionError(
            f"execute of tool {tool_name!r} must take {' or '.join(map(str, allowed))} "
            f"positional arguments (args, ctx), not {len(params)}"
        )
    return len(params)


def tool(definition: ToolDefinition, execute: Callable[..., Any]) -> Tool:
    """A plain tool: ``execute(args)`` or ``execute(args, ctx)``, sync or async.

    A cut call of a plain tool is not run again unless its definition says
    ``replay="safe"`` (SPEC 5.3).
    """
    if not isinstance(definition, ToolDefinition):
        raise DefinitionError("tool() takes a ToolDefinition made by tool_definition()")
    arity = _arity(execute, definition.name, allowed=(1, 2))
    return Tool(
        definition=definition,
        execute=execute,
        replay=definition.replay or "never",
        durable=False,
        takes_ctx=arity == 2,
    )


def durable_tool(
    definition: ToolDefinition, execute: Callable[..., Any], *, replay: Replay = "safe"
) -> Tool:
    """A durable tool: ``execute(args, ctx)`` does its side effects in ``ctx.step``.

    ``replay`` decides what happens to a call cut by a crash: ``"safe"`` (the
    default) runs it again with its finished steps served from the log;
    ``"never"`` gives the model a tool error instead. The ``replay`` of the
    definition is not read for a durable tool (SPEC 5.5).
    """
    if not isinstance(definition, ToolDefinition):
        raise DefinitionError("durable_tool() takes a ToolDefinition made by tool_definition()")
    _arity(execute, definition.name, allowed=(2,))
    return Tool(definition=definition, execute=execute, replay=_check_replay(replay), durable=True)
