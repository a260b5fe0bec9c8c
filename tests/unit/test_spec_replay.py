"""SPEC 5 end to end: a cut batch after a crash, through sessions on memory and SQLite.

A crash is either a log written by hand by an owner that never comes back, or a
session killed mid-turn (``crash``); a NEW host then calls ``recover()``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from harness import ToolOutcome, define_harness, durable_tool, tool, tool_definition
from harness.definition import DEFAULT_CUT_CALL_ERROR
from harness.models import ModelResponse, ScriptedModel
from harness.records import (
    InputMessage,
    ModelResponseRecord,
    StepResult,
    ToolStarted,
    TurnStarted,
)

from .conftest import LEASE, Args, call, crash, entries, eventually, raw_bytes, script

SID = "s-1"
HARNESS = "test/replay"


class Counter:
    def __init__(self) -> None:
        self.runs: dict[str, int] = {}

    def hit(self, name: str) -> int:
        self.runs[name] = self.runs.get(name, 0) + 1
        return self.runs[name]


async def write_as_dead_owner(log: Any, *records: Any) -> None:
    """Records a previous owner committed before it died (its lease is still live)."""
    writer = await log.claim(SID, owner="dead-owner", lease=LEASE)
    await writer.append(list(records))


def cut_turn(*calls: tuple[str, str], started: tuple[str, ...] = (), steps: tuple[tuple[str, str, Any], ...] = ()) -> list[Any]:
    """A turn cut in its first batch: ``calls`` are (id, tool name); ``started`` had tool.started."""
    names = dict(calls)
    out: list[Any] = [
        InputMessage(SID, 1, "in-1", "go", HARNESS),
        TurnStarted(SID, 2, "in-1", 1),
        ModelResponseRecord(SID, 3, 1, 0, None, tuple({"id": c, "name": n, "arguments": {}} for c, n in calls)),
    ]
    out += [ToolStarted(SID, 4, c, names[c], 1) for c in started]
    out += [StepResult(SID, 5, c, name, value) for c, name, value in steps]
    return out


def tool_messages(model: ScriptedModel) -> dict[str, dict[str, Any]]:
    """The tool results of the model's last request, by call id, content decoded."""
    return {
        m["tool_call_id"]: {**m, "content": json.loads(m["content"])}
        for m in model.requests[-1]
        if m["role"] == "tool"
    }


def tools_counting(counter: Counter) -> dict[str, Any]:
    async def durable_fn(args: Args, ctx: Any) -> Any:
        n = counter.hit(ctx.tool_call_id)
        value = await ctx.step.do("s", lambda: f"step-of-{ctx.tool_call_id}-run-{n}")
        return {"value": value, "run": n}

    def plain_fn(args: Args) -> Any:
        return {"run": counter.hit("plain")}

    d = lambda name, **kw: tool_definition(name=name, description="d", input_schema=Args, **kw)  # noqa: E731
    return {
        "safe": durable_tool(d("safe"), durable_fn),
        "never": durable_tool(d("never"), durable_fn, replay="never"),
        "plain": tool(d("plain"), plain_fn),
        "plain_safe": tool(d("plain_safe", replay="safe"), lambda a: {"run": counter.hit("plain_safe")}),
        # SPEC 5.5: the definition's replay is not read for a durable tool.
        "def_never_kw_safe": durable_tool(d("def_never_kw_safe", replay="never"), durable_fn),
        "def_safe_kw_never": durable_tool(d("def_safe_kw_never", replay="safe"), durable_fn, replay="never"),
    }


def make_harness(counter: Counter, model: Any, hooks: Any = None) -> Any:
    return define_harness(name=HARNESS, model=model, tools=list(tools_counting(counter).values()), hooks=hooks)


async def recover_after_lease(hosts: Any, clock: Any, h: Any) -> Any:
    clock.advance(LEASE.total_seconds() + 1)
    session = await hosts(owner_id="new-owner").open(h, session_id=SID)
    return session, await session.recover()


async def test_s5_1_finished_call_keeps_result_and_does_not_run_again(hosts, log, clock):
    counter = Counter()
    release = asyncio.Event()

    async def slow(args: Args, ctx: Any) -> Any:
        counter.hit("slow")
        await release.wait()
        return "slow done"

    model = script([call("c1", "safe"), call("c2", "slow")], "done")
    h = define_harness(
        name=HARNESS,
        model=model,
        tools=[
            tools_counting(counter)["safe"],
            durable_tool(tool_definition(name="slow", description="d", input_schema=Args), slow),
        ],
    )
    first = await hosts(owner_id="a").open(h, session_id=SID)
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    await eventually(lambda: first.state.calls.get("c1") and first.state.calls["c1"].result)
    await crash(first)
    task.cancel()
    release.set()

    _, [result] = await recover_after_lease(hosts, clock, h)
    assert result.outcome == "completed"
    assert counter.runs == {"c1": 1, "slow": 2}
    results = await entries(log, SID, "harness.tool.result")
    assert [r["tool_call_id"] for r in results] == ["c1", "c2"]
    assert results[0]["content"] == {"value": "step-of-c1-run-1", "run": 1}
    assert tool_messages(model)["c1"]["content"] == {"value": "step-of-c1-run-1", "run": 1}


async def test_s5_2_safe_calls_run_again_with_finished_steps_served(hosts, log, clock):
    counter = Counter()
    # The log already has response 0; the model gives response 1.
    model = ScriptedModel([ModelResponse(text="never used"), ModelResponse(text="done")])
    h = make_harness(counter, model)
    await write_as_dead_owner(
        log,
        *cut_turn(
            ("c1", "safe"), ("c2", "plain_safe"), ("c3", "def_never_kw_safe"),
            started=("c1", "c2", "c3"),
            steps=(("c1", "s", "stored-c1"),),
        ),
    )
    _, [result] = await recover_after_lease(hosts, clock, h)
    assert result.outcome == "completed" and result.text == "done"
    assert counter.runs == {"c1": 1, "plain_safe": 1, "c3": 1}
    msgs = tool_messages(model)
    assert msgs["c1"]["content"] == {"value": "stored-c1", "run": 1}  # the finished step was served
    assert msgs["c2"]["content"] == {"run": 1} and not msgs["c2"]["is_error"]
    assert msgs["c3"]["content"]["run"] == 1
    started = await entries(log, SID, "harness.tool.started")
    assert sorted((s["tool_call_id"], s["attempt"]) for s in started) == [
        ("c1", 1), ("c1", 2), ("c2", 1), ("c2", 2), ("c3", 1), ("c3", 2)
    ]


async def test_s5_3_other_calls_get_the_cut_error_and_keep_their_steps(hosts, log, clock):
    counter = Counter()
    model = ScriptedModel([ModelResponse(text="never used"), ModelResponse(text="checked")])
    h = make_harness(counter, model)
    await write_as_dead_owner(
        log,
        *cut_turn(
            ("c1", "never"), ("c2", "plain"), ("c3", "def_safe_kw_never"), ("c4", "gone"),
            started=("c1", "c2", "c3", "c4"),
            steps=(("c1", "s", "charged"),),
        ),
    )
    _, [result] = await recover_after_lease(hosts, clock, h)
    assert result.outcome == "completed"
    assert counter.runs == {}  # nothing ran again
    msgs = tool_messages(model)
    for cid in ("c1", "c2", "c3", "c4"):
        assert msgs[cid]["is_error"], cid
        assert msgs[cid]["content"] == {"error": "cut", "message": DEFAULT_CUT_CALL_ERROR}
    assert "nobody knows whether" in DEFAULT_CUT_CALL_ERROR and "Check" in DEFAULT_CUT_CALL_ERROR
    results = {r["tool_call_id"]: r for r in await entries(log, SID, "harness.tool.result")}
    assert all(r["code"] == "cut" for r in results.values())
    steps = await entries(log, SID, "harness.step.result")
    assert [(s["tool_call_id"], s["value"]) for s in steps] == [("c1", "charged")]


async def test_s5_3_call_that_never_started_runs_even_with_replay_never(hosts, log, clock):
    counter = Counter()
    model = ScriptedModel([ModelResponse(text="never used"), ModelResponse(text="done")])
    h = make_harness(counter, model)
    await write_as_dead_owner(log, *cut_turn(("c1", "never"), ("c2", "plain"), started=()))
    _, [result] = await recover_after_lease(hosts, clock, h)
    assert result.outcome == "completed"
    assert counter.runs == {"c1": 1, "plain": 1}
    assert not any(m["is_error"] for m in tool_messages(model).values())


async def test_s5_3_cut_durable_call_after_a_real_crash(hosts, log, clock, provider):
    release = asyncio.Event()

    async def checkout(args: Args, ctx: Any) -> Any:
        payment = await ctx.step.do(
            "charge", lambda info: provider.charge(args.order_id, idempotency_key=info.idempotency_key)
        )
        await release.wait()
        return payment

    model = script([call("c1", "checkout")], "let me check")
    t = durable_tool(tool_definition(name="checkout", description="d", input_schema=Args), checkout, replay="never")
    h = define_harness(name=HARNESS, model=model, tools=[t])
    first = await hosts(owner_id="a").open(h, session_id=SID)
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    await eventually(lambda: first.state.calls.get("c1") and first.state.calls["c1"].steps)
    await crash(first)
    task.cancel()
    release.set()
    _, [result] = await recover_after_lease(hosts, clock, h)
    assert result.outcome == "completed" and result.text == "let me check"
    assert len(provider.calls) == 1
    assert tool_messages(model)["c1"]["content"]["error"] == "cut"
    assert len(await entries(log, SID, "harness.step.result")) == 1


def agent_tool(counter: Counter) -> Any:
    class Ok(Args):
        ok: bool = True

    async def sub_agent(args: Args, ctx: Any) -> Any:
        counter.hit(ctx.tool_call_id)
        answer = await ctx.step.ask("confirm", message="go on?", schema=Ok)
        return {"ok": answer.ok}

    t = durable_tool(tool_definition(name="agent", description="d", input_schema=Args), sub_agent)
    return dataclasses.replace(t, agent=True)


async def test_s5_4_agent_call_is_cut_unless_waiting_for_a_person(hosts, log, clock):
    from harness.records import AskOpened

    counter = Counter()
    model = ScriptedModel([ModelResponse(text="never used"), ModelResponse(text="done")])
    h = define_harness(name=HARNESS, model=model, tools=[agent_tool(counter)])
    await write_as_dead_owner(
        log,
        *cut_turn(("c1", "agent"), ("c2", "agent"), started=("c1", "c2")),
        AskOpened(SID, 6, "c2", "confirm", "go on?", {"type": "object"}, None),
    )
    session, [waiting] = await recover_after_lease(hosts, clock, h)
    assert waiting.outcome == "waiting"
    assert [(a.tool_call_id, a.name) for a in waiting.waiting] == [("c2", "confirm")]
    assert counter.runs == {"c2": 1}  # c1 was cut, c2 kept its place
    [cut] = await entries(log, SID, "harness.tool.result")
    assert cut["tool_call_id"] == "c1" and cut["code"] == "cut"

    result = await session.answer("c2", "confirm", {"order_id": "1", "ok": True})
    assert result is not None and result.outcome == "completed"
    msgs = tool_messages(model)
    assert msgs["c1"]["content"]["error"] == "cut"
    assert msgs["c2"]["content"] == {"ok": True}
    assert len(await entries(log, SID, "harness.ask.opened")) == 1


async def test_s5_5_durable_tool_replay_keyword_decides_not_the_definition(hosts, log, clock):
    counter = Counter()
    model = ScriptedModel([ModelResponse(text="never used"), ModelResponse(text="done")])
    h = make_harness(counter, model)
    assert h.tools["def_never_kw_safe"].replay == "safe"
    assert h.tools["def_safe_kw_never"].replay == "never"
    await write_as_dead_owner(
        log, *cut_turn(("c1", "def_never_kw_safe"), ("c2", "def_safe_kw_never"), started=("c1", "c2"))
    )
    await recover_after_lease(hosts, clock, h)
    assert counter.runs == {"c1": 1}
    msgs = tool_messages(model)
    assert not msgs["c1"]["is_error"] and msgs["c2"]["content"]["error"] == "cut"


SECRET = "sk_live_SECRET_987"


async def test_s5_6_kept_result_is_after_hooks_with_secrets_removed(hosts, log, logs, clock):
    counter = Counter()

    async def leaky(args: Args, ctx: Any) -> Any:
        counter.hit(ctx.tool_call_id)
        if args.order_id == "raise":
            raise RuntimeError(f"failed with {ctx.secrets['stripe']}")
        return {"token": ctx.secrets["stripe"], "order": args.order_id}

    def after(event: Any, outcome: ToolOutcome) -> Any:
        if outcome.is_error:
            return ToolOutcome({"replaced": True, "was": outcome.content["message"]})
        return {**outcome.content, "hooked": True}

    model = script([call("c1", "leaky", order_id="1"), call("c2", "leaky", order_id="raise")], "done")
    t = durable_tool(tool_definition(name="leaky", description="d", input_schema=Args), leaky)
    h = define_harness(name=HARNESS, model=model, tools=[t], hooks={"on_after_tool_call": after})
    first = await hosts(owner_id="a").open(h, session_id=SID, secrets={"stripe": SECRET})
    assert (await first.send("go", input_id="in-1")).outcome == "completed"

    results = {r["tool_call_id"]: r for r in await entries(log, SID, "harness.tool.result")}
    assert results["c1"]["content"] == {"token": "[secret:stripe]", "order": "1", "hooked": True}
    assert results["c1"]["replaced_by_hook"]
    assert results["c2"]["content"] == {"replaced": True, "was": "failed with [secret:stripe]"}
    assert results["c2"]["replaced_by_hook"] and not results["c2"]["is_error"]
    seen = tool_messages(model)
    assert {k: v["content"] for k, v in seen.items()} == {k: r["content"] for k, r in results.items()}
    assert SECRET not in json.dumps(model.requests)
    assert SECRET.encode() not in await raw_bytes(log, logs)

    # A later turn (and a new owner) sees the very same kept results: nothing reruns.
    second = await hosts(owner_id="b", log_=log).open(h, session_id=SID, secrets={"stripe": SECRET})
    await second.records()
    assert counter.runs == {"c1": 1, "c2": 1}


async def test_s5_6_hook_replaces_the_cut_error(hosts, log, clock):
    counter = Counter()
    model = ScriptedModel([ModelResponse(text="never used"), ModelResponse(text="done")])

    def after(event: Any, outcome: ToolOutcome) -> Any:
        if outcome.code == "cut":
            return ToolOutcome({"error": "cut", "message": "custom"}, is_error=True, code="cut")
        return None

    h = make_harness(counter, model, hooks={"on_after_tool_call": after})
    await write_as_dead_owner(log, *cut_turn(("c1", "never"), started=("c1",)))
    await recover_after_lease(hosts, clock, h)
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["content"] == {"error": "cut", "message": "custom"} and result["replaced_by_hook"]
    assert tool_messages(model)["c1"]["content"]["message"] == "custom"


async def test_s5_7_model_response_logged_before_calls_run_and_never_asked_again(hosts, log, clock):
    counter = Counter()
    seen_in_log: list[list[str]] = []

    async def look(args: Args, ctx: Any) -> Any:
        seen_in_log.append([e.type for e in await log.read(SID)])
        counter.hit("look")
        return "ok"

    model = script([call("c1", "look")], "done")
    t = durable_tool(tool_definition(name="look", description="d", input_schema=Args), look)
    h = define_harness(name=HARNESS, model=model, tools=[t])
    session = await hosts().open(h, session_id=SID)
    await session.send("go")
    assert "harness.model.response" in seen_in_log[0]

    # After a crash with the response logged, recovery runs the batch without the model.
    counter2 = Counter()
    calls: list[int] = []

    def respond(messages: list[dict[str, Any]]) -> ModelResponse:
        calls.append(len(messages))
        return ModelResponse(text="finished")

    model2 = ScriptedModel(respond)
    h2 = make_harness(counter2, model2)
    sid2 = "s-2"
    w = await log.claim(sid2, owner="dead-owner", lease=LEASE)
    await w.append(
        [
            InputMessage(sid2, 1, "in-1", "go", HARNESS),
            TurnStarted(sid2, 2, "in-1", 1),
            ModelResponseRecord(sid2, 3, 1, 0, None, ({"id": "c9", "name": "safe", "arguments": {}},)),
        ]
    )
    clock.advance(LEASE.total_seconds() + 1)
    s2 = await hosts(owner_id="new").open(h2, session_id=sid2)
    [result] = await s2.recover()
    assert result.outcome == "completed" and result.text == "finished"
    assert counter2.runs == {"c9": 1}
    assert len(calls) == 1  # only the call after the batch; the batch's response came from the log
    responses = await entries(log, sid2, "harness.model.response")
    assert [r["index"] for r in responses] == [0, 1]
