"""A SQLite listing uses a quiet session's stored summary (``harness.log.sqlite_summaries``)
only while it is of the session's last record, and lists exactly what it lists without
stored summaries: on the rich file of ``test_sqlite_listing`` (damaged rows included),
with a stale row, a damaged row and a session that got a new input after its row was
written; the rows written by the worker's own path (``SummaryWriter``), in batches."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from dataclasses import fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from harness import open_log
from harness.clock import FakeClock
from harness.log import sqlite_listing
from harness.log.sqlite import SqliteLog
from harness.log.sqlite_summaries import (
    STORED_FIELDS,
    decode_summary,
    encode_summary,
    summary_crc,
    upsert_summaries,
)
from harness.records import InputMessage
from harness.runtime import stored_summaries
from harness.runtime import worker as worker_module
from harness.runtime.catalog import SessionIndex
from harness.runtime.session_digest import SUMMARY_TYPES
from harness.runtime.stored_summaries import SummaryWriter
from harness.views import SessionSummary, Usage

from .test_sqlite_checkpoint import first_life
from .test_sqlite_listing import T0, Spy, _json, build, folded, rich_sessions

# the rich file's sessions a listing summarizes from a few types (no turn in progress, no damaged record read)
QUIET = {"done", "failed", "answered", "queued", "cancelled", "records", "running", "other-harness", "bad-step"}


async def store_all(log: SqliteLog) -> int:
    """Rows for every session the worker's path summarizes, a batch at a time; the batches."""
    writer = SummaryWriter(log)
    batches = 0
    while writer.more:
        await writer.batch(())
        batches += 1
    return batches


def stored_ids(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {sid for (sid,) in db.execute("SELECT session_id FROM summaries")}
    finally:
        db.close()


@pytest.fixture(params=["scan", "by-session"])
def how(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The sessions without a usable row read by the scan, or one by one."""
    monkeypatch.setattr(sqlite_listing, "BY_SESSION_SHARE", 1 if request.param == "by-session" else 10_000)
    return str(request.param)


async def test_stored_summaries_list_what_a_listing_without_them_lists(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "rich.db"
    build(path)
    now = T0 + 10_000
    expected, _ = await folded(path, now)
    monkeypatch.setattr(stored_summaries, "BATCH", 4)
    log = open_log(f"sqlite:///{path}")
    try:
        assert await store_all(log) > 2  # in batches
        assert stored_ids(path) == QUIET  # not the busy ones, nor those with a damaged record read
        read = await log.scan_listing(SUMMARY_TYPES)
        assert set(read.stored) == QUIET and read.damaged == 0
        assert not {e.session_id for e in read.entries if hasattr(e, "record")} & QUIET
        quick = SessionIndex(Spy(log))  # type: ignore[arg-type]
        assert _json(await quick.summaries(now_ms=now)) == expected
        assert quick.unreadable == 3  # as without rows: the damaged rows of the sessions read

        # a stale row (of an earlier position, saying something else), a damaged row, and
        # a session that got a new input after its row was written
        db = sqlite3.connect(path, isolation_level=None)
        (head,) = db.execute("SELECT last_seq FROM heads WHERE session_id = 'failed'").fetchone()
        lying = next(s for s in await SessionIndex(log).summaries(now_ms=now) if s.session_id == "failed")
        db.execute("BEGIN IMMEDIATE")
        upsert_summaries(db, [("failed", head - 1, lying.__class__(**{**_fields(lying), "turns": 99}))])
        (body,) = db.execute("SELECT summary FROM summaries WHERE session_id = 'records'").fetchone()
        changed = bytearray(body)
        changed[-3] ^= 0x01
        db.execute("UPDATE summaries SET summary = ? WHERE session_id = 'records'", (bytes(changed),))
        db.execute("COMMIT")
        db.close()
        writer = await log.claim("done", owner="t", lease=timedelta(seconds=5))
        await writer.append([InputMessage("done", T0 + 5000, "m3", "more", "rich")])
        await writer.release()

        later, _ = await folded(path, now)
        assert {s["session_id"]: s["state"] for s in later}["done"] == "running"
        read = await log.scan_listing(SUMMARY_TYPES)
        assert set(read.stored) == QUIET - {"failed", "records", "done"} and read.damaged == 1
        again = SessionIndex(log)
        assert _json(await again.summaries(now_ms=now)) == later
        assert again.unreadable == 4  # the damaged row counted too

        # a worker's next batches replace the stale rows ('done' waits for its owner: no
        # turn in progress, no clock in its summary) and, as it starts, the damaged row of
        # the session's head (dropped, then written again like a missing one; its head
        # never moves, so nothing else would)
        with caplog.at_level(logging.WARNING, logger="harness.worker"):
            await store_all(log)
        assert [r.getMessage() for r in caplog.records if "did not check" in r.getMessage()] == [
            "stored summaries: 1 row(s) did not check (a changed byte in the log file) and were dropped; "
            "they are written again from the sessions' records"
        ]
        read = await log.scan_listing(SUMMARY_TYPES)
        assert set(read.stored) == QUIET and read.damaged == 0
        assert read.stored["done"].state == "running" and read.stored["done"].pending_inputs == 1
        assert _json(await SessionIndex(log).summaries(now_ms=now)) == later
    finally:
        await log.close()


def _fields(summary: Any) -> dict[str, Any]:
    return {name: getattr(summary, name) for name in summary.__dataclass_fields__}


async def test_a_listing_uses_a_row_of_the_sessions_head_and_reads_none_of_its_records(tmp_path: Path) -> None:
    """What shows a row is used: one whose summary says something else (written here,
    as no harness would) is what the listing shows."""
    path = tmp_path / "rich.db"
    build(path)
    now = T0 + 10_000
    log = open_log(f"sqlite:///{path}")
    try:
        await store_all(log)
        listed = {s.session_id: s for s in await SessionIndex(log).summaries(now_ms=now)}
        db = sqlite3.connect(path, isolation_level=None)
        (head,) = db.execute("SELECT last_seq FROM heads WHERE session_id = 'other-harness'").fetchone()
        db.execute("BEGIN IMMEDIATE")
        upsert_summaries(db, [("other-harness", head, listed["other-harness"].__class__(
            **{**_fields(listed["other-harness"]), "turns": 42}))])
        db.execute("COMMIT")
        db.close()
        shown = {s.session_id: s for s in await SessionIndex(log).summaries(now_ms=now)}
        assert shown["other-harness"].turns == 42
    finally:
        await log.close()


async def test_a_file_without_the_table_opened_read_only_lists_as_before(tmp_path: Path) -> None:
    path = tmp_path / "rich.db"
    build(path)
    now = T0 + 10_000
    expected, _ = await folded(path, now)  # (a writer: it makes the table)
    db = sqlite3.connect(path)
    db.execute("DROP TABLE summaries")
    db.commit()
    db.close()
    log = SqliteLog(str(path), read_only=True)
    try:
        assert _json(await SessionIndex(log).summaries(now_ms=now)) == expected
        read, more = await log.summary_sources(SUMMARY_TYPES, {}, 10)
        assert not read.lasts and not more
        with pytest.raises(Exception, match="read"):
            await log.write_summaries([("done", 1, next(iter(await SessionIndex(log).summaries(now_ms=now))))])
    finally:
        await log.close()
    assert len(rich_sessions(T0)) == len(expected)


@pytest.fixture
def often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "CHECKPOINT_EVERY_RECORDS", 1)


async def test_a_worker_stores_the_summaries_of_the_sessions_that_ended_not_the_live_ones(
    tmp_path: Path, clock: FakeClock, often: None, caplog: Any
) -> None:
    path = tmp_path / "w.db"
    await first_life(path, clock, caplog)  # 'done' and 'back' ended; 'asking' and 'napping' wait
    assert stored_ids(path) == {"done", "back"}
    log = SqliteLog(str(path), clock=clock.now, read_only=True)
    try:
        now = int(clock.now() * 1000)
        expected, _ = await folded(path, now)
        index = SessionIndex(log)
        assert _json(await index.summaries(now_ms=now)) == expected
        read = await log.scan_listing(SUMMARY_TYPES)
        assert set(read.stored) == {"done", "back"}
    finally:
        await log.close()
    await asyncio.sleep(0)


def test_the_stored_fields_are_those_of_session_summary() -> None:
    """A new field of SessionSummary needs a new FORMAT (rows of the old one are then not
    used, and replaced): this test says so."""
    assert tuple(f.name for f in fields(SessionSummary)) == STORED_FIELDS, "bump sqlite_summaries.FORMAT"


def test_a_quiet_summary_round_trips_and_a_busy_one_is_not_stored() -> None:
    quiet = SessionSummary("s", "h", "failed", 5, turns=3, last_outcome="failed", last_code="tool_error",
                           pending_inputs=1, usage=Usage(2, 10, 3, 0.5))
    assert decode_summary("s", encode_summary(quiet)) == quiet
    assert decode_summary("s", encode_summary(SessionSummary("s", None, "idle"))) == SessionSummary("s", None, "idle")
    assert decode_summary("s", b"[2," + encode_summary(quiet)[3:]) is None  # another format
    with pytest.raises(ValueError):
        encode_summary(SessionSummary("s", "h", "sleeping", sleeping_until=7))
    with pytest.raises(ValueError):
        encode_summary(SessionSummary("s", "h", "running", active_input="m1"))


async def test_a_row_of_another_format_is_not_used_and_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "rich.db"
    build(path)
    now = T0 + 10_000
    expected, _ = await folded(path, now)
    log = open_log(f"sqlite:///{path}")
    try:
        await store_all(log)
        db = sqlite3.connect(path, isolation_level=None)
        (seq, body) = db.execute("SELECT last_seq, summary FROM summaries WHERE session_id = 'done'").fetchone()
        other = b"[99," + bytes(body)[3:]
        db.execute("UPDATE summaries SET summary = ?, crc = ? WHERE session_id = 'done'",
                   (other, summary_crc("done", seq, other)))
        db.close()
        read = await log.scan_listing(SUMMARY_TYPES)
        assert "done" not in read.stored and read.damaged == 0
        assert _json(await SessionIndex(log).summaries(now_ms=now)) == expected
        writer = SummaryWriter(log)
        await writer.batch(())
        assert writer.written == 1 and not writer.more  # that row only
        assert "done" in (await log.scan_listing(SUMMARY_TYPES)).stored
    finally:
        await log.close()


async def test_a_starting_worker_drops_the_rows_that_do_not_check_and_only_those(tmp_path: Path) -> None:
    """A changed byte in a row's summary, its position or its session id, or a column of
    another type: dropped (and written again by the batches); good rows kept. Once per
    writer: a later batch does not look again. A read-only log refuses to drop."""
    path = tmp_path / "rich.db"
    build(path)
    log = open_log(f"sqlite:///{path}")
    try:
        await store_all(log)
        kept = stored_ids(path)
        assert {"done", "failed", "answered", "queued"} <= kept
        db = sqlite3.connect(path, isolation_level=None)
        (body,) = db.execute("SELECT summary FROM summaries WHERE session_id = 'done'").fetchone()
        flipped = bytearray(body)
        flipped[5] ^= 0x04
        db.execute("UPDATE summaries SET summary = ? WHERE session_id = 'done'", (bytes(flipped),))
        db.execute("UPDATE summaries SET last_seq = last_seq + 1024 WHERE session_id = 'failed'")
        db.execute("UPDATE summaries SET summary = 'not a blob' WHERE session_id = 'answered'")
        db.execute("UPDATE summaries SET session_id = 'queuee' WHERE session_id = 'queued'")
        db.close()
        writer = SummaryWriter(log)
        assert await log.drop_damaged_summaries() == 4  # (what the writer's first batch does)
        assert stored_ids(path) == kept - {"done", "failed", "answered", "queued"}  # ('queuee' gone too)
        while writer.more:
            await writer.batch(())
        assert stored_ids(path) == kept  # written again ('queuee' was a row of no session)
        assert (await log.scan_listing(SUMMARY_TYPES)).damaged == 0

        db = sqlite3.connect(path, isolation_level=None)
        db.execute("UPDATE summaries SET crc = crc + 1 WHERE session_id = 'done'")
        db.close()
        writer.more = True
        await writer.batch(())  # the same writer: it looked once
        assert (await log.scan_listing(SUMMARY_TYPES)).damaged == 1
    finally:
        await log.close()
    log = SqliteLog(str(path), read_only=True)
    try:
        with pytest.raises(Exception, match="read"):
            await log.drop_damaged_summaries()
    finally:
        await log.close()
    log = open_log(f"sqlite:///{path}")
    try:
        await store_all(log)  # a new worker's writer: it drops the row and writes it again
        assert (await log.scan_listing(SUMMARY_TYPES)).damaged == 0 and "done" in stored_ids(path)
    finally:
        await log.close()
