"""Values the log cannot hold (issue 7): one JSON check, and what it refuses fails one call.

The check (``harness.jsonvalues``) refuses lone surrogates, integers outside int64 and
nesting deeper than ``MAX_JSON_DEPTH``, naming the path; everything it accepts the
codec stores (a property test). The same values coming from a tool's result, its
exception text, ``ctx.append`` or a model response fail that one call, never the session.
"""

from __future__ import annotations

import enum
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import define_harness, durable_tool, tool_definition
from harness.codec import decode, encode
from harness.errors import StepValueError
from harness.jsonvalues import MAX_JSON_DEPTH, json_copy
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import AskAnswered, LogEntry, ModelResponseRecord, StepResult

from .conftest import Args, call, entries, script

SID = "s-1"


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


BAD_VALUES = [
    ("a-set", {1, 2}, "$"),
    ("surrogate", {"a": ["ok", "x\ud800y"]}, "$.a[1]"),
    ("surrogate-key", {"k": {"\udfff": 1}}, "$.k"),
    ("too-big", {"n": 2**63}, "$.n"),
    ("too-small", [-(2**63) - 1], "$[0]"),
    ("huge", {"n": 10**5000}, "$.n"),
    ("too-deep", {"d": nested(MAX_JSON_DEPTH)}, "$.d" + "[0]" * (MAX_JSON_DEPTH - 1)),
]


def harness_of(execute: Any, *, model: Any = None) -> Any:
    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    return define_harness(name="test/values", model=model or script([call("c1", "work")], "done"), tools=[t])


@pytest.mark.parametrize(("label", "value", "path"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_s2_7_the_json_check_refuses_what_the_log_cannot_hold(label: str, value: Any, path: str) -> None:
    with pytest.raises(StepValueError) as caught:
        json_copy(value)
    assert caught.value.path == path
    assert path in str(caught.value)
    str(caught.value).encode("utf-8")  # the message itself can go into a record


async def test_a_step_value_too_deep_logs_a_short_traceback_not_one_frame_per_level(host, log, caplog):
    """A step value nested deeper than MAX_JSON_DEPTH logged a ~300-line traceback: two frames
    of the JSON check for each of its 64 levels."""
    import logging

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.do("deep", lambda: nested(MAX_JSON_DEPTH + 5))
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    with caplog.at_level(logging.WARNING, logger="harness"):
        assert (await session.send("go", input_id="in-1")).outcome == "completed"
    [failed] = [r.getMessage() for r in caplog.records if "failed: StepValueError" in r.getMessage()]
    assert "nests deeper than 64 levels" in failed.splitlines()[0]
    lines = failed.splitlines()
    assert len(lines) < 30 and not any("in _copy" in line for line in lines), failed


def test_s2_7_limits_are_inclusive() -> None:
    assert json_copy([2**63 - 1, -(2**63)]) == [2**63 - 1, -(2**63)]
    assert json_copy(nested(MAX_JSON_DEPTH)) == nested(MAX_JSON_DEPTH)  # 64 lists


async def test_s2_7_step_values_the_log_cannot_hold_raise_step_value_error(host, log):
    caught: dict[str, StepValueError] = {}

    async def execute(args: Args, ctx: Any) -> Any:
        for name, value, _ in BAD_VALUES:
            try:
                await ctx.step.do(name, lambda value=value: value)
            except StepValueError as exc:
                caught[name] = exc
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert {name: exc.path for name, exc in caught.items()} == {n: p for n, _, p in BAD_VALUES}
    assert await entries(log, SID, "harness.step.result") == []
    assert str(caught["a-set"]).startswith("the value of step 'a-set' at $ is a set, which is not JSON (return sorted")


def test_a_refused_value_is_named_plainly() -> None:
    """Which step, an article that fits ('an int'), a hint for the usual Python values."""
    import datetime

    for value, says in [({1}, "at $ is a set, which is not JSON (return sorted(value) or list(value))"),
                        (datetime.date(2026, 1, 1), "at $ is a date, which is not JSON (return value.isoformat())"),
                        (object(), "at $ is an object, which is not JSON")]:
        with pytest.raises(StepValueError, match=re.escape(says)):
            json_copy(value, what="the value of step 'x'")


def test_an_answer_refused_by_the_schema_shows_the_value_as_json() -> None:
    from harness.records import AskOpened, InputMessage, ToolStarted, TurnStarted
    from harness.replay import fold
    from harness.runtime.answers import judge_answer

    schema = {"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]}
    records = [InputMessage("s", 1, "in-1", "go", "h"), TurnStarted("s", 2, "in-1", 1),
               ModelResponseRecord("s", 3, 1, 0, None, ({"id": "c1", "name": "t", "arguments": {}},)),
               ToolStarted("s", 3, "c1", "t", 1), AskOpened("s", 4, "c1", "ok", "ok?", schema, None)]
    state = fold("s", [LogEntry(i + 1, r) for i, r in enumerate(records)])
    assert judge_answer(state, "c1", "ok", [True], 5).reason == (
        "the answer does not fit the ask's schema at (answer): [true] is not of type 'object'"
    )
    assert judge_answer(state, "c1", "ok", {"approved": "yes"}, 5).reason == (
        "the answer does not fit the ask's schema at approved: \"yes\" is not of type 'boolean'"
    )


# Any text (lone surrogates included), any integer, any nesting the strategy reaches.
_any_text = st.text(max_size=8)
_any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**62) | st.floats() | _any_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_any_text, inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(value=_any_json | st.integers(1, MAX_JSON_DEPTH + 2).map(nested))
def test_s2_7_everything_the_check_accepts_the_codec_stores(value: Any) -> None:
    try:
        checked = json_copy(value)
    except StepValueError:
        return
    for record in (
        StepResult("s", 1, "c", "n", checked),
        AskAnswered("s", 1, "c", "n", checked, "i"),
        ModelResponseRecord("s", 1, 1, 0, None, ({"id": "c", "name": "t", "arguments": checked},)),
    ):
        assert decode(encode(record)) == record


# --- the same values from a tool, ctx.append or the model fail one call ------------------


@pytest.mark.parametrize(
    "behaviour",
    ["result", "exception", "append", "append-deep"],
)
async def test_s2_7_tool_values_the_log_cannot_hold_fail_that_call(host, log, behaviour):
    async def execute(args: Args, ctx: Any) -> Any:
        if behaviour == "result":
            return {"text": "bad \ud83d"}
        if behaviour == "exception":
            raise RuntimeError("upstream said \udc80 and \ud800")
        if behaviour == "append":
            ctx.append([{"type": "app.n", "n": 2**70}])
            return "ok"
        ctx.append([{"type": "app.deep", "d": nested(MAX_JSON_DEPTH + 5)}])
        return "ok"

    def respond(messages: list[dict[str, Any]]) -> ModelResponse:
        if messages[-1] == {"role": "user", "content": "go"}:
            return ModelResponse(tool_calls=[ToolCall(id="c1", name="work", arguments={})])
        return ModelResponse(text="done")

    session = await host.open(harness_of(execute, model=ScriptedModel(respond)), session_id=SID)
    result = await session.send("go", input_id="in-1")
    assert result.outcome == "completed" and result.text == "done"
    [tool_result] = await entries(log, SID, "harness.tool.result")
    assert tool_result["is_error"] and tool_result["code"] == "tool_failed"
    # The session is fine: the next turn runs.
    assert (await session.send("again", input_id="in-2")).outcome == "completed"


@pytest.mark.parametrize(
    "response",
    [
        ModelResponse(text="half a pair \ud83d"),
        ModelResponse(tool_calls=[ToolCall(id="c1", name="work", arguments={"order_id": "1", "n": 2**64})]),
        ModelResponse(tool_calls=[ToolCall(id="c1", name="work", arguments={"d": nested(MAX_JSON_DEPTH + 1)})]),
    ],
    ids=["text", "big-int-argument", "deep-arguments"],
)
async def test_s2_7_model_values_the_log_cannot_hold_fail_the_model_call(host, log, response):
    answers = iter([response, ModelResponse(text="fine")])
    model = ScriptedModel(lambda messages: next(answers))
    session = await host.open(harness_of(lambda a, c: "ok", model=model), session_id=SID)
    failed = await session.send("go", input_id="in-1")
    assert failed.outcome == "failed" and failed.code == "model_error"
    assert await entries(log, SID, "harness.model.response") == []
    assert (await session.send("again", input_id="in-2")).text == "fine"


async def test_s2_7_send_refuses_text_the_log_cannot_hold(host, log):
    session = await host.open(harness_of(lambda a, c: "ok"), session_id=SID)
    with pytest.raises(StepValueError):
        await session.send("lone \ud800", input_id="in-1")
    assert await log.read(SID) == []


class _Color(str, enum.Enum):  # noqa: UP042 - the common pre-3.11 form (a StrEnum's str() is its value already)
    RED = "red"


class _Tagged(str):
    def __str__(self) -> str:
        return f"<tagged {str.__str__(self)}>"


def test_s2_2_a_str_subclass_is_copied_as_its_text_as_json_writes_it() -> None:
    """A ``(str, Enum)`` member, a step value many apps return, was stored as its ``str()``:
    ``'_Color.RED'`` where ``json.dumps`` (and pydantic's ``mode='json'``) write ``"red"``;
    a dict key too. The copy is the string itself, as JSON has it."""
    value = {"status": _Color.RED, _Color.RED: [_Tagged("x")]}
    copy = json_copy(value)
    assert copy == json.loads(json.dumps(value)) == {"status": "red", "red": ["x"]}
    assert all(type(k) is str for k in copy) and type(copy["status"]) is str and type(copy["red"][0]) is str


async def test_s2_2_a_str_enum_step_value_is_stored_and_returned_as_its_value(host, log):
    seen: list[Any] = []

    async def execute(args: Args, ctx: Any) -> Any:
        seen.append(await ctx.step.do("status", lambda: _Color.RED))
        return {"status": _Color.RED}

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert seen == ["red"] and type(seen[0]) is str
    [stored] = await entries(log, SID, "harness.step.result")
    assert stored["value"] == "red"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["content"] == {"status": "red"}
