"""A parked session whose unreadable record IS an input's settlement (harness.input.settled).

A reader that skips the record sees the input's turn finished and the input never
settled. Before the fix the owner of the parked session wrote nothing for it: a client's
``wait_settled`` (and ``harness send``) waited for good. Now the owner settles it again
with its turn's own verdict (the driver writes ``turn.finished`` and the settlement in
one append, with the same outcome, code and error): one verdict for readers that skip
the record, and two that agree, the first standing, for readers of the repaired log.
"""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from harness import HarnessHost, define_harness, durable_tool, tool_definition
from harness.client import HarnessClient
from harness.clock import FakeClock
from harness.errors import CorruptRecord
from harness.log.sqlite import SqliteLog
from harness.records import (
    InputMessage,
    InputRecords,
    InputSettled,
    LogEntry,
    ModelResponseRecord,
    TurnFinished,
    TurnStarted,
)
from harness.replay import fold, parked_settlements
from harness.runtime.worker import Worker

from .conftest import Args, call, script

LEASE = timedelta(seconds=30)
POLL = timedelta(milliseconds=2)
S = "s"


class Shop:
    def __init__(self) -> None:
        self.charges: list[str] = []

    def harness(self) -> Any:
        async def checkout(args: Args, ctx: Any) -> Any:
            await ctx.step.do("charge", lambda: self.charges.append(ctx.session_id) or {"amount": 100})
            return "ok"

        t = durable_tool(tool_definition(name="checkout", description="d", input_schema=Args), checkout)
        return define_harness(name="shop", model=script([call("c1", "checkout")], "paid", "hello"), tools=[t])


def settlement_seq(path: Path, sid: str, input_id: str) -> int:
    with sqlite3.connect(path) as raw:
        rows = raw.execute(
            "SELECT seq, value FROM records WHERE session_id = ? AND type = 'harness.input.settled' ORDER BY seq",
            (sid,),
        ).fetchall()
    return next(seq for seq, value in rows if input_id.encode() in value)


def flip(path: Path, seq: int, old: bytes, new: bytes) -> None:
    """Change bytes of the row at ``seq`` (its checksum no longer matches: unreadable)."""
    with sqlite3.connect(path) as raw:
        (value,) = raw.execute("SELECT value FROM records WHERE seq = ?", (seq,)).fetchone()
        assert old in value
        raw.execute("UPDATE records SET value = ? WHERE seq = ?", (value.replace(old, new), seq))


async def settlements(log: SqliteLog, sid: str) -> list[tuple[str, str, str | None]]:
    """``sid``'s settlements, read past any unreadable record."""
    return [
        (e.record.input_id, e.record.outcome, e.record.code)
        for e in await log.scan(sid)
        if isinstance(e, LogEntry) and isinstance(e.record, InputSettled)
    ]


async def with_worker(log: SqliteLog, shop: Shop, clock: FakeClock, until: Any, *, linger: float = 0.0) -> Any:
    worker = Worker(log=log, harnesses=[shop.harness()], clock=clock, lease=LEASE, poll_interval=POLL)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:
        got = await asyncio.wait_for(until, 30)
        await asyncio.sleep(linger)  # the worker runs on: nothing more may come
        assert worker.stats.parked_sessions in (0, 1)
        return got
    finally:
        stop.set()
        await run


async def test_a_finished_turns_unreadable_settlement_is_settled_again_with_its_turns_verdict(tmp_path: Path):
    clock = FakeClock()
    path = tmp_path / "shop.db"
    shop = Shop()
    log = SqliteLog(path, clock=clock.now)
    async with HarnessHost(log=log, clock=clock, lease=LEASE, poll_interval=POLL) as host:
        session = await host.open(shop.harness(), session_id="bad")
        assert (await session.send("check out", input_id="in-1")).outcome == "completed"
        await session.close()
    bad_seq = settlement_seq(path, "bad", "in-1")
    flip(path, bad_seq, b"completed", b"complete!")  # e.g. a disk's changed byte

    # An in-process handle never drives past it: its sender gets the error, not a wait.
    async with HarnessHost(log=log, clock=clock, lease=LEASE, poll_interval=POLL) as host:
        with pytest.raises(CorruptRecord):
            again = await host.open(shop.harness(), session_id="bad")
            await again.send("check out", input_id="in-1")

    # A worker parks the session and gives the sender its verdict: the one its turn logged.
    client = HarnessClient(log=log)
    settled = await with_worker(log, shop, clock, client.wait_settled("bad", "in-1"), linger=0.1)
    assert (settled.outcome, settled.code, settled.reason) == ("completed", None, None)
    assert await settlements(log, "bad") == [("in-1", "completed", None)]  # once
    assert shop.charges == ["bad"]
    # A restarted worker writes nothing more (the session is still parked, in-1 settled).
    late = await client.send("bad", "hello?", input_id="in-2")
    refused = await with_worker(log, shop, clock, client.wait_settled("bad", late), linger=0.1)
    assert (refused.outcome, refused.code) == ("rejected", "session_unreadable")
    assert await settlements(log, "bad") == [("in-1", "completed", None), ("in-2", "rejected", "session_unreadable")]

    # Repaired, the log holds two settlements of in-1 that agree: the first stands.
    flip(path, bad_seq, b"complete!", b"completed")
    entries = await log.read("bad")
    state = fold("bad", entries)
    first = next(e for e in entries if isinstance(e.record, InputSettled) and e.record.input_id == "in-1")
    assert first.seq == bad_seq and state.inputs["in-1"].settled == first.record
    assert [(s.input_id, s.outcome) for s in (e.record for e in entries) if isinstance(s, InputSettled)] == [
        ("in-1", "completed"), ("in-1", "completed"), ("in-2", "rejected"),
    ]
    assert await client.wait_settled("bad", "in-1") == first.record
    # ... and the session goes on, running nothing of turn 1 again.
    receipt = await client.send("bad", "thanks", input_id="in-3")
    done = await with_worker(log, shop, clock, client.wait_settled("bad", receipt))
    assert (done.outcome, done.code) == ("completed", None)
    assert shop.charges == ["bad"]
    finished = [e.record for e in await log.read("bad") if isinstance(e.record, TurnFinished)]
    assert [(f.input_id, f.outcome) for f in finished] == [("in-1", "completed"), ("in-3", "completed")]
    await client.close()
    await log.close()


async def test_an_app_records_inputs_unreadable_settlement_is_refused_and_the_repaired_first_one_stands(
    tmp_path: Path,
):
    """Already so before the fix (the input looks waiting): refused; after a repair the
    first settlement stands and its records land once."""
    clock = FakeClock()
    path = tmp_path / "shop.db"
    shop = Shop()
    log = SqliteLog(path, clock=clock.now)
    client = HarnessClient(log=log)
    receipt = await client.append_records("bad", [{"type": "app.note", "n": 1}], input_id="rec-1")
    async with HarnessHost(log=log, clock=clock, lease=LEASE, poll_interval=POLL) as host:
        session = await host.open(shop.harness(), session_id="bad")
        assert (await session.send("check out", input_id="in-1")).outcome == "completed"
        await session.close()
    assert (await client.wait_settled("bad", receipt)).outcome == "completed"
    bad_seq = settlement_seq(path, "bad", "rec-1")
    flip(path, bad_seq, b"completed", b"complete!")

    refused = await with_worker(log, shop, clock, client.wait_settled("bad", "rec-1"), linger=0.1)
    assert (refused.outcome, refused.code) == ("rejected", "session_unreadable")
    assert [s for s in await settlements(log, "bad") if s[0] == "rec-1"] == [("rec-1", "rejected", "session_unreadable")]

    flip(path, bad_seq, b"complete!", b"completed")
    state = fold("bad", await log.read("bad"))
    assert state.inputs["rec-1"].settled.outcome == "completed"  # the first in log order
    assert [a.body for a in state.app_records] == [{"type": "app.note", "n": 1}]
    assert state.anomalies >= 1
    await client.close()
    await log.close()


# -- the pure rule ---------------------------------------------------------------------------------


def _turn(input_id: str, n: int, finished: TurnFinished | None, settled: InputSettled | None) -> list[Any]:
    records: list[Any] = [
        InputMessage(S, 0, input_id, "go", "shop"),
        TurnStarted(S, 0, input_id, n),
        ModelResponseRecord(S, 0, n, 0, "done", ()),
    ]
    return records + [r for r in (finished, settled) if r is not None]


def _verdicts(*records: Any) -> list[tuple[str, str, str | None, str | None]]:
    state = fold(S, [LogEntry(i + 1, r) for i, r in enumerate(records)])
    return [(r.input_id, r.outcome, r.code, r.reason) for _, r in parked_settlements(state, 7, "WHY")]


def test_parked_settlements_give_a_finished_turn_its_own_verdict_and_nothing_to_settled_inputs() -> None:
    failed = TurnFinished(S, 0, "in-1", 1, "failed", None, "timeout", "too slow")
    assert _verdicts(*_turn("in-1", 1, failed, None)) == [("in-1", "failed", "timeout", "too slow")]
    done = TurnFinished(S, 0, "in-1", 1, "completed", "hi")
    assert _verdicts(*_turn("in-1", 1, done, None)) == [("in-1", "completed", None, None)]
    assert _verdicts(*_turn("in-1", 1, done, InputSettled(S, 0, "in-1", "completed"))) == []


def test_parked_settlements_fail_a_closed_turns_input_and_the_running_ones() -> None:
    closed = TurnFinished(S, 0, "in-1", 1, "aborted", None, "input_already_settled", "closed")
    assert _verdicts(*_turn("in-1", 1, closed, None)) == [("in-1", "failed", "session_unreadable", "WHY")]
    assert _verdicts(*_turn("in-1", 1, None, None), InputMessage(S, 0, "in-2", "next", "shop"),
                     InputRecords(S, 0, "rec-1", [{"type": "app.x"}])) == [
        ("in-1", "failed", "session_unreadable", "WHY"),
        ("in-2", "rejected", "session_unreadable", "WHY"),
        ("rec-1", "rejected", "session_unreadable", "WHY"),
    ]
