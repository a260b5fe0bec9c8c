"""SPEC 2: durable steps (``ctx.step.do``), on the memory and SQLite logs."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import enum
import sys
from typing import Any

import pytest
from pydantic import BaseModel

from harness import Durability, define_harness, durable_tool, tool_definition
from harness.errors import (
    DuplicateStepName,
    NoToolCallError,
    SecretInStepValue,
    StepValueError,
    StepValueTooLarge,
)

from .conftest import LEASE, Args, Died, DyingLog, call, crash, entries, raw_bytes, script

SID = "s-1"


def harness_of(execute: Any, *, model: Any = None, durability: Any = None, name: str = "work") -> Any:
    t = durable_tool(tool_definition(name=name, description="d", input_schema=Args), execute)
    return define_harness(
        name="test/steps",
        model=model or script([call("c1", name)], "done"),
        tools=[t],
        durability=durability,
    )


async def test_s2_1_step_value_is_committed_before_do_returns(host, log):
    seen: list[Any] = []

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.do("charge", lambda: {"id": "ch_1"})
        seen.extend(await entries(log, SID, "harness.step.result"))
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    result = await session.send("go")
    assert result.outcome == "completed"
    assert [(e["tool_call_id"], e["name"], e["value"]) for e in seen] == [("c1", "charge", {"id": "ch_1"})]


async def test_s2_2_do_returns_the_json_copy_tuple_becomes_list(host, log):
    got: list[Any] = []
    original = {"pair": (1, 2), "nested": [("a", 1.5)]}

    async def execute(args: Args, ctx: Any) -> Any:
        value = await ctx.step.do("v", lambda: original)
        got.append(value)
        value["pair"].append(3)  # a copy: the caller's object and the log are not touched
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert got == [{"pair": [1, 2, 3], "nested": [["a", 1.5]]}]
    assert original["pair"] == (1, 2)
    assert (await entries(log, SID, "harness.step.result"))[0]["value"] == {"pair": [1, 2], "nested": [["a", 1.5]]}


async def test_s2_3_finished_step_returns_stored_value_without_calling_fn(hosts, log, clock, provider):
    release = asyncio.Event()
    got: list[Any] = []

    async def execute(args: Args, ctx: Any) -> Any:
        payment = await ctx.step.do(
            f"charge:{args.order_id}",
            lambda info: provider.charge(args.order_id, idempotency_key=info.idempotency_key),
        )
        got.append(payment)
        await release.wait()  # the first process dies here
        return {"charge_id": payment["id"]}

    h = harness_of(execute)
    first = await hosts(owner_id="a").open(h, session_id=SID)
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    while not got:
        await asyncio.sleep(0)
    await crash(first)
    task.cancel()
    clock.advance(LEASE.total_seconds() + 1)
    release.set()

    second = await hosts(owner_id="b").open(h, session_id=SID)
    [result] = await second.recover()
    assert result.outcome == "completed"
    assert len(provider.calls) == 1  # fn ran once; the rerun got the stored value
    assert got == [{"id": "ch_1", "order": "42"}, {"id": "ch_1", "order": "42"}]
    [tool_result] = await entries(log, SID, "harness.tool.result")
    assert tool_result["content"] == {"charge_id": "ch_1"}


async def test_s2_4_idempotency_key_is_log_id_call_id_step_name(host, log):
    keys: list[str] = []

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.do("charge:42", lambda info: keys.append(info.idempotency_key) or 1)
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    await session.send("go")
    assert keys == [f"{log.namespace}/{SID}:c1:charge:42"]


async def test_s2_5_fn_runs_again_with_same_key_when_value_was_not_committed(hosts, log, clock, provider):
    keys: list[str] = []

    def charge(info: Any) -> Any:
        keys.append(info.idempotency_key)
        return {"id": f"ch_{len(keys)}"}

    async def execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("charge:42", charge)

    h = harness_of(execute)
    dying = DyingLog(log, lambda batch: any(r.TYPE == "harness.step.result" for r in batch))
    first = await hosts(log_=dying, owner_id="a").open(h, session_id=SID)
    with pytest.raises(Died):
        await first.send("go", input_id="in-1")
    assert dying.died
    await crash(first)
    assert await entries(log, SID, "harness.step.result") == []
    clock.advance(LEASE.total_seconds() + 1)

    second = await hosts(owner_id="b").open(h, session_id=SID)
    [result] = await second.recover()
    assert result.outcome == "completed"
    assert len(keys) == 2 and keys[0] == keys[1] == f"{log.namespace}/{SID}:c1:charge:42"
    [step] = await entries(log, SID, "harness.step.result")
    assert step["value"] == {"id": "ch_2"}


async def test_s2_6_duplicate_step_name_raises(host, log):
    caught: list[BaseException] = []

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.do("same", lambda: 1)
        try:
            await ctx.step.do("same", lambda: 2)
        except DuplicateStepName as exc:
            caught.append(exc)
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert len(caught) == 1 and caught[0].step_name == "same"
    assert [e["value"] for e in await entries(log, SID, "harness.step.result")] == [1]


class Model_(BaseModel):
    x: int = 1


class Thing:
    pass


BAD_VALUES: list[tuple[str, Any, str]] = [
    ("datetime", {"at": dt.datetime(2024, 1, 1)}, "$.at"),
    ("set", [1, {2}], "$[1]"),
    ("bytes", {"b": [b"x"]}, "$.b[0]"),
    ("decimal", decimal.Decimal("1.5"), "$"),
    ("instance", {"o": Thing()}, "$.o"),
    ("pydantic", {"m": Model_()}, "$.m"),
    ("nan", {"n": float("nan")}, "$.n"),
    ("inf", [float("inf")], "$[0]"),
    ("int-key", {"ok": {1: "x"}}, "$.ok"),
]


async def test_s2_7_non_json_value_raises_step_value_error_naming_path(host, log):
    caught: dict[str, BaseException] = {}

    async def execute(args: Args, ctx: Any) -> Any:
        for name, value, _ in BAD_VALUES:
            try:
                await ctx.step.do(name, lambda value=value: value)
            except StepValueError as exc:
                caught[name] = exc
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert set(caught) == {n for n, _, _ in BAD_VALUES}
    for name, _, path in BAD_VALUES:
        exc = caught[name]
        assert isinstance(exc, TypeError)
        assert exc.path == path, name
        assert path in str(exc)
    assert await entries(log, SID, "harness.step.result") == []


async def test_s2_7_non_json_value_uncaught_fails_the_call_not_the_turn(host, log):
    async def execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("when", lambda: dt.datetime(2024, 1, 1))

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["is_error"] and result["code"] == "tool_failed"
    assert "datetime" in result["content"]["message"]


async def test_s2_8_value_over_default_limit_raises_too_large_with_hint(host, log):
    caught: list[StepValueTooLarge] = []

    async def execute(args: Args, ctx: Any) -> Any:
        await ctx.step.do("fits", lambda: "x" * (200 * 1024))
        try:
            await ctx.step.do("big", lambda: "x" * (257 * 1024))
        except StepValueTooLarge as exc:
            caught.append(exc)
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [exc] = caught
    assert exc.limit == 256 * 1024 and exc.size > exc.limit
    assert "store the data elsewhere" in str(exc) and "id" in str(exc)
    assert [e["name"] for e in await entries(log, SID, "harness.step.result")] == ["fits"]


async def test_s2_8_limit_is_configurable(host, log):
    caught: list[StepValueTooLarge] = []

    async def execute(args: Args, ctx: Any) -> Any:
        try:
            await ctx.step.do("big", lambda: "x" * 200)
        except StepValueTooLarge as exc:
            caught.append(exc)
        return "ok"

    session = await host.open(
        harness_of(execute, durability=Durability(step_value_limit=100)), session_id=SID
    )
    await session.send("go")
    assert len(caught) == 1 and caught[0].limit == 100


SECRET = "sk_live_TOPSECRET_123"


async def test_s2_9_secret_in_step_value_raises_first_run_and_after_crash(hosts, log, logs, clock):
    caught: list[SecretInStepValue] = []
    release = asyncio.Event()

    async def execute(args: Args, ctx: Any) -> Any:
        for name, value in (
            ("in-string", {"auth": f"Bearer {SECRET}"}),
            ("in-key", {f"key-{SECRET}": 1}),
        ):
            try:
                await ctx.step.do(name, lambda value=value: value)
            except SecretInStepValue as exc:
                caught.append(exc)
        await release.wait()
        return "ok"

    h = harness_of(execute)
    first = await hosts(owner_id="a").open(h, session_id=SID, secrets={"stripe": SECRET})
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    while len(caught) < 2:
        await asyncio.sleep(0)
    await crash(first)
    task.cancel()
    clock.advance(LEASE.total_seconds() + 1)
    release.set()

    second = await hosts(owner_id="b").open(h, session_id=SID, secrets={"stripe": SECRET})
    [result] = await second.recover()
    assert result.outcome == "completed"
    assert len(caught) == 4  # both refused again on the run after the crash
    assert all(c.secret_name == "stripe" for c in caught)
    assert SECRET not in str(caught[0])
    assert await entries(log, SID, "harness.step.result") == []
    assert SECRET.encode() not in await raw_bytes(log, logs)


async def test_s2_10_fn_raising_reaches_tool_and_nothing_is_stored(hosts, log, clock):
    attempts: list[int] = []
    caught: list[BaseException] = []
    release = asyncio.Event()

    def flaky() -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("provider down")
        return "ok"

    async def execute(args: Args, ctx: Any) -> Any:
        try:
            value = await ctx.step.do("flaky", flaky)
        except ConnectionError as exc:
            caught.append(exc)
            await release.wait()  # the process dies while the tool handles the error
            raise
        return value

    h = harness_of(execute)
    first = await hosts(owner_id="a").open(h, session_id=SID)
    task = asyncio.create_task(first.send("go", input_id="in-1"))
    while not caught:
        await asyncio.sleep(0)
    assert await entries(log, SID, "harness.step.result") == []
    await crash(first)
    task.cancel()
    clock.advance(LEASE.total_seconds() + 1)
    release.set()

    second = await hosts(owner_id="b").open(h, session_id=SID)
    [result] = await second.recover()
    assert result.outcome == "completed"
    assert len(attempts) == 2  # the later run called fn again
    assert [e["value"] for e in await entries(log, SID, "harness.step.result")] == ["ok"]


async def test_s2_10_fn_raising_uncaught_is_a_tool_error(host, log):
    async def execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("boom", lambda: 1 / 0)

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["is_error"] and result["code"] == "tool_failed"
    assert result["content"]["type"] == "ZeroDivisionError"
    assert await entries(log, SID, "harness.step.result") == []


async def test_s2_11_step_do_outside_a_tool_call_raises(host, log):
    kept: list[Any] = []

    async def execute(args: Args, ctx: Any) -> Any:
        kept.append(ctx)
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    await session.send("go")
    before = await log.read(SID)
    with pytest.raises(NoToolCallError, match=r"^step\.do used outside a running tool call"):
        await kept[0].step.do("late", lambda: 1)
    assert len(await log.read(SID)) == len(before)


@pytest.mark.parametrize("sync", [False, True], ids=["async-tool", "sync-tool"])
async def test_s2_11_append_on_a_ctx_kept_after_its_tool_returned_raises(host, log, sync):
    kept: list[Any] = []

    def keep(args: Args, ctx: Any) -> Any:
        kept.append(ctx)
        ctx.append([{"type": "app.in_time"}])
        return "ok"

    async def keep_async(args: Args, ctx: Any) -> Any:
        return keep(args, ctx)

    session = await host.open(harness_of(keep if sync else keep_async), session_id=SID)
    await session.send("go")
    before = await log.read(SID)
    with pytest.raises(NoToolCallError, match=r"^ctx\.append used outside a running tool call") as refused:
        kept[0].append([{"type": "app.late"}])
    assert refused.value.tool_call_id == kept[0].tool_call_id and refused.value.session_id == SID
    assert len(await log.read(SID)) == len(before)
    assert await session.records() == [{"type": "app.in_time"}]


async def test_s2_11_sync_tool_steps_work_and_are_durable(host, log):
    def execute(args: Args, ctx: Any) -> Any:
        a = ctx.step.do("a", lambda: (1, 2))
        return {"a": a}

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["content"] == {"a": [1, 2]}
    assert [e["name"] for e in await entries(log, SID, "harness.step.result")] == ["a"]


@pytest.mark.parametrize("where", ["step", "tool"])
async def test_s2_10_sys_exit_in_sync_code_is_the_calls_error_not_the_end_of_the_process(host, log, where):
    """sys.exit() in a sync step fn or sync tool runs on a pool thread; handed to the loop it
    ended the whole process without a word (and each restart ran it again)."""

    def bad() -> Any:
        sys.exit(2)

    async def async_execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("a", bad)

    def sync_execute(args: Args, ctx: Any) -> Any:
        return bad()

    session = await host.open(harness_of(async_execute if where == "step" else sync_execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [result] = await entries(log, SID, "harness.tool.result")
    assert result["is_error"] and result["content"]["error"] == "tool_failed"
    assert "called sys.exit(2) on a harness thread" in result["content"]["message"]
    assert await entries(log, SID, "harness.step.result") == []


# --- slow synchronous code (issue 7) --------------------------------------------------------


@pytest.mark.parametrize("where", ["step", "tool"])
async def test_sync_code_blocking_longer_than_the_lease_runs_once_and_keeps_its_lease(
    hosts, log, other_log, clock, where
):
    """A sync step fn (or sync tool) runs on the host's thread pool, never on the event
    loop: while it blocks for longer than the lease, the lease is renewed, so another
    process cannot take the session over and run the side effect a second time."""
    import threading

    from harness.errors import SessionBusy

    loop = asyncio.get_running_loop()
    charges: list[str] = []
    takeover: list[BaseException | None] = []

    def lease_until() -> float:
        async def info() -> float:
            return (await log.lease_info(SID)).lease_until or 0.0

        return asyncio.run_coroutine_threadsafe(info(), loop).result(timeout=5)

    def charge() -> str:
        assert threading.current_thread() is not threading.main_thread()
        for _ in range(4):  # 4 x 10 s of fake time > the 30 s lease
            before = lease_until()
            loop.call_soon_threadsafe(clock.advance, 10)
            for _ in range(400):  # the lease is renewed meanwhile
                if lease_until() > before:
                    break
                threading.Event().wait(0.005)
        other = other_log()  # another process tries to take the session over

        async def claim() -> None:
            writer = await other.claim(SID, owner="b", lease=LEASE)
            await writer.release()

        try:
            asyncio.run(claim()) if other is not log else asyncio.run_coroutine_threadsafe(claim(), loop).result(5)
            takeover.append(None)
        except SessionBusy as exc:
            takeover.append(exc)
        charges.append("ch_1")
        return "ch_1"

    if where == "step":
        async def execute(args: Args, ctx: Any) -> Any:
            return await ctx.step.do("charge", charge)
        h = harness_of(execute)
    else:
        from harness import tool

        t = tool(tool_definition(name="work", description="d", input_schema=Args), lambda args: charge())
        h = define_harness(name="test/steps", model=script([call("c1", "work")], "done"), tools=[t])

    session = await hosts(owner_id="a").open(h, session_id=SID)
    result = await session.send("go", input_id="in-1")
    assert result.outcome == "completed" and session.failed is None
    assert charges == ["ch_1"]
    assert len(takeover) == 1 and isinstance(takeover[0], SessionBusy)


async def test_an_empty_or_surrogate_step_name_is_refused_with_the_right_article(host, log):
    seen: list[str] = []

    async def execute(args: Args, ctx: Any) -> Any:
        for make in (lambda: ctx.step.do("", lambda: 1), lambda: ctx.step.ask("", message="?", schema=Args),
                     lambda: ctx.step.do("x\ud800", lambda: 1)):
            try:
                await make()
            except Exception as exc:  # noqa: BLE001 - what each says
                seen.append(str(exc))
        return "ok"

    session = await host.open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert seen[0] == "a step name must be a non-empty string"
    assert seen[1] == "an ask name must be a non-empty string"
    assert seen[2].startswith("a step name at $ holds a lone surrogate")


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_s2_6_s2_10_a_step_whose_fn_raised_may_be_retried_under_its_name_with_the_same_key(host, log, kind):
    """A retry loop around a failing step (``for attempt ...: try: await step.do("charge",
    fn)``) raised DuplicateStepName at the second attempt, so the only way to retry in the
    run was a new name, hence a new idempotency key: a charge that went through before its
    error would be made again. A name whose step stored nothing (fn raised) is free again;
    every attempt gets the same key, as a run after a crash would; a name with a stored
    value stays taken."""
    keys: list[str] = []
    caught: list[BaseException] = []

    def flaky(info: Any) -> Any:
        keys.append(info.idempotency_key)
        if len(keys) < 3:
            raise ConnectionError("provider down")
        return {"charged": len(keys)}

    async def async_execute(args: Args, ctx: Any) -> Any:
        for _ in range(5):
            try:
                value = await ctx.step.do("charge", flaky)
                break
            except ConnectionError:
                continue
        try:
            await ctx.step.do("charge", flaky)
        except DuplicateStepName as exc:
            caught.append(exc)
        return value

    def sync_execute(args: Args, ctx: Any) -> Any:
        for _ in range(5):
            try:
                value = ctx.step.do("charge", flaky)
                break
            except ConnectionError:
                continue
        try:
            ctx.step.do("charge", flaky)
        except DuplicateStepName as exc:
            caught.append(exc)
        return value

    session = await host.open(harness_of(async_execute if kind == "async" else sync_execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert len(keys) == 3 and len(set(keys)) == 1
    assert len(caught) == 1  # (a stored step's name is not free)
    assert [e["value"] for e in await entries(log, SID, "harness.step.result")] == [{"charged": 3}]
    [result] = await entries(log, SID, "harness.tool.result")
    assert not result["is_error"] and result["content"] == {"charged": 3}


class _StepName(str, enum.Enum):  # noqa: UP042 - the common pre-3.11 form (a StrEnum's str() is its value already)
    CHARGE = "charge"


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_s2_4_a_step_named_by_a_str_enum_has_the_key_of_its_name_as_logged(host, log, kind):
    """A ``(str, Enum)`` member as a step name: the log held ``charge`` but the idempotency
    key was made of its format(), ``...:Step.CHARGE``; code that later names the step
    ``"charge"`` (the name in the log) got another key, and a provider would charge again.
    The name is its text everywhere."""
    keys: list[str] = []

    async def async_execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.do(_StepName.CHARGE, lambda info: keys.append(info.idempotency_key) or 1)

    def sync_execute(args: Args, ctx: Any) -> Any:
        return ctx.step.do(_StepName.CHARGE, lambda info: keys.append(info.idempotency_key) or 1)

    session = await host.open(harness_of(async_execute if kind == "async" else sync_execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    [stored] = await entries(log, SID, "harness.step.result")
    assert stored["name"] == "charge" and type(stored["name"]) is str
    assert len(keys) == 1 and keys[0].endswith(":c1:charge"), keys
