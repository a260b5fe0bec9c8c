"""The write connection's known positions (harness.log.sqlite_positions): an append reads
no positions it already knows, and never uses one another connection (or a failed
transaction) may have changed: chains stay whole and fencing still holds."""

from __future__ import annotations

import asyncio

import pytest

from harness.errors import FencedError, LogUnavailable
from harness.log.sqlite import SqliteLog
from harness.records import InputMessage
from tests.unit.test_sqlite_log import LEASE, db, log, step

pytestmark = pytest.mark.asyncio

__all__ = ["db", "log"]  # (the fixtures of test_sqlite_log, used here)


def traced(log: SqliteLog) -> list[str]:
    statements: list[str] = []
    log._commits._wconn.set_trace_callback(statements.append)  # type: ignore[union-attr]
    return statements


def heads(statements: list[str]) -> list[str]:
    return [s.split()[0] for s in statements]


async def chain_of(log: SqliteLog, session: str) -> list[tuple[int, str]]:
    """The session's records (read whole: a broken chain or head raises CorruptRecord)."""
    return [(e.seq, e.record.TYPE) for e in await log.read(session)]


async def test_a_writers_next_append_reads_no_positions(log):
    writer = await log.claim("s", owner="w", lease=LEASE)
    await writer.append([step("s", 1)])
    statements = traced(log)
    await writer.append([step("s", 2), step("s", 3)])
    assert heads(statements) == ["BEGIN", "PRAGMA", "INSERT", "INSERT", "INSERT", "COMMIT"]
    assert [seq for seq, _ in await chain_of(log, "s")] == [1, 2, 3]


async def test_another_connections_records_are_read_before_the_next_append(log, db):
    writer = await log.claim("s", owner="w", lease=LEASE)
    await writer.append([step("s", 1)])
    await writer.append([step("s", 2)])  # (its positions now known)
    other = SqliteLog(db)  # another process's log, say a client's
    try:
        sent = await other.submit(InputMessage("s", 3, "in-1", "hello"))
        elsewhere = await other.submit(InputMessage("t", 4, "in-2", "hi"))
    finally:
        await other.close()
    statements = traced(log)
    [entry] = await writer.append([step("s", 5)])
    assert "SELECT" in heads(statements)  # read again: another connection committed
    assert entry.seq == elsewhere.seq + 1
    assert await chain_of(log, "s") == [
        (1, "harness.step.result"),
        (2, "harness.step.result"),
        (sent.seq, "harness.input.message"),
        (entry.seq, "harness.step.result"),
    ]


async def test_a_claim_by_another_connection_fences_a_writer_whose_positions_are_known(log, db):
    writer = await log.claim("s", owner="w1", lease=LEASE)
    await writer.append([step("s", 1)])
    await writer.append([step("s", 2)])  # (no renewal due: its owner is known, not checked)
    later = SqliteLog(db, clock=lambda: 1e12)  # another worker, for whom w1's lease ran out
    try:
        taker = await later.claim("s", owner="w2", lease=LEASE)
        with pytest.raises(FencedError):
            await writer.append([step("s", 3)])
        await taker.append([step("s", 4)])
    finally:
        await later.close()
    assert [e.record.name for e in await log.read("s")] == ["step-1", "step-2", "step-4"]


async def test_a_claim_through_the_same_log_fences_a_writer_whose_positions_are_known(log):
    writer = await log.claim("s", owner="w", lease=LEASE)
    await writer.append([step("s", 1)])
    await writer.append([step("s", 2)])
    newer = await log.claim("s", owner="w", lease=LEASE)  # same owner, new epoch
    with pytest.raises(FencedError):
        await writer.append([step("s", 3)])
    await newer.append([step("s", 3)])
    await newer.release()
    with pytest.raises(FencedError):
        await newer.append([step("s", 4)])
    assert [seq for seq, _ in await chain_of(log, "s")] == [1, 2, 3]


async def test_a_transaction_that_fails_forgets_the_positions_it_wrote(log):
    ws = await log.claim("s", owner="w", lease=LEASE)
    wt = await log.claim("t", owner="w", lease=LEASE)
    await ws.append([step("s", 1)])
    await wt.append([step("t", 1)])
    # On the write connection itself (so nothing else looks changed): t's next head fails.
    conn = log._commits._wconn
    assert conn is not None
    conn.execute(
        "CREATE TRIGGER boom BEFORE UPDATE ON heads WHEN NEW.session_id = 't' "
        "BEGIN SELECT RAISE(ABORT, 'boom'); END"
    )
    results = await asyncio.gather(
        ws.append([step("s", 2), step("s", 3)]), wt.append([step("t", 2)]), return_exceptions=True
    )
    assert all(isinstance(r, LogUnavailable) for r in results), results  # one transaction, gone
    conn.execute("DROP TRIGGER boom")
    [entry] = await ws.append([step("s", 2)])
    assert entry.seq == 3  # not after the records that were rolled back
    assert [seq for seq, _ in await chain_of(log, "s")] == [1, 3]
    assert [seq for seq, _ in await chain_of(log, "t")] == [2]


async def test_a_commit_on_the_writer_threads_connection_is_seen_by_the_loops(log):
    writer = await log.claim("s", owner="w", lease=LEASE)
    await writer.append([step("s", 1)])
    await writer.append([step("s", 2)])
    log._commits._inline_limit = 0  # as if storage were slow: the next commit runs on the thread
    await writer.append([step("s", 3)])
    assert log.stats.offloaded == 1
    log._commits._inline_limit = 1.0
    log._commits._commit_avg = 0.0
    statements = traced(log)
    await writer.append([step("s", 4)])
    assert "SELECT" in heads(statements)
    assert [seq for seq, _ in await chain_of(log, "s")] == [1, 2, 3, 4]
