"""The app the gateway tests run: a message with 'approve' calls a tool that asks a
person (step.ask with a schema), then answers with what the person said ('approve
quickly': the ask expires after 3 s, and the tool says nobody answered); 'nap' sleeps;
anything else gets a plain text answer. Every answer reports its usage (50 input and 5
output tokens of ``scripted``, no cost)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field

from harness import define_harness, durable_tool, tool_definition
from harness.definition import Harness
from harness.errors import AskExpired
from harness.models import ModelResponse, ScriptedModel, ToolCall, Usage


class Approval(BaseModel):
    approved: bool
    note: str = Field("", description="why")


class ApproveArgs(BaseModel):
    what: str
    within: float | None = None  # seconds the person has to answer (None: no limit)


class NapArgs(BaseModel):
    seconds: float


async def approve_impl(args: ApproveArgs, ctx: Any) -> dict[str, Any]:
    expires = None
    if args.within is not None:
        opened = await ctx.step.do("opened-at", lambda: datetime.now(UTC).isoformat())  # the same after a crash
        expires = datetime.fromisoformat(opened) + timedelta(seconds=args.within)
    try:
        answer = await ctx.step.ask("approval", message=f"Approve {args.what}?", schema=Approval, expires_at=expires)
    except AskExpired:
        return {"approved": False, "note": "nobody answered in time"}
    return {"approved": answer.approved, "note": answer.note}


async def nap_impl(args: NapArgs, ctx: Any) -> dict[str, Any]:
    await ctx.step.sleep("nap", timedelta(seconds=args.seconds))
    return {"slept": args.seconds}


TOOLS = [
    durable_tool(tool_definition(name="approve", description="ask a person", input_schema=ApproveArgs), approve_impl),
    durable_tool(tool_definition(name="nap", description="sleep", input_schema=NapArgs), nap_impl),
]


USAGE = Usage(input_tokens=50, output_tokens=5, model="scripted")


def script(messages: list[dict[str, Any]]) -> ModelResponse:
    response = _answer(messages)
    return ModelResponse(text=response.text, tool_calls=response.tool_calls, usage=USAGE)


def _answer(messages: list[dict[str, Any]]) -> ModelResponse:
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    user = messages[last_user]["content"]
    tail = messages[last_user + 1 :]
    results = [m for m in tail if m["role"] == "tool"]
    if results:
        return ModelResponse(text=f"done: {results[-1]['content']}")
    n = sum(1 for m in messages if m["role"] == "user")
    if "approve" in user:
        arguments: dict[str, Any] = {"what": user}
        if "quickly" in user:  # 'approve quickly': the person has 3 s
            arguments["within"] = 3.0
        return ModelResponse(text="asking", tool_calls=[ToolCall(id=f"approve-{n}", name="approve", arguments=arguments)])
    if "nap" in user:
        return ModelResponse(text="napping", tool_calls=[ToolCall(id=f"nap-{n}", name="nap", arguments={"seconds": 600})])
    return ModelResponse(text=f"echo: {user}")


approvals: Harness = define_harness(name="tests/approvals", model=ScriptedModel(script), tools=TOOLS)
