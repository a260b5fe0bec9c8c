"""The checkout story: the demo, and the app the crash tests kill.

One user message makes the model call two tools at once:

* ``checkout`` (durable, replay="safe"): step ``charge:<order>``, step
  ``invoice:<charge id>``, and an ``order.paid`` app record;
* ``notify`` (durable, replay="never"): one step that sends a message.

Run as a process (``python -m harness.testing.checkout run|recover ...``) it
can kill itself with SIGKILL at a named boundary (``--crash-at``):

* ``charge:fn-returned``  the charge went through, its step not yet committed;
* ``charge:committed``    the charge step committed, the invoice not started;
* ``checkout:steps-done`` both steps committed, the tool result not yet;
* ``notify:steps-done``   notify's step committed, its result not yet;
* ``model:second-call``   while the model is called after the tools.

The crash is injected from outside the library: a log wrapper that dies around
an append, and a model that dies when called.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from harness import HarnessHost, define_harness, durable_tool, open_log, tool_definition
from harness.definition import Harness
from harness.log.base import LeaseInfo, SessionLog, SessionWriter
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import LogEntry, Record, StepResult, ToolResult
from harness.testing.payments import FakePaymentProvider

__all__ = ["CRASH_POINTS", "CrashingLog", "build_harness", "main"]

CRASH_POINTS = (
    "charge:fn-returned",
    "charge:committed",
    "checkout:steps-done",
    "notify:steps-done",
    "model:second-call",
)
ORDER_ID = "42"


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class CheckoutArgs(BaseModel):
    order_id: str
    amount_cents: int = 4200


class NotifyArgs(BaseModel):
    message: str


def build_harness(provider: FakePaymentProvider, *, crash_at: str | None = None, name: str = "demo/checkout") -> Harness:
    async def checkout_impl(args: CheckoutArgs, ctx: Any) -> dict[str, Any]:
        def charge(info: Any) -> dict[str, Any]:
            return provider.charge(args.order_id, args.amount_cents, idempotency_key=info.idempotency_key)

        payment = await ctx.step.do(f"charge:{args.order_id}", charge)
        invoice = await ctx.step.do(
            f"invoice:{payment['id']}",
            lambda info: provider.send_invoice(payment["id"], idempotency_key=info.idempotency_key),
        )
        ctx.append([{"type": "order.paid", "order_id": args.order_id, "charge_id": payment["id"]}])
        return {"charge_id": payment["id"], "invoice_id": invoice["id"]}

    async def notify_impl(args: NotifyArgs, ctx: Any) -> dict[str, Any]:
        sent = await ctx.step.do(
            "send", lambda info: provider.notify(args.message, idempotency_key=info.idempotency_key)
        )
        return {"message_id": sent["id"]}

    checkout = durable_tool(
        tool_definition(name="checkout", description="Charge an order and send the invoice", input_schema=CheckoutArgs),
        checkout_impl,
    )
    notify = durable_tool(
        tool_definition(name="notify", description="Tell the customer", input_schema=NotifyArgs),
        notify_impl,
        replay="never",
    )
    script = [
        ModelResponse(
            text="Checking out your order.",
            tool_calls=[
                ToolCall(id="call-checkout", name="checkout", arguments={"order_id": ORDER_ID}),
                ToolCall(id="call-notify", name="notify", arguments={"message": f"Order {ORDER_ID} is on its way"}),
            ],
        ),
        ModelResponse(text=f"Order {ORDER_ID} is paid and invoiced."),
    ]

    def model_fn(messages: list[dict[str, Any]]) -> ModelResponse:
        k = sum(1 for m in messages if m.get("role") == "assistant")
        if crash_at == "model:second-call" and k == 1:
            _die()
        return script[k]

    return define_harness(
        name=name,
        model=ScriptedModel(model_fn),
        tools=[checkout, notify],
        system_prompt="You check out orders.",
    )


class CrashingLog:
    """Wraps a session log; dies (SIGKILL) around the append that matches ``crash_at``."""

    def __init__(self, inner: SessionLog, crash_at: str | None) -> None:
        self._inner = inner
        self._crash_at = crash_at

    @property
    def namespace(self) -> str:
        return self._inner.namespace

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def read(self, session_id: str, *, after: int | None = None) -> list[LogEntry]:
        return await self._inner.read(session_id, after=after)

    async def submit(self, record: Record) -> LogEntry:
        return await self._inner.submit(record)

    async def lease_info(self, session_id: str) -> LeaseInfo:
        return await self._inner.lease_info(session_id)

    async def claim(self, session_id: str, *, owner: str, lease: timedelta) -> SessionWriter:
        return _CrashingWriter(await self._inner.claim(session_id, owner=owner, lease=lease), self._crash_at)

    async def close(self) -> None:
        await self._inner.close()


class _CrashingWriter:
    def __init__(self, inner: SessionWriter, crash_at: str | None) -> None:
        self._inner = inner
        self._crash_at = crash_at

    @property
    def session_id(self) -> str:
        return self._inner.session_id

    @property
    def epoch(self) -> int:
        return self._inner.epoch

    async def renew(self) -> None:
        await self._inner.renew()

    async def release(self) -> None:
        await self._inner.release()

    async def append(self, records: Sequence[Record]) -> list[LogEntry]:
        point = self._crash_at
        before = {
            "charge:fn-returned": lambda r: isinstance(r, StepResult) and r.name.startswith("charge:"),
            "checkout:steps-done": lambda r: isinstance(r, ToolResult) and r.name == "checkout",
            "notify:steps-done": lambda r: isinstance(r, ToolResult) and r.name == "notify",
        }.get(point or "")
        if before is not None and any(before(r) for r in records):
            _die()
        entries = await self._inner.append(records)
        if point == "charge:committed" and any(
            isinstance(r, StepResult) and r.name.startswith("charge:") for r in records
        ):
            _die()
        return entries


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    provider = FakePaymentProvider(args.provider)
    crash_at = args.crash_at if args.command == "run" else None
    log = CrashingLog(open_log(args.log), crash_at)
    host = HarnessHost(log=log, lease=timedelta(seconds=args.lease))
    session = await host.open(build_harness(provider, crash_at=crash_at), session_id=args.session)
    try:
        if args.command == "run":
            result = await session.send(f"Please check out order {ORDER_ID}", input_id="in-1")
            results = [result]
        else:
            results = await session.recover()
        return {
            "results": [{"input_id": r.input_id, "outcome": r.outcome, "text": r.text} for r in results],
        }
    finally:
        await host.close()
        await log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.testing.checkout")
    parser.add_argument("command", choices=["run", "recover"])
    parser.add_argument("--log", required=True, help="session log URL")
    parser.add_argument("--provider", required=True, help="fake payment provider SQLite file")
    parser.add_argument("--session", default="checkout-1")
    parser.add_argument("--crash-at", choices=CRASH_POINTS)
    parser.add_argument("--lease", type=float, default=1.0, help="lease seconds")
    args = parser.parse_args(argv)
    out = asyncio.run(_run(args))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
