"""An app for ``harness worker``: checkout (durable steps), refunds that a person approves
(``step.ask``) and reminders (``step.sleep``). The model is scripted, so it runs without
an API key; swap in a real adapter for real use.

    cd examples
    harness worker --log sqlite:///agents.db --app agents:assistant
    harness send s-1 'check out order 42' --harness acme/assistant --log sqlite:///agents.db
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.models import ModelResponse, ScriptedModel, ToolCall


class Order(BaseModel):
    order_id: str


class Reminder(BaseModel):
    seconds: float
    text: str


class Approval(BaseModel):
    approved: bool
    note: str = ""


async def checkout(args: Order, ctx: Any) -> dict[str, Any]:
    charge = await ctx.step.do(f"charge:{args.order_id}", lambda info: {"id": f"ch_{args.order_id}"})
    await ctx.step.do(f"invoice:{charge['id']}", lambda: {"id": f"inv_{args.order_id}"})
    ctx.append([{"type": "order.paid", "order_id": args.order_id}])
    return {"charge_id": charge["id"]}


async def refund(args: Order, ctx: Any) -> dict[str, Any]:
    answer = await ctx.step.ask("approval", message=f"Refund order {args.order_id}?", schema=Approval)
    if not answer.approved:
        return {"refunded": False, "note": answer.note}
    done = await ctx.step.do(f"refund:{args.order_id}", lambda: {"id": f"re_{args.order_id}"})
    return {"refunded": True, "refund_id": done["id"]}


async def remind(args: Reminder, ctx: Any) -> dict[str, Any]:
    await ctx.step.sleep("wait", timedelta(seconds=args.seconds))
    return {"reminded": args.text}


def script(messages: list[dict[str, Any]]) -> ModelResponse:
    if messages[-1]["role"] == "tool":
        return ModelResponse(text=f"Done: {messages[-1]['content']}")
    text = messages[-1]["content"]
    if m := re.search(r"check out order (\w+)", text):
        return ModelResponse(text="Checking out.", tool_calls=[
            ToolCall(id=f"checkout-{m.group(1)}", name="checkout", arguments={"order_id": m.group(1)})])
    if m := re.search(r"refund order (\w+)", text):
        return ModelResponse(text="Asking for approval.", tool_calls=[
            ToolCall(id=f"refund-{m.group(1)}", name="refund", arguments={"order_id": m.group(1)})])
    if m := re.search(r"remind me in (\d+) s", text):
        return ModelResponse(text="I will.", tool_calls=[
            ToolCall(id="remind", name="remind", arguments={"seconds": float(m.group(1)), "text": text})])
    return ModelResponse(text="I can check out, refund and remind.")


def _tool(name: str, description: str, args: type[BaseModel], fn: Any) -> Any:
    return durable_tool(tool_definition(name=name, description=description, input_schema=args), fn)


assistant = define_harness(
    name="acme/assistant",
    model=ScriptedModel(script),
    tools=[
        _tool("checkout", "Charge an order and send the invoice", Order, checkout),
        _tool("refund", "Refund an order once a person approves", Order, refund),
        _tool("remind", "Remind the user later", Reminder, remind),
    ],
)
