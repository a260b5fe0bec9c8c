"""The app the worker tests run: checkout, a replay="never" notify, a nap (step.sleep)
and an approval (step.ask). Each session's user message says what to do, e.g.
``order=7 nap=2 ask=yes``; the fake payment provider's file comes from the
environment (HARNESS_TEST_PROVIDER), since this module is loaded by a worker process."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.definition import Harness
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.testing.payments import FakePaymentProvider


class CheckoutArgs(BaseModel):
    order_id: str


class NotifyArgs(BaseModel):
    message: str


class NapArgs(BaseModel):
    seconds: float


class Approval(BaseModel):
    approved: bool


class ApproveArgs(BaseModel):
    what: str


def _provider() -> FakePaymentProvider:
    return FakePaymentProvider(os.environ["HARNESS_TEST_PROVIDER"])


async def checkout_impl(args: CheckoutArgs, ctx: Any) -> dict[str, Any]:
    provider = _provider()
    payment = await ctx.step.do(
        f"charge:{args.order_id}",
        lambda info: provider.charge(args.order_id, 1000, idempotency_key=info.idempotency_key),
    )
    invoice = await ctx.step.do(
        f"invoice:{payment['id']}",
        lambda info: provider.send_invoice(payment["id"], idempotency_key=info.idempotency_key),
    )
    ctx.append([{"type": "order.paid", "order_id": args.order_id, "session_id": ctx.session_id}])
    return {"charge_id": payment["id"], "invoice_id": invoice["id"]}


async def notify_impl(args: NotifyArgs, ctx: Any) -> dict[str, Any]:
    provider = _provider()
    sent = await ctx.step.do("send", lambda info: provider.notify(args.message, idempotency_key=info.idempotency_key))
    return {"message_id": sent["id"]}


async def nap_impl(args: NapArgs, ctx: Any) -> dict[str, Any]:
    await ctx.step.sleep("nap", timedelta(seconds=args.seconds))
    return {"slept": args.seconds}


async def approve_impl(args: ApproveArgs, ctx: Any) -> dict[str, Any]:
    answer = await ctx.step.ask("approval", message=f"Approve {args.what}?", schema=Approval)
    return {"approved": answer.approved}


TOOLS = [
    durable_tool(tool_definition(name="checkout", description="charge and invoice", input_schema=CheckoutArgs), checkout_impl),
    durable_tool(tool_definition(name="notify", description="notify", input_schema=NotifyArgs), notify_impl, replay="never"),
    durable_tool(tool_definition(name="nap", description="sleep", input_schema=NapArgs), nap_impl),
    durable_tool(tool_definition(name="approve", description="ask a person", input_schema=ApproveArgs), approve_impl),
]


def script(messages: list[dict[str, Any]]) -> ModelResponse:
    user = next(m["content"] for m in messages if m["role"] == "user")
    k = sum(1 for m in messages if m.get("role") == "assistant")
    if k > 0:
        return ModelResponse(text="all done")
    order = re.search(r"order=(\S+)", user)
    nap = re.search(r"nap=(\S+)", user)
    calls = []
    if order:
        calls.append(ToolCall(id="checkout", name="checkout", arguments={"order_id": order.group(1)}))
        calls.append(ToolCall(id="notify", name="notify", arguments={"message": f"order {order.group(1)}"}))
    if nap:
        calls.append(ToolCall(id="nap", name="nap", arguments={"seconds": float(nap.group(1))}))
    if "ask=yes" in user:
        calls.append(ToolCall(id="approve", name="approve", arguments={"what": user}))
    return ModelResponse(text="working on it", tool_calls=calls)


fleet: Harness = define_harness(name="tests/fleet", model=ScriptedModel(script), tools=TOOLS)
