"""The verdicts of a parked session's inputs land even when their first write fails.

Before: a failed write (another process held the session's lease, a short outage) was
logged and never tried again, and a checkpoint written meanwhile named the session as
ended, so a new owner starting from it never read it again: the senders waited for good.
Now the write is tried again with a backoff on the host's clock (the log read again under
the lease first: another owner's verdicts count, none is written twice), said once per
kind of failure, and a checkpoint names the session in ``reread`` until they land.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness import HarnessHost, define_harness, durable_tool, tool_definition
from harness.client import HarnessClient
from harness.clock import FakeClock
from harness.errors import LogUnavailable
from harness.log.sqlite import SqliteLog
from harness.records import InputSettled, LogEntry, StepResult
from harness.runtime.parked import PARKED_RETRY_FIRST_S, PARKED_RETRY_MAX_S, parked_retry_at
from harness.runtime.partition import PartitionRuntime

from .conftest import Args, call, script

LEASE = timedelta(seconds=30)


def shop_harness(charges: list[str]) -> Any:
    async def checkout(args: Args, ctx: Any) -> Any:
        await ctx.step.do("charge", lambda: charges.append(ctx.session_id) or {"amount": 100})
        return "ok"

    t = durable_tool(tool_definition(name="checkout", description="d", input_schema=Args), checkout)
    return define_harness(name="shop", model=script([call("c1", "checkout")], "paid"), tools=[t])


class OutageLog(SqliteLog):
    """A SQLite log whose next ``outage`` claims fail as a short outage would."""

    outage = 0
    claims = 0

    async def claim(self, session_id: str, *, owner: str, lease: timedelta) -> Any:
        self.claims += 1
        if self.outage:
            self.outage -= 1
            raise LogUnavailable("the disk is gone for a moment")
        return await super().claim(session_id, owner=owner, lease=lease)


async def a_parked_session(tmp_path: Path, clock: FakeClock, charges: list[str]) -> tuple[OutageLog, str]:
    """Session ``bad``: turn 1 completed, its charge then unreadable, input ``in-2`` waiting."""
    path = tmp_path / "shop.db"
    log = OutageLog(path, clock=clock.now)
    async with HarnessHost(log=log, clock=clock, lease=LEASE) as host:
        session = await host.open(shop_harness(charges), session_id="bad")
        assert (await session.send("check out", input_id="in-1")).outcome == "completed"
        await session.close()
    step = next(e for e in await log.read("bad") if isinstance(e.record, StepResult))
    with sqlite3.connect(path) as raw:
        (value,) = raw.execute("SELECT value FROM records WHERE seq = ?", (step.seq,)).fetchone()
        raw.execute("UPDATE records SET value = ? WHERE seq = ?", (value.replace(b"100", b"900"), step.seq))
    client = HarnessClient(log=log)
    await client.send("bad", "and again", input_id="in-2")
    await client.close()
    log.claims = 0
    return log, "in-2"


def runtime(log: SqliteLog, clock: FakeClock, charges: list[str]) -> PartitionRuntime:
    return PartitionRuntime(host=HarnessHost(log=log, clock=clock, lease=LEASE), harnesses={"shop": shop_harness(charges)})


async def read_after(rt: PartitionRuntime, log: SqliteLog, after: int) -> list[LogEntry]:
    """What a Kafka worker's takeover reads after a checkpoint (unreadable ones reported)."""
    entries: list[LogEntry] = []
    for item in await log.scan(None, after=after):
        if isinstance(item, LogEntry):
            entries.append(item)
        else:
            rt.report_corrupt(item)
    return entries


async def settlements(log: SqliteLog, sid: str) -> list[tuple[str, str, str | None]]:
    return [
        (e.record.input_id, e.record.outcome, e.record.code)
        for e in await log.scan(sid)
        if isinstance(e, LogEntry) and isinstance(e.record, InputSettled)
    ]


async def until(predicate: Any, what: str) -> None:
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"not reached: {what}")


def test_the_retry_waits_double_up_to_a_cap_and_not_before_a_holders_lease_ends() -> None:
    assert parked_retry_at(1, 100.0) == 100.0 + PARKED_RETRY_FIRST_S
    assert parked_retry_at(2, 100.0) == 100.0 + 2 * PARKED_RETRY_FIRST_S
    assert parked_retry_at(50, 100.0) == 100.0 + PARKED_RETRY_MAX_S
    assert parked_retry_at(1, 100.0, lease_until=110.0) == 110.001  # no sooner than the lease's end
    assert parked_retry_at(1, 100.0, lease_until=100.1) == 100.0 + PARKED_RETRY_FIRST_S
    assert parked_retry_at(1, 100.0, lease_until=10_000.0) == 100.0 + PARKED_RETRY_MAX_S  # looked at again


async def test_verdicts_held_up_by_another_holder_of_the_lease_land_once_it_lets_go(tmp_path: Path, caplog):
    """Another process holds the parked session's lease (SessionBusy): the owner tries
    again on its clock, said once while the same holder keeps it; meanwhile that holder
    settled ``in-2`` itself and ``in-3`` came: only ``in-3`` is written, once."""
    caplog.set_level(logging.WARNING, "harness.worker")
    clock, charges = FakeClock(), []
    log, waiting = await a_parked_session(tmp_path, clock, charges)
    other = await log.claim("bad", owner="other-worker", lease=timedelta(minutes=10))

    rt = runtime(log, clock, charges)
    rt.rebuild(await read_after(rt, log, 0))
    await rt.go_live()
    assert "bad" in rt.parked
    await until(lambda: clock.sleepers == 1, "the verdicts' write waits to be tried again")
    for _ in range(3):  # the holder keeps its lease a while: tried again (every 30 s), not said again
        claims = log.claims
        clock.advance(PARKED_RETRY_MAX_S)
        await until(lambda claims=claims: log.claims > claims and clock.sleepers == 1, "tried again")
    assert await settlements(log, "bad") == [("in-1", "completed", None)]
    failed = [r for r in caplog.records if "could not be written" in r.getMessage()]
    assert len(failed) == 1 and "SessionBusy" in failed[0].getMessage()
    assert "other-worker" in failed[0].getMessage()

    client = HarnessClient(log=log)
    await other.append([InputSettled("bad", 0, waiting, "rejected", "session_unreadable", "by the other")])
    await other.release()
    late = await client.send("bad", "hello?", input_id="in-3")
    clock.advance(PARKED_RETRY_MAX_S)
    settled = await asyncio.wait_for(client.wait_settled("bad", late), 10)
    assert (settled.outcome, settled.code) == ("rejected", "session_unreadable")
    await until(lambda: rt.checkpoint().reread == (), "its verdicts are known to be all written")
    assert await settlements(log, "bad") == [
        ("in-1", "completed", None), ("in-2", "rejected", "session_unreadable"), ("in-3", "rejected", "session_unreadable"),
    ]  # in-2 once: the other's verdict counted
    assert any("written after" in r.getMessage() for r in caplog.records)
    assert rt.checkpoint().reread == ()
    await rt.stop()
    assert charges == ["bad"]
    await client.close()
    await log.close()


async def test_verdicts_lost_to_a_short_outage_are_written_once_it_ends(tmp_path: Path, caplog):
    caplog.set_level(logging.WARNING, "harness.worker")
    clock, charges = FakeClock(), []
    log, waiting = await a_parked_session(tmp_path, clock, charges)
    log.outage = 4
    rt = runtime(log, clock, charges)
    rt.rebuild(await read_after(rt, log, 0))
    await rt.go_live()
    for k in range(4):
        await until(lambda: clock.sleepers == 1, "waits to try again")
        clock.advance(PARKED_RETRY_FIRST_S * 2**k)
    client = HarnessClient(log=log)
    settled = await asyncio.wait_for(client.wait_settled("bad", waiting), 10)
    assert (settled.outcome, settled.code) == ("rejected", "session_unreadable")
    assert log.claims == 5
    said = [r.getMessage() for r in caplog.records if "parked session bad" in r.getMessage()]
    assert len([m for m in said if "could not be written" in m]) == 1  # throttled: one line for the outage
    assert any("written after 4 failed attempt(s)" in m for m in said)
    await rt.stop()
    await client.close()
    await log.close()


async def test_a_checkpoint_made_before_the_verdicts_land_has_its_next_owner_write_them(tmp_path: Path):
    """What a Kafka takeover does: the first owner's checkpoint is written while the
    verdicts cannot be; the next owner starts from it, no record of the session comes
    after it, and still writes them (before: the session read as ended, never again)."""
    clock, charges = FakeClock(), []
    log, waiting = await a_parked_session(tmp_path, clock, charges)
    log.outage = 1_000_000  # for the whole of the first owner's time
    first = runtime(log, clock, charges)
    first.rebuild(await read_after(first, log, 0))
    await first.go_live()
    await until(lambda: clock.sleepers == 1, "the first owner's write failed")
    checkpoint = first.checkpoint()
    assert "bad" in checkpoint.ended and "bad" not in checkpoint.sessions
    assert checkpoint.reread == ("bad",)
    await first.stop()  # the partition is lost: its retries end with it
    assert clock.sleepers == 0

    log.outage = 0
    second = runtime(log, clock, charges)
    second.load_checkpoint(checkpoint)
    second.rebuild(await read_after(second, log, checkpoint.covers))
    await second.go_live()
    client = HarnessClient(log=log)
    try:
        settled = await asyncio.wait_for(client.wait_settled("bad", waiting), 10)
        assert (settled.outcome, settled.code) == ("rejected", "session_unreadable")
        assert "bad" in second.parked
        await until(lambda: second.checkpoint().reread == (), "no verdict left to write")
    finally:
        await second.stop()
    assert await settlements(log, "bad") == [("in-1", "completed", None), ("in-2", "rejected", "session_unreadable")]
    assert charges == ["bad"]
    await client.close()
    await log.close()
