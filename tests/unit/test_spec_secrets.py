"""Secrets never reach the log, by any path (issues 7 and 13).

* Names and ids holding a secret are refused before anything is written (SPEC 2.12).
* Redaction catches percent-encoded, JSON- and repr-escaped forms; a marker never
  rebuilds a secret.
* A tool runs with exactly the model's arguments; arguments holding a secret refuse
  the call (SPEC 7.6). Secrets shorter than ``MIN_SUBSTRING_SECRET`` match only whole.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

from harness import agent_tool, define_harness, durable_tool, tool_definition
from harness.errors import SecretInName
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.secrets import MIN_SUBSTRING_SECRET, SecretScrubber, secret_forms

from .conftest import LEASE, Args, call, crash, entries, eventually, raw_bytes, script

SID = "s-1"
LONG = "sk_live_p@ss/w0rd+é \"q\""  # characters that every escaping changes


class Ok(BaseModel):
    ok: bool


def harness_of(execute: Any, *, model: Any = None) -> Any:
    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    return define_harness(name="test/secrets", model=model or script([call("c1", "work")], "done"), tools=[t])


async def all_text(log: Any, logs: Any) -> str:
    return json.dumps([e.data for e in await log.read(SID)], ensure_ascii=False) + (
        await raw_bytes(log, logs)
    ).decode("utf-8", "replace")


# --- names and ids --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["step", "ask", "sleep"])
async def test_s2_12_a_name_holding_a_secret_is_refused_before_anything_is_written(host, log, kind):
    from datetime import timedelta

    caught: list[BaseException] = []

    async def execute(args: Args, ctx: Any) -> Any:
        name = f"charge:{ctx.secrets['card']}"
        try:
            if kind == "step":
                await ctx.step.do(name, lambda: 1)
            elif kind == "ask":
                await ctx.step.ask(name, message="?", schema=Ok)
            else:
                await ctx.step.sleep(name, timedelta(seconds=1))
        except SecretInName as exc:
            caught.append(exc)
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID, secrets={"card": "4242424242424242"})
    assert (await session.send("go")).outcome == "completed"
    assert len(caught) == 1 and caught[0].secret_name == "card" and f"{kind} name" in str(caught[0])
    for t in ("harness.step.result", "harness.ask.opened", "harness.sleep.scheduled"):
        assert await entries(log, SID, t) == []


async def test_s2_12_ids_holding_a_secret_are_refused(hosts, log):
    secrets = {"cvv": "123", "key": "sk_live_0123456789"}
    host = hosts(owner_id="a")
    with pytest.raises(SecretInName):
        await host.open(harness_of(lambda a, c: "ok"), session_id="user-sk_live_0123456789", secrets=secrets)
    session = await host.open(harness_of(lambda a, c: "ok"), session_id=SID, secrets=secrets)
    with pytest.raises(SecretInName):
        await session.send("hi", input_id="in-sk_live_0123456789")
    with pytest.raises(SecretInName):
        await session.send("hi", input_id="123")  # a short secret, as a whole id
    assert await log.read(SID) == []
    # A model's tool call id holding a secret fails that model call (nothing is rewritten).
    model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(id="call_sk_live_0123456789", name="work", arguments={})])]
    )
    other = await host.open(harness_of(lambda a, c: "ok", model=model), session_id="s-2", secrets=secrets)
    failed = await other.send("go", input_id="in-1")
    assert (failed.outcome, failed.code) == ("failed", "model_error")
    assert await entries(log, "s-2", "harness.model.response") == []


async def test_s2_12_an_input_another_process_wrote_with_a_secret_in_its_id_is_refused_once(host, log):
    """A gateway that does not know the worker's secrets writes the input as it came; the
    owner refuses it (``secret_in_name``) under its own id (a settlement under a rewritten
    id never settled it: the owner took it anew, turn after turn, forever)."""
    from harness.records import InputAnswer, InputMessage

    secret = "sk_live_0123456789"
    await log.submit(InputMessage(SID, 1, secret, "hello", "test/secrets"))
    await log.submit(InputAnswer(SID, 2, f"answer-{secret}", "c9", "approval", {"ok": True}))
    await log.submit(InputMessage(SID, 3, "in-2", "and then", "test/secrets"))
    session = await host.open(harness_of(lambda a, c: "ok"), session_id=SID, secrets={"key": secret})
    results = {r.input_id: r for r in await session.recover()}
    assert (results[secret].outcome, results[secret].code) == ("rejected", "secret_in_name")
    assert "input id holds the session secret 'key'" in (results[secret].error or "")
    assert results["in-2"].outcome == "completed"  # the next input runs as usual
    settled = await entries(log, SID, "harness.input.settled")
    assert sorted((s["input_id"], s["outcome"], s.get("code")) for s in settled) == sorted([
        (secret, "rejected", "secret_in_name"),
        (f"answer-{secret}", "rejected", "secret_in_name"),
        ("in-2", "completed", None),
    ])
    started = await entries(log, SID, "harness.turn.started")
    assert [s["input_id"] for s in started] == ["in-2"]  # the refused message started no turn


async def test_s2_12_default_input_ids_never_hold_a_short_secret(host, log):
    """A 3-digit CVV used to hit a random default input id ~1% of the time."""
    session = await host.open(harness_of(lambda a, c: "ok"), session_id=SID, secrets={"cvv": "7"})
    results = await asyncio.gather(*(session.append_records([{"type": "n", "i": i}]) for i in range(200)))
    assert results == [None] * 200
    ids = [i for i in session.state.inputs]
    assert len(ids) == 200 and all("[secret" not in i for i in ids)


# --- redaction: forms and markers -------------------------------------------------------------


async def test_redaction_catches_percent_encoded_and_escaped_forms(host, log, logs):
    forms = {
        "url": "https://api.example/charge?key=" + urllib.parse.quote(LONG, safe=""),
        "url-plus": "q=" + urllib.parse.quote_plus(LONG),
        "url-lower": urllib.parse.quote(LONG, safe="").lower().replace("sk_live_", "sk_live_"),
        "json": json.dumps({"token": LONG}),
        "json-ascii": json.dumps({"token": LONG}, ensure_ascii=True),
        "repr": repr({"token": LONG}),
        "ascii": ascii(LONG),
    }

    async def execute(args: Args, ctx: Any) -> Any:
        raise RuntimeError(" | ".join(forms.values()))

    session = await host.open(harness_of(execute), session_id=SID, secrets={"api": LONG})
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert "[secret:api]" in result["content"]["message"]
    text = await all_text(log, logs)
    for form in secret_forms(LONG):
        assert form not in text, form


def test_a_marker_never_rebuilds_a_secret() -> None:
    secrets = {
        "k": "sk_live_0123456789",
        "tail": "ecret:k]-tail",  # the end of k's marker and the text after it
        "self": "[secret:self]x",  # a secret inside its own marker (+x to be long enough)
        "mykey_value": "secret:mykey_value",  # a substring of its own marker
        "a": "abcdefgh12",
        "b": "gh12345678",  # overlaps a
    }
    scrubber = SecretScrubber(secrets)
    texts = [
        "sk_live_0123456789-tail",
        "[secret:self]x and secret:mykey_value",
        "abcdefgh12345678",
        "xx" + "".join(secrets.values()) + "yy",
    ]
    for text in texts:
        out = scrubber.redact_text(text)
        for value in secrets.values():
            assert value not in out, (text, out)
        assert not scrubber.holds(out)


def test_short_secrets_match_only_as_a_whole_value_long_ones_anywhere() -> None:
    short = "1" * (MIN_SUBSTRING_SECRET - 1)
    long = "2" * MIN_SUBSTRING_SECRET
    scrubber = SecretScrubber({"pin": short, "key": long})
    assert scrubber.redact_text(f"ord-{short}") == f"ord-{short}"  # inside other text: left alone
    assert scrubber.redact_text(short) == "[secret:pin]"  # the whole value
    assert scrubber.redact_text(f"ord-{long}") == "ord-[secret:key]"
    assert scrubber.find({"order": f"ord-{short}"}) is None
    assert scrubber.find({"pin": short}) == ("pin", "$.pin")
    assert scrubber.find({"x": [f"a{long}b"]}) == ("key", "$.x[0]")


# --- the argument rule (issue 13) ----------------------------------------------------------------


async def test_s7_6_a_tool_runs_with_exactly_the_models_arguments_first_run_and_replay(hosts, log, clock):
    seen: list[str] = []
    release = asyncio.Event()

    async def execute(args: Args, ctx: Any) -> Any:
        seen.append(args.order_id)
        await ctx.step.do("charge", lambda: 1)
        if len(seen) == 1:
            await release.wait()  # the first owner dies here
        return args.order_id

    h = harness_of(execute, model=script([call("c1", "work", order_id="ord-11")], "done"))
    first = await hosts(owner_id="a").open(h, session_id=SID, secrets={"pin": "1"})
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    await eventually(lambda: first.state.calls.get("c1") and first.state.calls["c1"].steps)
    await crash(first)
    task.cancel()
    clock.advance(LEASE.total_seconds() + 1)
    second = await hosts(owner_id="b").open(h, session_id=SID, secrets={"pin": "1"})
    [result] = await second.recover()
    assert result.outcome == "completed"
    assert seen == ["ord-11", "ord-11"]  # never "ord-[secret:pin][secret:pin]"
    response = (await entries(log, SID, "harness.model.response"))[0]
    assert response["tool_calls"][0]["arguments"] == {"order_id": "ord-11"}


async def test_s7_6_arguments_holding_a_secret_refuse_the_call_and_the_model_can_retry(host, log, logs):
    secret = "sk_live_0123456789"
    runs: list[str] = []

    def respond(messages: list[dict[str, Any]]) -> ModelResponse:
        tools = [m for m in messages if m["role"] == "tool"]
        if not tools:
            return ModelResponse(tool_calls=[ToolCall(id="c1", name="work", arguments={"order_id": f"o-{secret}"})])
        if len(tools) == 1:
            return ModelResponse(tool_calls=[ToolCall(id="c2", name="work", arguments={"order_id": "o-42"})])
        return ModelResponse(text="done")

    async def execute(args: Args, ctx: Any) -> Any:
        runs.append(args.order_id)
        return "ok"

    model = ScriptedModel(respond)
    session = await host.open(harness_of(execute, model=model), session_id=SID, secrets={"key": secret})
    assert (await session.send("go")).text == "done"
    assert runs == ["o-42"]  # the refused call never ran
    results = {r["tool_call_id"]: r for r in await entries(log, SID, "harness.tool.result")}
    assert results["c1"]["is_error"] and results["c1"]["code"] == "secret_in_arguments"
    assert results["c1"]["content"]["path"] == "$.order_id"
    assert "contains a session secret" in results["c1"]["content"]["message"]
    assert secret not in await all_text(log, logs)
    assert secret not in json.dumps(model.requests)


async def test_a_sub_agents_text_with_a_secret_is_handled_as_at_the_top_level(host, log, logs):
    secret = "sk_live_0123456789"
    child_model = ScriptedModel(
        [
            ModelResponse(
                text=f"I will use {secret}",
                tool_calls=[
                    ToolCall(id="k1", name="work", arguments={"order_id": secret}),
                    ToolCall(id="k2", name="work", arguments={"order_id": "7"}),
                ],
            ),
            ModelResponse(text=f"done with {secret}"),
        ]
    )
    runs: list[str] = []

    async def execute(args: Args, ctx: Any) -> Any:
        runs.append(args.order_id)
        return "ok"

    child = harness_of(execute, model=child_model)
    sub = agent_tool(tool_definition(name="helper", description="d", input_schema=Args), child)
    parent = define_harness(name="test/parent", model=script([call("p1", "helper")], "fine"), tools=[sub])
    session = await host.open(parent, session_id=SID, secrets={"key": secret})
    result = await session.send("go")
    assert result.outcome == "completed" and result.text == "fine"
    [tool_result] = await entries(log, SID, "harness.tool.result")
    assert not tool_result["is_error"]
    assert tool_result["content"] == {"text": "done with [secret:key]"}
    assert runs == ["7"]
    assert secret not in await all_text(log, logs)


@pytest.mark.parametrize(
    ("secrets", "says"),
    [
        ({"stripe": "sk_\ud800live_12345"}, "secret 'stripe' holds a lone surrogate"),
        ({"stripe": SecretStr("sk_\udcfflive_12345")}, "secret 'stripe' holds a lone surrogate"),
        ({"str\ud800ipe": "sk_live_12345"}, "a secret's name holds a lone surrogate"),
    ],
    ids=["value", "secretstr", "name"],
)
async def test_a_secret_with_a_lone_surrogate_is_refused_at_open_without_showing_it(host, secrets, says):
    """A secret read from a file with the wrong codec (``surrogateescape``) made
    ``host.open`` raise a bare UnicodeEncodeError from inside the library (quoting its
    percent-encoded form), with the secret's text in the message."""
    from harness.errors import DefinitionError

    h = define_harness(name="t/secrets", model=script("hi"))
    with pytest.raises(DefinitionError) as refused:
        await host.open(h, session_id=SID, secrets=secrets)
    assert says in str(refused.value) and "live_12345" not in str(refused.value)
