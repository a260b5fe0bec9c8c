"""A worker never drives a session whose log has an unreadable record (issue 7).

It parks that session (an ERROR line, the dead-letter path, ``stats.parked_sessions``)
and keeps driving the others: skipping the record would run its charge again.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness import HarnessHost, define_harness, durable_tool, tool_definition
from harness.clock import FakeClock
from harness.log.sqlite import SqliteLog
from harness.records import InputSettled, LogEntry, StepResult, ToolResult, TurnFinished
from harness.runtime.worker import Worker

from .conftest import Args, call, crash, eventually, script

LEASE = timedelta(seconds=30)


class Shop:
    """A checkout whose charge is a step; the first process dies after it (``release``)."""

    def __init__(self) -> None:
        self.charges: list[str] = []
        self.release = asyncio.Event()

    def harness(self) -> Any:
        async def checkout(args: Args, ctx: Any) -> Any:
            await ctx.step.do("charge", lambda: self.charges.append(ctx.session_id) or {"amount": 100})
            await self.release.wait()  # the first process dies here, after the charge
            return "ok"

        t = durable_tool(tool_definition(name="checkout", description="d", input_schema=Args), checkout)
        return define_harness(name="shop", model=script([call("c1", "checkout")], "paid"), tools=[t])


async def flip_the_charge(log: SqliteLog, path: Path, sid: str) -> int:
    """A flipped bit in ``sid``'s charge (100 reads as 900); its position."""
    step = next(e for e in await log.read(sid) if isinstance(e.record, StepResult))
    with sqlite3.connect(path) as raw:
        (value,) = raw.execute("SELECT value FROM records WHERE seq = ?", (step.seq,)).fetchone()
        raw.execute("UPDATE records SET value = ? WHERE seq = ?", (value.replace(b"100", b"900"), step.seq))
    return step.seq


async def repair_the_charge(path: Path, seq: int) -> None:
    """Undo ``flip_the_charge`` (what an operator's repair of the row does)."""
    with sqlite3.connect(path) as raw:
        (value,) = raw.execute("SELECT value FROM records WHERE seq = ?", (seq,)).fetchone()
        raw.execute("UPDATE records SET value = ? WHERE seq = ?", (value.replace(b"900", b"100"), seq))


async def settlements(log: SqliteLog, sid: str) -> list[InputSettled]:
    """``sid``'s input settlements, read past any unreadable record."""
    return [e.record for e in await log.scan(sid) if isinstance(e, LogEntry) and isinstance(e.record, InputSettled)]


async def test_a_worker_parks_a_session_with_an_unreadable_record_and_drives_the_others(tmp_path: Path, caplog):
    clock = FakeClock()
    path = tmp_path / "shop.db"
    shop = Shop()
    charges = shop.charges

    log = SqliteLog(path, clock=clock.now)
    host = HarnessHost(log=log, clock=clock, lease=LEASE, poll_interval=timedelta(milliseconds=2))
    first = {sid: await host.open(shop.harness(), session_id=sid) for sid in ("good", "bad")}
    sends = [asyncio.create_task(s.send("check out", input_id="in-1")) for s in first.values()]
    await eventually(lambda: len(charges) == 2)
    await eventually(lambda: all(s.state.calls.get("c1") and s.state.calls["c1"].steps for s in first.values()))
    for session in first.values():
        await crash(session)
    for task in sends:
        task.cancel()
    await flip_the_charge(log, path, "bad")
    clock.advance(LEASE.total_seconds() + 1)
    shop.release.set()

    worker = Worker(log=log, harnesses=[shop.harness()], clock=clock, lease=LEASE, poll_interval=timedelta(milliseconds=2))
    stop = asyncio.Event()
    with caplog.at_level(logging.ERROR, logger="harness.worker"):
        run = asyncio.create_task(worker.run(stop))

        async def good_done() -> bool:
            return any(e.type == "harness.turn.finished" for e in await log.read("good"))

        await eventually(good_done, tries=20000)
        stop.set()
        await run
    assert charges == ["good", "bad"] or charges == ["bad", "good"]  # the bad one never ran again
    assert worker.stats.parked_sessions == 1
    assert any("session bad is parked" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    bad_types = [row[0] for row in sqlite3.connect(path).execute(
        "SELECT type FROM records WHERE session_id = 'bad' ORDER BY seq"
    )]
    # Nothing of its turn ran: only its input's verdict was written (its sender is told).
    assert bad_types[-2:] == ["harness.step.result", "harness.input.settled"]
    await host.close()
    await log.close()


async def test_the_inputs_of_a_parked_session_are_refused_not_left_waiting(tmp_path: Path):
    """A message queued before the worker parks the session, and one sent after, are
    settled rejected / session_unreadable: their senders get an answer (a client waits
    for good otherwise); the input of the turn that was running settles failed /
    session_unreadable, once, and nothing of that turn runs."""
    from harness.client import HarnessClient

    clock = FakeClock()
    path = tmp_path / "shop.db"
    shop = Shop()
    charges = shop.charges

    log = SqliteLog(path, clock=clock.now)
    host = HarnessHost(log=log, clock=clock, lease=LEASE, poll_interval=timedelta(milliseconds=2))
    session = await host.open(shop.harness(), session_id="bad")
    send = asyncio.create_task(session.send("check out", input_id="in-1"))
    await eventually(lambda: session.state.calls.get("c1") is not None and bool(session.state.calls["c1"].steps))
    await crash(session)
    send.cancel()
    client = HarnessClient(log=log)
    queued = await client.send("bad", "and again", input_id="in-2")  # behind the unfinished turn
    bad_seq = await flip_the_charge(log, path, "bad")
    clock.advance(LEASE.total_seconds() + 1)
    shop.release.set()

    worker = Worker(log=log, harnesses=[shop.harness()], clock=clock, lease=LEASE, poll_interval=timedelta(milliseconds=2))
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:
        running = await asyncio.wait_for(client.wait_settled("bad", "in-1"), 30)
        assert (running.outcome, running.code) == ("failed", "session_unreadable")
        assert f"unreadable record at position {bad_seq}" in (running.reason or "")
        first = await asyncio.wait_for(client.wait_settled("bad", queued), 30)
        later = await client.send("bad", "hello?", input_id="in-3")
        second = await asyncio.wait_for(client.wait_settled("bad", later), 30)
        for settled in (first, second):
            assert (settled.outcome, settled.code) == ("rejected", "session_unreadable")
            assert f"unreadable record at position {bad_seq}" in (settled.reason or "")
            assert "restart the worker" in (settled.reason or "")  # (SQLite: it can be repaired)
        await asyncio.sleep(0.05)  # the worker runs on: no second refusal of either
    finally:
        stop.set()
        await run
    assert charges == ["bad"]  # nothing of it ran again
    assert [s.input_id for s in await settlements(log, "bad")] == ["in-1", "in-2", "in-3"]  # once each
    assert "harness.turn.finished" not in [e.type for e in await log.scan("bad") if not isinstance(e, Exception)]
    await client.close()
    await host.close()
    await log.close()


async def test_a_repaired_session_closes_the_turn_whose_input_failed_unreadable_and_goes_on(tmp_path: Path):
    """The turn that was running when its record became unreadable: its input settled
    failed / session_unreadable. Once the record is repaired and a worker drives the
    session again, that turn is closed (aborted / input_already_settled, its tool not run
    again, no second verdict for its input) and the session's next message completes."""
    from harness.client import HarnessClient

    clock = FakeClock()
    path = tmp_path / "shop.db"
    shop = Shop()
    log = SqliteLog(path, clock=clock.now)
    host = HarnessHost(log=log, clock=clock, lease=LEASE, poll_interval=timedelta(milliseconds=2))
    session = await host.open(shop.harness(), session_id="bad")
    send = asyncio.create_task(session.send("check out", input_id="in-1"))
    await eventually(lambda: session.state.calls.get("c1") is not None and bool(session.state.calls["c1"].steps))
    await crash(session)
    send.cancel()
    bad_seq = await flip_the_charge(log, path, "bad")
    clock.advance(LEASE.total_seconds() + 1)
    shop.release.set()  # run again, the tool would finish at once
    client = HarnessClient(log=log)

    async def run_worker(until: Any) -> Any:
        worker = Worker(log=log, harnesses=[shop.harness()], clock=clock, lease=LEASE,
                        poll_interval=timedelta(milliseconds=2))
        stop = asyncio.Event()
        run = asyncio.create_task(worker.run(stop))
        try:
            return await asyncio.wait_for(until, 30)
        finally:
            stop.set()
            await run

    failed = await run_worker(client.wait_settled("bad", "in-1"))
    assert (failed.outcome, failed.code) == ("failed", "session_unreadable")
    assert f"unreadable record at position {bad_seq}" in (failed.reason or "")

    await repair_the_charge(path, bad_seq)  # the operator's fix, then a restart
    receipt = await client.send("bad", "hello again", input_id="in-2")
    done = await run_worker(client.wait_settled("bad", receipt))
    assert (done.outcome, done.code) == ("completed", None)

    entries = await log.read("bad")
    finished = [e.record for e in entries if isinstance(e.record, TurnFinished)]
    assert [(f.turn, f.input_id, f.outcome, f.code) for f in finished] == [
        (1, "in-1", "aborted", "input_already_settled"), (2, "in-2", "completed", None),
    ]
    assert [(s.input_id, s.outcome) for s in await settlements(log, "bad")] == [
        ("in-1", "failed"), ("in-2", "completed"),
    ]  # in-1 once: its verdict stands
    assert [e.record for e in entries if isinstance(e.record, ToolResult)] == []  # turn 1's tool never ran on
    assert shop.charges == ["bad"]
    await client.close()
    await host.close()
    await log.close()


async def test_a_parked_session_stays_parked_for_an_owner_that_starts_from_a_checkpoint(tmp_path: Path):
    """A checkpoint made after a session was parked names it (as ended, without its
    records): the next owner, starting from that checkpoint, reads the session whole when
    a record of it comes, finds the unreadable record again and parks it. Left out of the
    checkpoint, its next message read as a new session's first record and ran its turn
    from nothing: the charge again. (What a Kafka worker's takeover does; the runtime is
    driven here as a Kafka worker drives it: checkpoint, then the records after it.)"""
    from harness.client import HarnessClient
    from harness.runtime.partition import PartitionRuntime

    clock = FakeClock()
    path = tmp_path / "shop.db"
    shop = Shop()
    shop.release.set()
    log = SqliteLog(path, clock=clock.now)
    host = HarnessHost(log=log, clock=clock, lease=LEASE, poll_interval=timedelta(milliseconds=2))
    session = await host.open(shop.harness(), session_id="bad")
    assert (await session.send("check out", input_id="in-1")).outcome == "completed"
    await session.close()
    await flip_the_charge(log, path, "bad")

    def runtime() -> PartitionRuntime:
        return PartitionRuntime(host=HarnessHost(log=log, clock=clock, lease=LEASE), harnesses={"shop": shop.harness()})

    async def read_after(rt: PartitionRuntime, after: int) -> list[LogEntry]:
        entries: list[LogEntry] = []
        for item in await log.scan(None, after=after):
            if isinstance(item, LogEntry):
                entries.append(item)
            else:
                rt.report_corrupt(item)
        return entries

    first = runtime()
    first.rebuild(await read_after(first, 0))
    await first.go_live()
    assert "bad" in first.parked
    checkpoint = first.checkpoint()
    assert "bad" in checkpoint.ended and "bad" not in checkpoint.sessions
    await first.stop()

    client = HarnessClient(log=log)
    later = await client.send("bad", "and again", input_id="in-2")
    second = runtime()
    second.load_checkpoint(checkpoint)
    second.rebuild(await read_after(second, checkpoint.covers))
    await second.go_live()
    try:
        settled = await asyncio.wait_for(client.wait_settled("bad", later), 30)
        assert (settled.outcome, settled.code) == ("rejected", "session_unreadable")
        assert "bad" in second.parked
    finally:
        await second.stop()
    assert shop.charges == ["bad"]  # the turn did not run again from nothing
    await client.close()
    await host.close()
    await log.close()
