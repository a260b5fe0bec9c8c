"""A model's tool call id that cannot be an id (empty, a newline or a control character,
a lone surrogate, a space at an end, longer than ``ids.MAX_ID``) is renamed once, when its response is
logged, and the new id is used everywhere: the log, the tool result the model gets back,
answers, the timeline, and replay after a crash (which reads the logged response)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from harness import agent_tool, chat, define_harness, durable_tool, tool_definition
from harness.cli.render import Style, timeline_lines
from harness.ids import MAX_ID, check_id, model_call_id
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.views import timeline

from .conftest import LEASE, Args, Died, DyingLog, crash, entries

SID = "s-1"
BAD_IDS = ["a\nb", "tab\there", " padded ", "x" * (MAX_ID + 1), "bell\x07", "half a pair \udc00"]


class Approval(BaseModel):
    ok: bool


def test_model_call_id_keeps_a_usable_id_and_renames_the_rest():
    assert model_call_id("call_1", "1.0.0", set()) == "call_1"
    assert model_call_id("id with spaces inside", "1.0.0", set()) == "id with spaces inside"
    for bad in [*BAD_IDS, "", None, 5]:
        assert model_call_id(bad, "1.0.2", set()) == "call-1.0.2"
    assert model_call_id("c1", "2.0.1", {"c1"}) == "c1~2.0.1"
    assert model_call_id("", "2.0.1", {"call-2.0.1"}) == "call-2.0.1~2.0.1"
    longest = "y" * MAX_ID
    repeated = model_call_id(longest, "3.1.4", {longest})
    assert repeated.endswith("~3.1.4") and check_id(repeated, "tool call id") == repeated


def _responses(ids: list[str]) -> list[ModelResponse]:
    return [ModelResponse(tool_calls=[ToolCall(id=i, name="work", arguments={}) for i in ids]), ModelResponse(text="ok")]


async def test_unusable_ids_are_renamed_in_the_log_and_for_the_model(host, log):
    seen: list[str] = []

    async def execute(args: Args, ctx: Any) -> Any:
        seen.append(ctx.tool_call_id)
        return await ctx.step.do("s", lambda info: info.idempotency_key)

    model = ScriptedModel(_responses([*BAD_IDS, "kept-1"]))
    h = define_harness(name="t/ids", model=model,
                       tools=[durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)])
    session = await host.open(h, session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "completed"

    renamed = [f"call-1.0.{pos}" for pos in range(len(BAD_IDS))] + ["kept-1"]
    [response, _final] = await entries(log, SID, "harness.model.response")
    assert [c["id"] for c in response["tool_calls"]] == renamed
    assert sorted(seen) == sorted(renamed)
    assert sorted(r["tool_call_id"] for r in await entries(log, SID, "harness.tool.started")) == sorted(renamed)
    results = {r["tool_call_id"]: r["content"] for r in await entries(log, SID, "harness.tool.result")}
    assert results[renamed[0]] == f"{log.namespace}/{SID}:{renamed[0]}:s"
    sent = model.requests[-1]
    assert [c["id"] for c in sent[1]["tool_calls"]] == renamed
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == renamed
    # one timeline line per record: no id splits a line any more
    lines = timeline_lines(timeline(await log.read(SID)), 0, Style(False))
    assert all("\n" not in line for line in lines) and any("[call-1.0.0]" in line for line in lines)


async def test_an_ask_of_a_renamed_call_is_answered_under_the_new_id(host, log):
    async def execute(args: Args, ctx: Any) -> Any:
        answer = await ctx.step.ask("approve", message="ok?", schema=Approval)
        return {"ok": answer.ok}

    h = define_harness(name="t/ids", model=ScriptedModel(_responses(["a\nb"])),
                       tools=[durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)])
    session = await host.open(h, session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "waiting"
    [ask] = await entries(log, SID, "harness.ask.opened")
    assert ask["tool_call_id"] == "call-1.0.0"
    resumed = await session.answer("call-1.0.0", "approve", {"ok": True})
    assert resumed is not None and resumed.outcome == "completed"


async def test_replay_after_a_crash_keeps_the_logged_id(hosts, log, clock):
    keys: list[str] = []

    async def execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("charge", lambda info: keys.append(info.idempotency_key) or len(keys))

    # The model would answer differently the next time; the log's response is what counts.
    model = ScriptedModel(_responses(["a\nb"]))
    h = define_harness(name="t/ids", model=model,
                       tools=[durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)])
    dying = DyingLog(log, lambda batch: any(r.TYPE == "harness.step.result" for r in batch))
    first = await hosts(log_=dying, owner_id="a").open(h, session_id=SID)
    with pytest.raises(Died):
        await first.send("go", input_id="in-1")
    await crash(first)
    clock.advance(LEASE.total_seconds() + 1)

    second = await hosts(owner_id="b").open(h, session_id=SID)
    [result] = await second.recover()
    assert result.outcome == "completed"
    assert keys == [f"{log.namespace}/{SID}:call-1.0.0:charge"] * 2
    assert [r["tool_call_id"] for r in await entries(log, SID, "harness.tool.result")] == ["call-1.0.0"]
    assert len(await entries(log, SID, "harness.model.response")) == 2  # the batch was not asked for again


async def test_chat_renames_unusable_and_repeated_ids():
    keys: list[str] = []

    async def execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("s", lambda info: keys.append(info.idempotency_key) or info.tool_call_id)

    model = ScriptedModel(_responses(["a\nb", "same", "same"]))
    out = await chat(model=model, messages=[{"role": "user", "content": "go"}],
                     tools=[durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)])
    ids = [c["id"] for c in out[1]["tool_calls"]]
    assert ids[0].startswith("call-") and ids[1] == "same" and ids[2].startswith("same~")
    assert all(check_id(i, "tool call id") == i for i in ids)
    assert [m["tool_call_id"] for m in out if m["role"] == "tool"] == ids
    assert len(set(keys)) == 3  # no two calls share an idempotency key


async def test_a_sub_agent_renames_unusable_and_repeated_ids_of_its_model(host, log):
    ran: list[str] = []

    async def lookup(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("fetch", lambda: ran.append(args.order_id) or args.order_id)

    child_model = ScriptedModel([
        ModelResponse(tool_calls=[ToolCall(id=i, name="lookup", arguments={"order_id": str(n)})
                                  for n, i in enumerate(["a\nb", "", "twice", "twice"])]),
        ModelResponse(text="looked up"),
    ])
    child = define_harness(name="t/child", model=child_model, tools=[
        durable_tool(tool_definition(name="lookup", description="d", input_schema=Args), lookup)])
    research = agent_tool(tool_definition(name="research", description="d", input_schema=Args), child)
    parent = define_harness(name="t/parent", model=ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(id="p1", name="research", arguments={})]), ModelResponse(text="ok")]
    ), tools=[research])
    session = await host.open(parent, session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "completed"
    assert sorted(ran) == ["0", "1", "2", "3"]  # every call ran once, none refused as a duplicate step
    ids = ["call-0.0", "call-0.1", "twice", "twice~0.3"]
    assert [c["id"] for c in child_model.requests[-1][-5]["tool_calls"]] == ids
    assert [m["tool_call_id"] for m in child_model.requests[-1] if m["role"] == "tool"] == ids
    names = [s["name"] for s in await entries(log, SID, "harness.step.result")]
    assert all(name.isprintable() for name in names)
    assert "agent:0.call-0.0:result" in names and "agent:0.twice~0.3:result" in names
