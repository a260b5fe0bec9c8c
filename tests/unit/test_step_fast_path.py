"""The step's hot path (``DurableStep.do`` written out, ``SqliteWriter.append_now``)
keeps every rule of the slow one: what a fn is given, what a value may hold, what a
name may be, and that a wrapped writer sees every append."""

from __future__ import annotations

import asyncio
import functools
from datetime import timedelta
from typing import Any

import pytest

from harness import define_harness, durable_tool, tool_definition
from harness.errors import SecretInName, SecretInStepValue, StepError, StepValueError, StepValueTooLarge
from harness.records import StepResult

from .conftest import Args, call, entries, script

SID = "s-fast"
SECRET = "sk_live_0123456789abcdef"


def harness_of(execute: Any, *, durability: Any = None) -> Any:
    t = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    return define_harness(name="test/fast", model=script([call("c1", "work")], "done"), tools=[t], durability=durability)


async def run(host: Any, execute: Any, **open_kw: Any) -> Any:
    session = await host.open(harness_of(execute), session_id=SID, **open_kw)
    return await session.send("go")


async def test_async_fns_get_the_step_info_when_they_take_it_and_not_otherwise(host, log):
    got: list[Any] = []

    async def takes(info):  # type: ignore[no-untyped-def]
        return info.idempotency_key

    async def bare():  # type: ignore[no-untyped-def]
        return "bare"

    async def defaulted(x=1):  # type: ignore[no-untyped-def]
        return x

    @functools.wraps(takes)
    async def wrapped(*args):  # type: ignore[no-untyped-def]  # (its signature is the wrapped one's)
        return await takes(*args)

    async def execute(args: Args, ctx: Any) -> Any:
        got.append(await ctx.step.do("takes", takes))
        got.append(await ctx.step.do("bare", bare))
        got.append(await ctx.step.do("defaulted", defaulted))
        got.append(await ctx.step.do("wrapped", wrapped))
        got.append(await ctx.step.do("partial", functools.partial(takes)))
        return "ok"

    assert (await run(host, execute)).outcome == "completed"
    key = f"{log.namespace}/{SID}:c1:"
    assert got == [key + "takes", "bare", 1, key + "wrapped", key + "partial"]


async def test_a_plain_ascii_string_value_is_stored_and_returned_as_it_is_and_a_str_subclass_as_a_str(host, log):
    class Tag(str):
        pass

    got: list[Any] = []

    async def execute(args: Args, ctx: Any) -> Any:
        got.append(await ctx.step.do("plain", lambda: "x" * 10))
        got.append(await ctx.step.do("sub", lambda: Tag("t")))
        got.append(await ctx.step.do("unicode", lambda: "žluťoučký 🐎"))
        return "ok"

    assert (await run(host, execute)).outcome == "completed"
    assert got == ["x" * 10, "t", "žluťoučký 🐎"]
    assert type(got[1]) is str
    values = [e["value"] for e in await entries(log, SID, "harness.step.result")]
    assert values == ["x" * 10, "t", "žluťoučký 🐎"]


async def test_the_fast_path_still_refuses_what_the_log_must_not_hold(host, log):
    errors: list[type[BaseException]] = []

    async def execute(args: Args, ctx: Any) -> Any:
        for name, fn in [
            ("secret", lambda: f"token {SECRET}"),  # an ASCII string: no copy walk, still scanned
            ("surrogate", lambda: "bad \ud800"),
            ("big", lambda: "y" * 300),
        ]:
            try:
                await ctx.step.do(name, fn)
            except StepError as exc:
                errors.append(type(exc))
        for name in ["", f"charge:{SECRET}", "bad\ud800"]:
            try:
                await ctx.step.do(name, lambda: 1)
            except (StepError, SecretInName) as exc:
                errors.append(type(exc))
        return "ok"

    session = await host.open(
        define_harness(
            name="test/fast",
            model=script([call("c1", "work")], "done"),
            tools=[durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)],
            durability={"step_value_limit": 200},
        ),
        session_id=SID,
        secrets={"key": SECRET},
    )
    assert (await session.send("go")).outcome == "completed"
    assert errors == [SecretInStepValue, StepValueError, StepValueTooLarge, StepError, SecretInName, StepValueError]
    assert await entries(log, SID, "harness.step.result") == []


class _Wrapper:
    """A writer wrapper that passes everything on to the writer it wraps, catching ``append``."""

    def __init__(self, inner: Any, seen: list[str]) -> None:
        self._inner, self._seen = inner, seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append(self, records: Any) -> Any:
        self._seen.extend(type(r).__name__ for r in records)
        return await self._inner.append(records)


class _WrappingLog:
    def __init__(self, inner: Any, seen: list[str]) -> None:
        self._inner, self._seen = inner, seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def claim(self, session_id: str, **kw: Any) -> Any:
        return _Wrapper(await self._inner.claim(session_id, **kw), self._seen)


async def test_a_wrapped_writer_sees_every_append_even_where_the_writer_commits_at_once(hosts, log):
    seen: list[str] = []

    async def execute(args: Args, ctx: Any) -> Any:
        for n in range(3):
            await ctx.step.do(f"s{n}", lambda n=n: n)
        return "ok"

    session = await hosts(log_=_WrappingLog(log, seen)).open(harness_of(execute), session_id=SID)
    assert (await session.send("go")).outcome == "completed"
    assert seen.count("StepResult") == 3
    assert len(await entries(log, SID, "harness.step.result")) == 3


@pytest.mark.parametrize("logs", ["sqlite"], indirect=True)
async def test_sqlite_commits_a_lone_step_at_once_and_a_grouped_one_encodes_its_records_once(host, log, monkeypatch):
    codec = log._codec  # type: ignore[attr-defined]
    encoded: list[str] = []
    real = codec.encode

    def counting(record: Any) -> bytes:
        encoded.append(type(record).__name__)
        return real(record)

    monkeypatch.setattr(codec, "encode", counting)
    writer = await log.claim("a", owner="w", lease=timedelta(seconds=30))
    other = await log.claim("b", owner="w", lease=timedelta(seconds=30))

    def rec(sid: str, n: int) -> StepResult:
        return StepResult(sid, 1, "c1", f"s{n}", n)

    before = log.stats.transactions  # type: ignore[attr-defined]
    [seq] = writer.append_now([rec("a", 0)])  # alone: committed on return, no awaiting
    assert log.stats.transactions == before + 1  # type: ignore[attr-defined]
    assert [(e.seq, e.record) for e in await log.read("a")] == [(seq, rec("a", 0))]

    encoded.clear()

    async def grouped(w: Any, sid: str) -> Any:
        await asyncio.sleep(0)
        return await w.append([rec(sid, 1), rec(sid, 2)])

    results = await asyncio.gather(grouped(writer, "a"), grouped(other, "b"))
    assert [len(r) for r in results] == [2, 2]
    assert encoded == ["StepResult"] * 4  # each record once, though the first try was not alone
    assert log.stats.transactions == before + 2  # type: ignore[attr-defined]  # (the two shared one)
