"""SPEC 3: waits (``step.sleep``, ``step.ask``), with a fake clock: nothing really sleeps."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic
import pytest
from pydantic import BaseModel

from harness import HarnessClient, define_harness, durable_tool, tool_definition
from harness.errors import AskExpired, DuplicateStepName, InvalidAnswer, StepError, StepValueError
from harness.records import InputAnswer

from .conftest import LEASE, Args, call, crash, entries, eventually, script

SID = "s-1"


class Approval(BaseModel):
    approved: bool
    note: str = ""


def harness_of(execute: Any, *, model: Any = None) -> Any:
    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    return define_harness(name="test/waits", model=model or script([call("c1", "work")], "done"), tools=[t])


# --- 3.1 sleep ---------------------------------------------------------------------------


async def test_s3_1_sleep_records_wake_time_before_waiting(host, log, clock):
    start = clock.now()

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.sleep("nap", timedelta(seconds=60))
        return "rested"

    session = await host.open(harness_of(execute), session_id=SID)
    task = asyncio.create_task(session.send("go"))
    await eventually(lambda: clock.sleepers == 1)
    [scheduled] = await entries(log, SID, "harness.sleep.scheduled")
    assert scheduled["wake_at"] == round((start + 60) * 1000)
    assert not task.done()
    clock.advance(59)
    await asyncio.sleep(0)
    assert not task.done() and clock.sleepers == 1
    clock.advance(1)
    assert (await task).outcome == "completed"


async def test_s3_1_sleep_until_datetime(host, log, clock):
    wake = datetime.fromtimestamp(clock.now() + 3600, tz=UTC)

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.sleep("nap", until=wake)
        return "rested"

    session = await host.open(harness_of(execute), session_id=SID)
    task = asyncio.create_task(session.send("go"))
    await eventually(lambda: clock.sleepers == 1)
    [scheduled] = await entries(log, SID, "harness.sleep.scheduled")
    assert scheduled["wake_at"] == round(wake.timestamp() * 1000)
    clock.set(wake.timestamp())
    assert (await task).outcome == "completed"


async def test_s3_1_sleep_takes_a_number_of_seconds_like_asyncio_sleep(host, log, clock):
    start = clock.now()

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.sleep("nap", 90)
        await ctx.step.sleep("short", 0.25)
        return "rested"

    session = await host.open(harness_of(execute), session_id=SID)
    task = asyncio.create_task(session.send("go"))
    await eventually(lambda: clock.sleepers == 1)
    clock.advance(90)
    await eventually(lambda: clock.sleepers == 1)
    clock.advance(0.25)
    assert (await task).outcome == "completed"
    nap, short = await entries(log, SID, "harness.sleep.scheduled")
    assert nap["wake_at"] == round((start + 90) * 1000)
    assert short["wake_at"] == round((start + 90.25) * 1000)


@pytest.mark.parametrize(
    ("duration", "says"),
    [
        ("60", "not str"),
        (True, "not bool"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        (10**30, "finite"),
    ],
)
async def test_s3_1_a_duration_that_is_no_time_is_a_step_error_naming_it_before_anything_is_logged(
    host, log, duration, says
):
    caught: list[BaseException] = []

    async def execute(args: Args, ctx: Any) -> Any:
        try:
            await ctx.step.sleep("nap", duration)
        except StepError as exc:
            caught.append(exc)
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [exc] = caught
    assert says in str(exc) and "step.sleep" in str(exc)
    assert await entries(log, SID, "harness.sleep.scheduled") == []


async def _crash_while_sleeping(hosts: Any, clock: Any, runs: list[int]) -> Any:
    async def execute(args: Args, ctx: Any) -> Any:
        runs.append(1)
        await ctx.step.sleep("nap", timedelta(seconds=60))
        return "rested"

    h = harness_of(execute)
    first = await hosts(owner_id="a").open(h, session_id=SID)
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    await eventually(lambda: clock.sleepers == 1)
    await crash(first)
    task.cancel()
    return h


async def test_s3_1_after_crash_sleep_waits_only_until_recorded_wake(hosts, log, clock):
    runs: list[int] = []
    start = clock.now()
    h = await _crash_while_sleeping(hosts, clock, runs)
    clock.advance(LEASE.total_seconds() + 1)  # 31 s of the 60 s have passed

    second = await hosts(owner_id="b").open(h, session_id=SID)
    recovering = asyncio.create_task(second.recover())
    await eventually(lambda: clock.sleepers == 1)
    assert len(runs) == 2 and not recovering.done()
    clock.set(start + 60 - 0.01)
    await asyncio.sleep(0)
    assert not recovering.done()
    clock.set(start + 60)  # the recorded wake time, not 60 s after the rerun began
    [result] = await recovering
    assert result.outcome == "completed"
    assert len(await entries(log, SID, "harness.sleep.scheduled")) == 1


async def test_s3_1_after_crash_sleep_already_due_returns_at_once(hosts, log, clock):
    runs: list[int] = []
    h = await _crash_while_sleeping(hosts, clock, runs)
    clock.advance(3600)

    second = await hosts(owner_id="b").open(h, session_id=SID)
    [result] = await second.recover()  # nobody advances the clock: it must not wait
    assert result.outcome == "completed"
    assert len(runs) == 2


# --- 3.2 ask -----------------------------------------------------------------------------


def asking(answers: list[Any], *, expires_at: datetime | None = None) -> Any:
    async def execute(args: Args, ctx: Any) -> Any:
        try:
            answer = await ctx.step.ask(
                "approve", message=f"Approve order {args.order_id}?", schema=Approval, expires_at=expires_at
            )
        except AskExpired as exc:
            answers.append(exc)
            return {"expired": True}
        answers.append(answer)
        return {"approved": answer.approved}

    return execute


async def test_s3_2_ask_records_question_and_send_returns_waiting(host, log, clock):
    expires = datetime.fromtimestamp(clock.now() + 600, tz=UTC)
    session = await host.open(harness_of(asking([], expires_at=expires)), session_id=SID)
    result = await session.send("go", input_id="in-1")
    assert result.outcome == "waiting" and result.input_id == "in-1"
    [ask] = result.waiting
    assert (ask.tool_call_id, ask.name, ask.message) == ("c1", "approve", "Approve order 42?")
    assert ask.schema == Approval.model_json_schema()
    assert ask.expires_at == pytest.approx(expires.timestamp())
    [opened] = await entries(log, SID, "harness.ask.opened")
    assert opened["name"] == "approve" and opened["message"] == "Approve order 42?"
    assert opened["schema"] == Approval.model_json_schema()
    assert opened["expires_at"] == round(expires.timestamp() * 1000)


async def test_s3_2_invalid_answer_rejected_tool_keeps_waiting_valid_answer_logged(host, log):
    answers: list[Any] = []
    session = await host.open(harness_of(asking(answers)), session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "waiting"
    with pytest.raises(InvalidAnswer) as bad:
        await session.answer("c1", "approve", {"approved": "maybe"})
    assert "approved" in str(bad.value) and bad.value.reason == "invalid_answer"
    with pytest.raises(InvalidAnswer) as unknown:
        await session.answer("c1", "nope", {"approved": True})
    assert unknown.value.reason == "no_open_ask"
    assert answers == [] and await entries(log, SID, "harness.ask.answered") == []

    result = await session.answer("c1", "approve", {"approved": True, "note": "fine"})
    assert result is not None and result.outcome == "completed" and result.input_id == "in-1"
    assert answers == [Approval(approved=True, note="fine")]
    [answered] = await entries(log, SID, "harness.ask.answered")
    assert answered["value"] == {"approved": True, "note": "fine"}
    [tool_result] = await entries(log, SID, "harness.tool.result")
    assert tool_result["content"] == {"approved": True}


async def test_s3_2_an_answer_may_be_an_instance_of_the_asks_own_model(host, log):
    """``session.answer(..., Approval(approved=True))``: the ask's schema built by the
    person's code was refused ("a pydantic model: return model.model_dump(mode='json')");
    it is taken as its JSON (by ``HarnessClient.answer`` too)."""
    answers: list[Any] = []
    session = await host.open(harness_of(asking(answers)), session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "waiting"
    result = await session.answer("c1", "approve", Approval(approved=True, note="fine"))
    assert result is not None and result.outcome == "completed"
    assert answers == [Approval(approved=True, note="fine")]
    [answered] = await entries(log, SID, "harness.ask.answered")
    assert answered["value"] == {"approved": True, "note": "fine"}
    async with HarnessClient(log=log) as client:
        receipt = await client.answer(SID, "c9", "approve", Approval(approved=False))
    [sent] = [e.record for e in await log.read(SID) if e.seq == receipt.position]
    assert sent.value == {"approved": False, "note": ""}


async def test_s3_2_answer_produced_into_the_log_is_taken_by_the_owner(host, log, other_log):
    answers: list[Any] = []
    session = await host.open(harness_of(asking(answers)), session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "waiting"

    producer = other_log()  # any producer of the session's log, no ownership
    await producer.submit(InputAnswer(SID, 0, "ans-bad", "c1", "approve", {"approved": 3}))
    await producer.submit(InputAnswer(SID, 0, "ans-ok", "c1", "approve", {"approved": False}))
    await eventually(lambda: "in-1" in session.state.inputs and session.state.inputs["in-1"].settled)
    assert answers == [Approval(approved=False)]
    settled = {e["input_id"]: e for e in await entries(log, SID, "harness.input.settled")}
    assert settled["ans-bad"]["outcome"] == "rejected" and settled["ans-bad"]["code"] == "invalid_answer"
    assert settled["ans-ok"]["outcome"] == "completed"
    assert (await session.send("go", input_id="in-1")).outcome == "completed"


async def test_s3_2_answer_through_another_server(hosts, log, other_log):
    answers: list[Any] = []
    h = harness_of(asking(answers))
    owner = await hosts(owner_id="a").open(h, session_id=SID)
    assert (await owner.send("go", input_id="in-1")).outcome == "waiting"

    other = await hosts(log_=other_log(), owner_id="b").open(h, session_id=SID)
    with pytest.raises(InvalidAnswer):
        await other.answer("c1", "approve", {"approved": "no"})  # validated from the log's schema
    result = await other.answer("c1", "approve", {"approved": True})  # the owner takes it
    assert result is not None and result.outcome == "completed"
    await eventually(lambda: owner.state.inputs["in-1"].settled)
    assert answers == [Approval(approved=True)]


async def test_s3_2_after_crash_ask_returns_logged_answer_without_asking_again(hosts, log, clock):
    answers: list[Any] = []
    release = asyncio.Event()

    async def execute(args: Args, ctx: Any) -> Any:
        answer = await ctx.step.ask("approve", message="ok?", schema=Approval)
        answers.append(answer)
        await release.wait()  # dies after the answer, before the result
        return {"approved": answer.approved}

    h = harness_of(execute)
    first = await hosts(owner_id="a").open(h, session_id=SID)
    assert (await first.send("go", input_id="in-1")).outcome == "waiting"
    answering = asyncio.create_task(first.answer("c1", "approve", {"approved": True}))
    await eventually(lambda: answers)
    await crash(first)
    answering.cancel()
    clock.advance(LEASE.total_seconds() + 1)
    release.set()

    second = await hosts(owner_id="b").open(h, session_id=SID)
    [result] = await second.recover()
    assert result.outcome == "completed"
    assert answers == [Approval(approved=True)] * 2
    assert len(await entries(log, SID, "harness.ask.opened")) == 1
    assert len(await entries(log, SID, "harness.ask.answered")) == 1


async def test_s3_2_waiting_ask_survives_a_crash_and_is_answered_later(hosts, log, clock):
    answers: list[Any] = []
    h = harness_of(asking(answers))
    first = await hosts(owner_id="a").open(h, session_id=SID)
    assert (await first.send("go", input_id="in-1")).outcome == "waiting"
    await crash(first)
    clock.advance(LEASE.total_seconds() + 1)

    second = await hosts(owner_id="b").open(h, session_id=SID)
    [waiting] = await second.recover()
    assert waiting.outcome == "waiting" and [a.name for a in waiting.waiting] == ["approve"]
    result = await second.answer("c1", "approve", {"approved": True})
    assert result is not None and result.outcome == "completed"
    assert len(await entries(log, SID, "harness.ask.opened")) == 1


# --- 3.3 expiry --------------------------------------------------------------------------


async def test_s3_3_ask_past_expiry_raises_in_tool_and_later_answer_rejected(host, log, clock):
    answers: list[Any] = []
    expires = datetime.fromtimestamp(clock.now() + 60, tz=UTC)
    session = await host.open(harness_of(asking(answers, expires_at=expires)), session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "waiting"
    clock.advance(61)
    await eventually(lambda: session.state.inputs["in-1"].settled)
    assert len(answers) == 1 and isinstance(answers[0], AskExpired)
    assert answers[0].name == "approve"
    with pytest.raises(InvalidAnswer):
        await session.answer("c1", "approve", {"approved": True})
    assert await entries(log, SID, "harness.ask.answered") == []
    assert (await session.send("go", input_id="in-1")).outcome == "completed"


async def test_s3_3_answer_after_expiry_rejected_even_before_tool_noticed(hosts, log, clock):
    expires = datetime.fromtimestamp(clock.now() + 60, tz=UTC)
    h = harness_of(asking([], expires_at=expires))
    owner = await hosts(owner_id="a").open(h, session_id=SID)
    assert (await owner.send("go", input_id="in-1")).outcome == "waiting"
    await crash(owner)  # nobody is there to notice the expiry
    clock.advance(120)
    other = await hosts(owner_id="b").open(h, session_id=SID)
    with pytest.raises(InvalidAnswer) as late:
        await other.answer("c1", "approve", {"approved": True})
    assert late.value.reason == "ask_expired"


async def test_s3_3_expired_ask_raises_at_once_on_rerun(hosts, log, clock):
    answers: list[Any] = []
    expires = datetime.fromtimestamp(clock.now() + 60, tz=UTC)
    h = harness_of(asking(answers, expires_at=expires))
    first = await hosts(owner_id="a").open(h, session_id=SID)
    assert (await first.send("go", input_id="in-1")).outcome == "waiting"
    await crash(first)
    clock.advance(120)
    second = await hosts(owner_id="b").open(h, session_id=SID)
    [result] = await second.recover()
    assert result.outcome == "completed"
    assert len(answers) == 1 and isinstance(answers[0], AskExpired)


# --- 3.4 names ---------------------------------------------------------------------------


async def test_s3_4_sleep_and_ask_names_share_the_step_namespace(host, log):
    caught: list[str] = []

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.do("x", lambda: 1)
        try:
            await ctx.step.sleep("x", timedelta(seconds=0))
        except DuplicateStepName:
            caught.append("sleep")
        try:
            await ctx.step.ask("x", message="?", schema=Approval)
        except DuplicateStepName:
            caught.append("ask")
        await ctx.step.sleep("nap", timedelta(seconds=0))
        try:
            await ctx.step.sleep("nap", timedelta(seconds=0))
        except DuplicateStepName:
            caught.append("sleep-twice")
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert caught == ["sleep", "ask", "sleep-twice"]
    assert len(await entries(log, SID, "harness.sleep.scheduled")) == 1
    assert await entries(log, SID, "harness.ask.opened") == []


# --- naive datetimes ----------------------------------------------------------------------


async def test_s3_naive_datetimes_are_refused_naming_the_argument(host, log, clock):
    """A datetime without a timezone is ambiguous (``datetime.now()`` in New York is not
    UTC): ``until`` and ``expires_at`` refuse it with a TypeError, before anything is logged."""
    caught: dict[str, BaseException] = {}

    async def execute(args: Args, ctx: Any) -> Any:
        try:
            await ctx.step.sleep("nap", until=datetime(2030, 1, 1))
        except TypeError as exc:
            caught["until"] = exc
        try:
            await ctx.step.ask("ok?", message="approve?", schema=Approval, expires_at=datetime(2030, 1, 1))
        except TypeError as exc:
            caught["expires_at"] = exc
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert set(caught) == {"until", "expires_at"}
    for argument, exc in caught.items():
        assert argument in str(exc) and "timezone" in str(exc)
    assert await entries(log, SID, "harness.sleep.scheduled") == []
    assert await entries(log, SID, "harness.ask.opened") == []


class Unbounded(BaseModel):
    limit: float = float("inf")  # its JSON schema's default is Infinity: no JSON, no log


async def test_s3_2_an_ask_the_log_cannot_hold_is_a_step_value_error_naming_it(host, log):
    """A message that is not text, or holds a lone surrogate, or a schema whose JSON schema
    is not JSON: a StepValueError naming the ask and the bad part, before anything is logged
    (it was a CodecError from deep in the codec: 'must be string on field message')."""
    caught: dict[str, BaseException] = {}

    async def execute(args: Args, ctx: Any) -> Any:
        for case, kwargs in {
            "int": {"message": 42, "schema": Approval},
            "surrogate": {"message": "ok\ud800?", "schema": Approval},
            "schema": {"message": "how far?", "schema": Unbounded},
        }.items():
            try:
                await ctx.step.ask(f"q-{case}", **kwargs)
            except StepValueError as exc:
                caught[case] = exc
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert set(caught) == {"int", "surrogate", "schema"}
    assert "the message of ask 'q-int' must be a string, not int" in str(caught["int"])
    assert "the message of ask 'q-surrogate'" in str(caught["surrogate"]) and "surrogate" in str(caught["surrogate"])
    assert "the JSON schema of ask 'q-schema'" in str(caught["schema"])
    assert "$.properties.limit.default is inf" in str(caught["schema"])
    assert all(exc.step_name == f"q-{case}" for case, exc in caught.items())
    assert await entries(log, SID, "harness.ask.opened") == []


# --- answers judged by the tool's own model (issue 7) -------------------------------------


async def test_s3_2_answer_is_validated_by_the_asks_pydantic_model_and_a_refused_one_leaves_it_open(
    hosts, log, other_log
):
    from pydantic import field_validator

    class Refund(BaseModel):
        amount: int

        @field_validator("amount")
        @classmethod
        def positive(cls, v: int) -> int:
            if v <= 0:
                raise ValueError("must be positive")
            return v

    got: list[int] = []

    async def execute(args: Args, ctx: Any) -> Any:
        refund = await ctx.step.ask("refund", message="how much?", schema=Refund)
        got.append(refund.amount)
        return refund.amount

    h = harness_of(execute)
    owner = await hosts(owner_id="a").open(h, session_id=SID)
    assert (await owner.send("go", input_id="in-1")).outcome == "waiting"
    with pytest.raises(InvalidAnswer) as refused:
        await owner.answer("c1", "refund", {"amount": -5})  # fits the JSON schema, not the model
    assert refused.value.reason == "invalid_answer"
    # One line built from pydantic's errors (it was pydantic's multi-line text, with its URL).
    reason = "the answer does not fit the ask's model: amount: Value error, must be positive"
    assert str(refused.value) == reason
    assert await entries(log, SID, "harness.ask.answered") == []

    # Another server without the tool's code checks the JSON schema only; the owner,
    # which runs the tool, refuses it and the ask stays open.
    other = await hosts(log_=other_log(), owner_id="b").open(h, session_id=SID)
    with pytest.raises(InvalidAnswer):
        await other.answer("c1", "refund", {"amount": 0}, input_id="a-2")
    assert await entries(log, SID, "harness.ask.answered") == []
    settled = {s["input_id"]: s for s in await entries(log, SID, "harness.input.settled")}
    assert settled["a-2"]["outcome"] == "rejected" and settled["a-2"]["code"] == "invalid_answer"
    assert settled["a-2"]["reason"] == reason  # what `harness show` and the console show

    result = await owner.answer("c1", "refund", {"amount": 7}, input_id="a-3")
    assert result is not None and result.outcome == "completed"
    assert got == [7]


async def test_s3_2_a_second_answer_with_another_value_says_the_ask_has_its_answer(host, log):
    """A user who answers an ask twice (no input id of theirs) is told the ask has its
    answer (``already_answered``, as the gateway says), not that an input id they never
    gave was used with another payload; the first answer stays the only one."""
    answers: list[Any] = []
    session = await host.open(harness_of(asking(answers)), session_id=SID)
    assert (await session.send("go", input_id="in-1")).outcome == "waiting"
    first = await session.answer("c1", "approve", {"approved": True})
    assert first is not None and first.outcome == "completed"
    with pytest.raises(InvalidAnswer) as again:
        await session.answer("c1", "approve", {"approved": False})
    assert again.value.reason == "already_answered"
    assert "has its answer" in str(again.value) and "input id" not in str(again.value)
    # The same answer again has no second effect and says how the turn went.
    same = await session.answer("c1", "approve", {"approved": True})
    assert same is not None and same.outcome == "completed"
    assert answers == [Approval(approved=True)]
    assert len(await entries(log, SID, "harness.ask.answered")) == 1


class StrictApproval(BaseModel):
    """Its JSON schema takes any boolean; the model itself only ``True`` with a note."""

    approved: bool
    note: str = ""

    @pydantic.model_validator(mode="after")
    def _noted(self) -> StrictApproval:
        if not self.note:
            raise ValueError("say why in a note")
        return self


async def test_s3_2_an_answer_refused_by_the_owner_can_be_corrected_through_a_client(hosts, log, other_log):
    """``HarnessClient.answer`` cannot judge an answer (it holds no schema): a wrong one is
    written, and the owner refuses it. Its default input id was ``answer:<call>:<ask>``,
    so the corrected answer came with the same id and another payload: refused as an
    ``input_conflict``, for good (the ask could only be answered with an input id of
    one's own). The default id now depends on the value: resending the same answer is
    still one input."""
    from harness import HarnessClient

    answers: list[Any] = []
    owner = await hosts(owner_id="a").open(harness_of(asking(answers)), session_id=SID)
    assert (await owner.send("go", input_id="in-1")).outcome == "waiting"
    client = HarnessClient(log=other_log())
    try:
        bad = await client.answer(SID, "c1", "approve", {"approved": "maybe"})
        refused = await asyncio.wait_for(client.wait_settled(SID, bad), 10)
        assert refused.outcome == "rejected" and refused.code == "invalid_answer"
        good = await client.answer(SID, "c1", "approve", {"approved": True})
        again = await client.answer(SID, "c1", "approve", {"approved": True})  # (a resend: one input)
        assert again.input_id == good.input_id != bad.input_id
        assert (await asyncio.wait_for(client.wait_settled(SID, good), 10)).outcome == "completed"
    finally:
        await client.close()
    await eventually(lambda: owner.state.inputs["in-1"].settled)
    assert answers == [Approval(approved=True)]


async def test_s3_2_an_answer_refused_by_the_owners_model_can_be_corrected_through_another_server(
    hosts, log, other_log
):
    """Another server judges an answer by the ask's JSON schema only; the owner's pydantic
    model may still refuse it (a validator). The corrected answer then met the first one's
    default input id: ``InvalidAnswer`` for good."""
    answers: list[Any] = []

    async def execute(args: Args, ctx: Any) -> Any:
        answer = await ctx.step.ask("approve", message="ok?", schema=StrictApproval)
        answers.append(answer)
        return {"approved": answer.approved}

    owner = await hosts(owner_id="a").open(harness_of(execute), session_id=SID)
    assert (await owner.send("go", input_id="in-1")).outcome == "waiting"
    other = await hosts(log_=other_log(), owner_id="b").open(harness_of(execute), session_id=SID)
    with pytest.raises(InvalidAnswer, match="say why in a note"):
        await other.answer("c1", "approve", {"approved": True})  # the schema takes it, the owner not
    result = await other.answer("c1", "approve", {"approved": True, "note": "fine"})
    assert result is not None and result.outcome == "completed"
    assert answers == [StrictApproval(approved=True, note="fine")]
