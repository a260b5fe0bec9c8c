"""The harness the Kafka benchmarks run in worker processes (``--app bench.apps:bench``).

Each session's user message says what to do, e.g. ``steps=20`` (one ``work`` call
running 20 no-op durable steps), ``steps=100000 pause_ms=10`` (a long turn, for
failover) or ``ask=yes`` (an ``approve`` call parked on ``step.ask``). The scripted
model calls the tools once per turn (per user message), then answers ``done``.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.definition import Harness
from harness.models import ModelResponse, ScriptedModel, ToolCall

NAME = "bench/app"


class WorkArgs(BaseModel):
    steps: int
    pause_ms: float = 0.0


class Approval(BaseModel):
    approved: bool


class ApproveArgs(BaseModel):
    what: str


async def work_impl(args: WorkArgs, ctx: Any) -> dict[str, Any]:
    pause = args.pause_ms / 1000

    async def step() -> int:
        if pause:
            await asyncio.sleep(pause)
        return 1

    for i in range(args.steps):
        await ctx.step.do(f"s{i}", step)
    return {"steps": args.steps}


async def approve_impl(args: ApproveArgs, ctx: Any) -> dict[str, Any]:
    answer = await ctx.step.ask("approval", message=f"Approve {args.what}?", schema=Approval)
    return {"approved": answer.approved}


WORK = durable_tool(tool_definition(name="work", description="k no-op steps", input_schema=WorkArgs), work_impl)
APPROVE = durable_tool(
    tool_definition(name="approve", description="ask a person", input_schema=ApproveArgs), approve_impl
)


def script(messages: list[dict[str, Any]]) -> ModelResponse:
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    if any(m.get("role") == "assistant" for m in messages[last_user:]):
        return ModelResponse(text="done")  # this turn's tools ran: answer
    user = messages[last_user]["content"]
    calls = []
    steps = re.search(r"steps=(\d+)", user)
    if steps:
        pause = re.search(r"pause_ms=([\d.]+)", user)
        arguments: dict[str, Any] = {"steps": int(steps.group(1))}
        if pause:
            arguments["pause_ms"] = float(pause.group(1))
        calls.append(ToolCall(id="work", name="work", arguments=arguments))
    if "ask=yes" in user:
        calls.append(ToolCall(id="approve", name="approve", arguments={"what": user}))
    return ModelResponse(text="working on it", tool_calls=calls)


bench: Harness = define_harness(name=NAME, model=ScriptedModel(script), tools=[WORK, APPROVE])
