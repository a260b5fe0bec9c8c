"""The README's first example, complete: a durable checkout tool, a scripted model, one
session on the embedded SQLite log (``quickstart.db`` in the current folder).

    python examples/quickstart.py
    harness show s-1 --log sqlite:///quickstart.db     # the session's timeline

Run it twice: the second run reads the same result from the log (``in-1`` is settled
already: nothing runs again, nothing is charged again).
"""

from __future__ import annotations

import asyncio
import itertools

from pydantic import BaseModel

from harness import HarnessHost, define_harness, durable_tool, open_log, tool_definition
from harness.models import ModelResponse, ScriptedModel, ToolCall


class Billing:
    """Stands for your payment provider: it remembers idempotency keys, as Stripe does."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.charges: dict[str, dict[str, str]] = {}

    def charge(self, order_id: str, *, idempotency_key: str) -> dict[str, str]:
        if idempotency_key not in self.charges:  # a repeated key returns the first charge
            self.charges[idempotency_key] = {"id": f"ch_{next(self._ids)}", "order_id": order_id}
        return self.charges[idempotency_key]

    def send_invoice(self, charge_id: str) -> dict[str, str]:
        return {"id": f"inv_{charge_id}"}


billing = Billing()


class CheckoutArgs(BaseModel):
    order_id: str


async def checkout_impl(args: CheckoutArgs, ctx) -> dict:  # type: ignore[no-untyped-def]
    payment = await ctx.step.do(
        f"charge:{args.order_id}",
        lambda info: billing.charge(args.order_id, idempotency_key=info.idempotency_key),
    )
    await ctx.step.do(f"invoice:{payment['id']}", lambda: billing.send_invoice(payment["id"]))
    ctx.append([{"type": "order.paid", "order_id": args.order_id}])  # lands with the result
    return {"charge_id": payment["id"]}


checkout = durable_tool(
    tool_definition(name="checkout", description="Charge an order and send the invoice",
                    input_schema=CheckoutArgs),
    checkout_impl,  # replay="safe" by default; replay="never" as keyword
)

model = ScriptedModel([  # a real model adapter goes here (see "Model adapters" in the README)
    ModelResponse(text="Checking out.", tool_calls=[ToolCall(id="call-1", name="checkout",
                                                            arguments={"order_id": "42"})]),
    ModelResponse(text="Order 42 is paid and invoiced."),
])
assistant = define_harness(name="acme/assistant", model=model, tools=[checkout])


async def main() -> None:
    async with HarnessHost(log=open_log("sqlite:///quickstart.db")) as host:
        session = await host.open(assistant, session_id="s-1", secrets={"stripe": "sk_test_123"})
        result = await session.send("please check out order 42", input_id="in-1")
        print(f"{result.outcome}: {result.text}")
        print("app records:", await session.records(type="order.paid"))


if __name__ == "__main__":
    asyncio.run(main())
