"""The app the CLI tests run through ``harness worker --app tests.apps.cli_app:assistant``.

Each user message says what to do (words, in any order): ``order=<id>`` (checkout:
two steps and an app record), ``ask`` (a person approves), ``nap=<seconds>`` (a durable
sleep), ``coupon`` (a person gives an upper-case code: the ask's model has a validator
the JSON schema cannot say), ``secret`` (the tool reports a digest of ``ctx.secrets["api_key"]``), ``explode``
(the tool raises an error holding that secret), ``hold`` (the tool waits until the
test releases it: it creates ``enter-<session>`` in ``$HARNESS_TEST_GATE_DIR`` and
returns once ``release-<session>`` exists there), ``ship`` (a ``replay="never"`` tool
whose one step holds the same way, ``ship-enter-<session>`` / ``ship-release-<session>``,
and adds a line to ``shipped-<session>`` each time it runs), ``syncship`` (the same with
a sync step function, on a thread of the worker's pool). The model answers ``done: <results>``;
every answer reports its usage (100 input and 10 output tokens of ``scripted-1``, $0.0005).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, field_validator

from harness import define_harness, durable_tool, tool_definition
from harness.definition import Harness
from harness.models import ModelResponse, ScriptedModel, ToolCall, Usage


class OrderArgs(BaseModel):
    order_id: str


class NoArgs(BaseModel):
    pass


class NapArgs(BaseModel):
    seconds: float


class Approval(BaseModel):
    approved: bool


class Coupon(BaseModel):
    code: str

    @field_validator("code")
    @classmethod
    def upper_case(cls, value: str) -> str:
        if value != value.upper():
            raise ValueError("code must be upper-case")
        return value


async def checkout_impl(args: OrderArgs, ctx: Any) -> dict[str, Any]:
    charge = await ctx.step.do(f"charge:{args.order_id}", lambda: {"id": f"ch_{args.order_id}", "amount": 1000})
    await ctx.step.do(f"invoice:{charge['id']}", lambda: {"id": f"inv_{args.order_id}"})
    ctx.append([{"type": "order.paid", "order_id": args.order_id}])
    return {"charge_id": charge["id"]}


async def approve_impl(args: NoArgs, ctx: Any) -> dict[str, Any]:
    answer = await ctx.step.ask("approval", message="Approve the order?", schema=Approval)
    return {"approved": answer.approved}


async def coupon_impl(args: NoArgs, ctx: Any) -> dict[str, Any]:
    coupon = await ctx.step.ask("coupon", message="Which coupon code?", schema=Coupon)
    return {"code": coupon.code}


async def nap_impl(args: NapArgs, ctx: Any) -> dict[str, Any]:
    await ctx.step.sleep("nap", timedelta(seconds=args.seconds))
    return {"slept": args.seconds}


async def secret_impl(args: NoArgs, ctx: Any) -> dict[str, Any]:
    value = ctx.secrets.get("api_key", "")
    other = ctx.secrets.get("db_password", "")
    return {
        "api_key_sha256": hashlib.sha256(value.encode()).hexdigest()[:16],
        "db_password_sha256": hashlib.sha256(other.encode()).hexdigest()[:16],
        "names": sorted(ctx.secrets),
    }


async def explode_impl(args: NoArgs, ctx: Any) -> dict[str, Any]:
    raise ValueError(f"the payment API refused key {ctx.secrets.get('api_key', '?')}")


async def hold_impl(args: NoArgs, ctx: Any) -> dict[str, Any]:
    folder = Path(os.environ["HARNESS_TEST_GATE_DIR"])
    (folder / f"enter-{ctx.session_id}").write_text("")
    while not (folder / f"release-{ctx.session_id}").exists():
        await asyncio.sleep(0.05)
    (folder / f"exit-{ctx.session_id}").write_text("")
    return {"held": ctx.session_id}


async def ship_impl(args: NoArgs, ctx: Any) -> dict[str, Any]:
    folder = Path(os.environ["HARNESS_TEST_GATE_DIR"])

    async def ship() -> dict[str, Any]:
        (folder / f"ship-enter-{ctx.session_id}").write_text("")
        while not (folder / f"ship-release-{ctx.session_id}").exists():
            await asyncio.sleep(0.05)
        with (folder / f"shipped-{ctx.session_id}").open("a") as f:
            f.write("shipped\n")
        return {"shipped": ctx.session_id}

    return await ctx.step.do("ship", ship)


async def sync_ship_impl(args: NoArgs, ctx: Any) -> dict[str, Any]:
    folder = Path(os.environ["HARNESS_TEST_GATE_DIR"])

    def ship() -> dict[str, Any]:  # sync: it runs on a thread of the worker's pool
        (folder / f"ship-enter-{ctx.session_id}").write_text("")
        while not (folder / f"ship-release-{ctx.session_id}").exists():
            time.sleep(0.05)
        with (folder / f"shipped-{ctx.session_id}").open("a") as f:
            f.write("shipped\n")
        return {"shipped": ctx.session_id}

    return await ctx.step.do("ship", ship)


def _tool(name: str, args: type[BaseModel], fn: Any, replay: str = "safe") -> Any:
    return durable_tool(tool_definition(name=name, description=name, input_schema=args), fn, replay=replay)


TOOLS = [
    _tool("checkout", OrderArgs, checkout_impl),
    _tool("approve", NoArgs, approve_impl),
    _tool("coupon", NoArgs, coupon_impl),
    _tool("nap", NapArgs, nap_impl),
    _tool("secret", NoArgs, secret_impl),
    _tool("explode", NoArgs, explode_impl),
    _tool("hold", NoArgs, hold_impl),
    _tool("ship", NoArgs, ship_impl, replay="never"),
    _tool("syncship", NoArgs, sync_ship_impl, replay="never"),
]


USAGE = Usage(input_tokens=100, output_tokens=10, model="scripted-1", cost=0.0005)


def script(messages: list[dict[str, Any]]) -> ModelResponse:
    response = _answer(messages)
    return ModelResponse(text=response.text, tool_calls=response.tool_calls, usage=USAGE)


def _answer(messages: list[dict[str, Any]]) -> ModelResponse:
    user = [m["content"] for m in messages if m["role"] == "user"][-1]
    last = messages[-1]
    if last["role"] == "tool":  # the batch is done: answer with what the tools said
        results = [m["content"] for m in messages[messages.index(_last_assistant(messages)) + 1:]]
        return ModelResponse(text="done: " + "; ".join(json.dumps(json.loads(r), sort_keys=True) for r in results))
    calls = []
    if m := re.search(r"order=(\S+)", user):
        calls.append(ToolCall(id=f"checkout-{m.group(1)}", name="checkout", arguments={"order_id": m.group(1)}))
    if re.search(r"\bask\b", user):
        calls.append(ToolCall(id="approve", name="approve", arguments={}))
    if m := re.search(r"nap=(\S+)", user):
        calls.append(ToolCall(id="nap", name="nap", arguments={"seconds": float(m.group(1))}))
    for word in ("coupon", "secret", "explode", "hold", "ship", "syncship"):
        if re.search(rf"\b{word}\b", user):
            calls.append(ToolCall(id=word, name=word, arguments={}))
    if not calls:
        return ModelResponse(text=f"you said: {user}")
    return ModelResponse(text="working on it", tool_calls=calls)


def _last_assistant(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return next(m for m in reversed(messages) if m["role"] == "assistant")


assistant: Harness = define_harness(name="tests/cli", model=ScriptedModel(script), tools=TOOLS)
