"""An app whose one step holds the GIL for a few seconds (a C call that never releases
it, as a huge integer power or a runaway regex does): every thread of its worker stops,
the lease watchdog too. Each run of the step's fn adds a line to $HARNESS_TEST_GIL_RUNS."""

from __future__ import annotations

import ctypes
import os
from typing import Any

from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.definition import Harness
from harness.models import ModelResponse, ScriptedModel, ToolCall


class HoldArgs(BaseModel):
    seconds: int


def _hold(seconds: int) -> int:
    with open(os.environ["HARNESS_TEST_GIL_RUNS"], "a") as f:
        f.write(f"{os.getpid()}\n")
    ctypes.PyDLL(None).sleep(seconds)  # libc sleep through PyDLL: the GIL is held throughout
    return seconds


async def hold_impl(args: HoldArgs, ctx: Any) -> dict[str, Any]:
    held = await ctx.step.do("hold", lambda: _hold(args.seconds))
    return {"held": held}


HOLD = durable_tool(
    tool_definition(name="hold", description="holds the GIL", input_schema=HoldArgs), hold_impl
)


def script(messages: list[dict[str, Any]]) -> ModelResponse:
    if messages[-1]["role"] == "tool":
        return ModelResponse(text="held")
    seconds = int(messages[-1]["content"])
    return ModelResponse(text="holding", tool_calls=[ToolCall(id="hold", name="hold", arguments={"seconds": seconds})])


gil_hold: Harness = define_harness(name="tests/gil-hold", model=ScriptedModel(script), tools=[HOLD])
