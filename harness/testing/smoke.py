"""A built-in app for smoke tests of a deployment: ``--app harness.testing.smoke:harness``.

Needs no model API and no app code, so the container image and the Helm chart can
be checked anywhere: each user message makes the scripted model call one durable
tool, ``echo``, which does one ``step.do``; then the model answers
``smoke ok: <the message>``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from harness.definition import Harness, define_harness
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.tools import durable_tool, tool_definition

__all__ = ["HARNESS_NAME", "harness"]

HARNESS_NAME = "harness/smoke"


class EchoArgs(BaseModel):
    text: str


async def _echo(args: EchoArgs, ctx: Any) -> dict[str, Any]:
    value = await ctx.step.do("echo", lambda: {"echo": args.text})
    return dict(value)


def _script(messages: list[dict[str, Any]]) -> ModelResponse:
    """Per turn: call ``echo`` with the user's text, then answer with the tool's result."""
    last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    text = str(messages[last_user].get("content", ""))
    if not any(m.get("role") == "assistant" for m in messages[last_user:]):
        return ModelResponse(tool_calls=[ToolCall(id=f"echo-{last_user}", name="echo", arguments={"text": text})])
    return ModelResponse(text=f"smoke ok: {text}")


harness: Harness = define_harness(
    name=HARNESS_NAME,
    model=ScriptedModel(_script),
    tools=[durable_tool(tool_definition(name="echo", description="echo the text", input_schema=EchoArgs), _echo)],
)
