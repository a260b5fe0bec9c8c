"""Bad input gets a clear, typed error and never corrupts or stalls a session; no secret leaks."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from pydantic import BaseModel

from harness import ToolOutcome, define_harness, durable_tool, tool, tool_definition
from harness.errors import DefinitionError, InvalidRecord, ReservedRecordType
from harness.models import ModelResponse, ScriptedModel

from .conftest import Args, call, entries, raw_bytes, script

SID = "s-1"


class Order(BaseModel):
    order_id: str
    quantity: int


def tool_results(log_entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["tool_call_id"]: r for r in log_entries}


async def test_unknown_tool_name_is_a_tool_error(host, log):
    t = tool(tool_definition(name="known", description="d", input_schema=Args), lambda a: 1)
    model = script([call("c1", "unknown", x=1)], "sorry")
    session = await host.open(define_harness(name="t/bad", model=model, tools=[t]), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["is_error"] and result["code"] == "unknown_tool"
    assert result["content"]["error"] == "unknown_tool"
    assert "'unknown'" in result["content"]["message"] and "known" in result["content"]["message"]


async def test_invalid_arguments_name_the_field(host, log):
    runs: list[int] = []
    t = tool(tool_definition(name="order", description="d", input_schema=Order), lambda a: runs.append(1))
    model = script([call("c1", "order", order_id="1", quantity="lots"), call("c2", "order", quantity=1)], "ok")
    session = await host.open(define_harness(name="t/bad", model=model, tools=[t]), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert runs == []
    results = tool_results(await entries(log, SID, "harness.tool.result"))
    for cid, field in (("c1", "quantity"), ("c2", "order_id")):
        content = results[cid]["content"]
        assert results[cid]["code"] == "invalid_arguments" and content["error"] == "invalid_arguments"
        assert field in content["message"]
        assert [f["field"] for f in content["fields"]] == [field]
    sent = {m["tool_call_id"]: json.loads(m["content"]) for m in model.requests[-1] if m["role"] == "tool"}
    assert sent["c1"]["fields"][0]["field"] == "quantity"


@pytest.mark.parametrize(
    "value", [dt.date(2024, 1, 1), {1, 2}, {"x": b"raw"}, float("nan")], ids=["date", "set", "bytes", "nan"]
)
async def test_non_json_tool_return_is_a_tool_error(host, log, value):
    t = tool(tool_definition(name="bad", description="d", input_schema=Args), lambda a: value)
    session = await host.open(define_harness(name="t/bad", model=script([call("c1", "bad")], "ok"), tools=[t]), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["is_error"] and result["code"] == "tool_failed"
    assert "tool result" in result["content"]["message"] and "$" in result["content"]["message"]


async def test_pydantic_model_return_is_dumped(host, log):
    t = tool(tool_definition(name="m", description="d", input_schema=Args), lambda a: Order(order_id="1", quantity=2))
    session = await host.open(define_harness(name="t/bad", model=script([call("c1", "m")], "ok"), tools=[t]), session_id=SID)
    await session.send("go")
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["content"] == {"order_id": "1", "quantity": 2} and not result["is_error"]


async def test_model_that_raises_fails_the_turn_with_model_error(host, log):
    calls: list[int] = []

    def flaky(messages: list[dict[str, Any]]) -> ModelResponse:
        calls.append(1)
        if len(calls) == 1:
            # Not a ModelError, a timeout or a connection error: permanent, no retry (issue 9).
            raise RuntimeError("model endpoint down")
        return ModelResponse(text="back")

    session = await host.open(define_harness(name="t/bad", model=ScriptedModel(flaky)), session_id=SID)
    result = await session.send("go", input_id="in-1")
    assert result.outcome == "failed" and result.code == "model_error"
    assert "RuntimeError" in (result.error or "") and "model endpoint down" in (result.error or "")
    assert calls == [1]
    [finished] = await entries(log, SID, "harness.turn.finished")
    assert finished["outcome"] == "failed" and finished["code"] == "model_error"
    # The session is not stalled: the next input runs.
    assert (await session.send("again", input_id="in-2")).text == "back"


async def test_model_returning_garbage_fails_the_turn(host, log):
    class Garbage:
        async def complete(self, messages: Any, tools: Any) -> Any:
            return {"text": "not a ModelResponse"}

    session = await host.open(define_harness(name="t/bad", model=Garbage()), session_id=SID)
    result = await session.send("go")
    assert result.outcome == "failed" and result.code == "model_error"


async def test_failing_before_hook_is_a_tool_error(host, log):
    runs: list[int] = []
    t = tool(tool_definition(name="t", description="d", input_schema=Args), lambda a: runs.append(1))

    def before(event: Any) -> Any:
        raise RuntimeError("policy service down")

    h = define_harness(name="t/bad", model=script([call("c1", "t")], "ok"), tools=[t], hooks={"on_before_tool_call": before})
    session = await host.open(h, session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["code"] == "hook_failed" and runs == []


async def test_reserved_record_types_are_refused(host, log):
    session = await host.open(define_harness(name="t/bad", model=script("ok")), session_id=SID)
    with pytest.raises(ReservedRecordType) as exc:
        await session.append_records([{"type": "harness.input.message"}])
    assert exc.value.record_type == "harness.input.message"
    with pytest.raises(InvalidRecord):
        await session.append_records([{"type": ""}])
    with pytest.raises(InvalidRecord):
        await session.append_records({"type": "x"})  # type: ignore[arg-type]
    assert await log.read(SID) == []


SECRET = "sk_live_NEVER_LOG_ME_4242"


async def test_secrets_never_reach_a_record_nor_the_model(host, log, logs):
    class Q(BaseModel):
        answer: str

    async def leaky(args: Args, ctx: Any) -> Any:
        token = ctx.secrets["stripe"]
        ctx.append([{"type": "audit", "token": token, token: "as a key"}])
        await ctx.step.do("safe", lambda: {"token_ref": "stripe"})
        if args.order_id == "raise":
            raise RuntimeError(f"upstream rejected {token}")
        answer = await ctx.step.ask("confirm", message=f"confirm with {token}?", schema=Q)
        return {"echo": token, "answer": answer.answer}

    def after(event: Any, outcome: ToolOutcome) -> Any:
        return None

    def respond(messages: list[dict[str, Any]]) -> ModelResponse:
        n = sum(1 for m in messages if m["role"] == "assistant")
        if n == 0:
            return ModelResponse(
                text=f"calling with {SECRET}",
                tool_calls=[
                    call("c1", "leaky", order_id="42"),
                    call("c2", "leaky", order_id="raise"),
                    call("c3", "leaky", order_id=SECRET),  # refused, never run (issue 13)
                ],
            )
        return ModelResponse(text=f"the key is {SECRET}")

    model = ScriptedModel(respond)
    t = durable_tool(tool_definition(name="leaky", description="d", input_schema=Args), leaky)
    h = define_harness(name="t/bad", model=model, tools=[t], hooks={"on_after_tool_call": after})
    session = await host.open(h, session_id=SID, secrets={"stripe": SECRET})
    waiting = await session.send(f"my key is {SECRET}", input_id="in-1")
    assert waiting.outcome == "waiting"
    assert SECRET not in repr(waiting)
    result = await session.answer("c1", "confirm", {"answer": f"yes {SECRET}"})
    assert result is not None and result.outcome == "completed"
    await session.append_records([{"type": "note", "text": SECRET}], input_id="r-1")

    assert SECRET not in repr(result)
    for entry in await log.read(SID):
        assert SECRET not in json.dumps(entry.data), entry.type
    assert SECRET not in json.dumps(model.requests)
    assert SECRET.encode() not in await raw_bytes(log, logs)
    assert "[secret:stripe]" in json.dumps(model.requests)
    assert SECRET not in json.dumps(await session.records())
    refused = session.state.calls["c3"].result
    assert refused is not None and refused.code == "secret_in_arguments" and refused.content["path"] == "$.order_id"


async def test_failing_after_hook_is_a_tool_error_not_a_stalled_session(host, log):
    t = tool(tool_definition(name="t", description="d", input_schema=Args), lambda a: {"ok": True})

    def after(event: Any, outcome: ToolOutcome) -> Any:
        raise RuntimeError("audit service down")

    h = define_harness(name="t/bad", model=script([call("c1", "t")], "ok"), tools=[t], hooks={"on_after_tool_call": after})
    session = await host.open(h, session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["is_error"] and result["code"] == "hook_failed"
    assert "audit service down" in result["content"]["message"]


async def test_hook_returning_non_json_is_a_tool_error(host, log):
    t = tool(tool_definition(name="t", description="d", input_schema=Args), lambda a: {"ok": True})
    h = define_harness(
        name="t/bad", model=script([call("c1", "t")], "ok"), tools=[t],
        hooks={"on_after_tool_call": lambda event, outcome: {"when": dt.datetime(2024, 1, 1)}},
    )
    session = await host.open(h, session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["code"] == "hook_failed"


async def test_before_hook_answers_for_the_tool_or_fails_cleanly(host, log):
    runs: list[int] = []
    t = tool(tool_definition(name="t", description="d", input_schema=Args), lambda a: runs.append(1))

    def before(event: Any) -> Any:
        return {"blocked": True} if event.tool_call_id == "c1" else {"bad": {1, 2}}

    h = define_harness(
        name="t/bad", model=script([call("c1", "t"), call("c2", "t")], "ok"), tools=[t],
        hooks={"on_before_tool_call": before},
    )
    session = await host.open(h, session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    results = tool_results(await entries(log, SID, "harness.tool.result"))
    assert results["c1"]["content"] == {"blocked": True} and results["c1"]["replaced_by_hook"]
    assert results["c2"]["code"] == "hook_failed"
    assert runs == []


@pytest.mark.parametrize(
    ("responses", "says"),
    [
        ("hello", "not a str"),
        ([{"text": "hi"}], "responses[0] is a dict"),
        ([ModelResponse(text="a"), "b"], "responses[1] is a str"),
        (None, "not NoneType"),
        (iter([ModelResponse(text="a")]), "not list_iterator"),
    ],
    ids=["str", "dict-item", "str-item", "none", "iterator"],
)
def test_a_script_that_is_no_list_of_model_responses_is_refused_when_made(responses: Any, says: str):
    """``ScriptedModel("hi")`` or ``ScriptedModel([{"text": ...}])`` failed only at the first
    turn (``model_error``, or an AttributeError from inside the harness); refused at once now."""
    with pytest.raises(DefinitionError) as refused:
        ScriptedModel(responses)
    assert says in str(refused.value) and "ModelResponse(" in str(refused.value)


async def test_a_tool_call_that_is_no_toolcall_fails_the_model_call_saying_so(host, log):
    model = ScriptedModel([ModelResponse(tool_calls=[{"id": "c1", "name": "t", "arguments": {}}])])  # type: ignore[list-item]
    session = await host.open(define_harness(name="t/bad", model=model), session_id=SID)
    result = await session.send("go")
    assert result.outcome == "failed" and result.code == "model_error"
    assert "tool_calls[0] is a dict, not a ToolCall" in (result.error or "")
    assert "AttributeError" not in (result.error or "")


async def test_tool_calls_that_are_no_list_fail_the_model_call_saying_so(host, log):
    model = ScriptedModel([ModelResponse(text="hi", tool_calls=None)])  # type: ignore[arg-type]
    session = await host.open(define_harness(name="t/bad", model=model), session_id=SID)
    result = await session.send("go")
    assert result.outcome == "failed" and result.code == "model_error"
    assert "tool_calls is a NoneType, not a list" in (result.error or "")
