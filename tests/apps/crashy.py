"""An app whose only tool SIGKILLs the worker process that runs it, every time.

A session of it can never finish: each owner dies in the tool, the next one takes
the turn over (``harness.turn.resumed``) and runs the tool again (``replay="safe"``),
until ``durability.max_attempts`` is used up and the turn fails ``attempts_exhausted``.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.definition import Harness
from harness.models import ModelResponse, ScriptedModel, ToolCall

MAX_ATTEMPTS = 2


class BoomArgs(BaseModel):
    reason: str


async def boom_impl(args: BoomArgs, ctx: Any) -> dict[str, Any]:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: the process is gone")


BOOM = durable_tool(
    tool_definition(name="boom", description="kills the process that runs it", input_schema=BoomArgs),
    boom_impl,
    replay="safe",
)


def script(messages: list[dict[str, Any]]) -> ModelResponse:
    if any(m.get("role") == "assistant" for m in messages):
        return ModelResponse(text="survived?")
    return ModelResponse(text="here goes", tool_calls=[ToolCall(id="boom", name="boom", arguments={"reason": "test"})])


crashy: Harness = define_harness(
    name="tests/crashy",
    model=ScriptedModel(script),
    tools=[BOOM],
    durability={"max_attempts": MAX_ATTEMPTS},
)
