"""The SQLite log's layout (schema 3): the pages a commit writes, the upgrade of a
schema-2 file, and a file of a newer harness refused with one line."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest

from harness.codec import default_codec
from harness.errors import CorruptRecord, LogUnavailable
from harness.log.sqlite import SqliteLog
from harness.log.sqlite_schema import PAGE_SIZE, head_crc, namespace_crc, row_crc
from harness.records import InputMessage, StepResult

# Schema 2, as files made before schema 3 hold it.
SCHEMA_2 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE records (seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, type TEXT NOT NULL,
                      value BLOB NOT NULL, prev INTEGER, crc INTEGER);
CREATE INDEX records_session_seq ON records (session_id, seq);
CREATE TABLE owners (session_id TEXT PRIMARY KEY, owner TEXT, epoch INTEGER NOT NULL, lease_until REAL);
CREATE TABLE heads (session_id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL, crc INTEGER NOT NULL);
"""


def _wal_frames(path: Path, page_size: int) -> int:
    wal = Path(str(path) + "-wal")
    return 0 if not wal.exists() else (wal.stat().st_size - 32) // (page_size + 24)


async def test_an_append_of_one_record_writes_three_pages(tmp_path):
    """The record's table page, its session index page and its head: no sqlite_sequence page,
    no second page for the head's index (each page is 4 KiB more in the commit's fsync)."""
    path = tmp_path / "pages.db"
    log = SqliteLog(path)
    try:
        writer = await log.claim("A", owner="w", lease=timedelta(hours=1))
        await writer.append([StepResult("A", 1, "c1", "s0", {"n": 0})])
        with sqlite3.connect(path) as raw:
            page_size = raw.execute("PRAGMA page_size").fetchone()[0]
            tables = {name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "sqlite_sequence" not in tables
        per_append = []
        for n in range(1, 4):
            before = _wal_frames(path, page_size)
            await writer.append([StepResult("A", 1, "c1", f"s{n}", {"n": n})])
            per_append.append(_wal_frames(path, page_size) - before)
        assert per_append == [3, 3, 3]
        assert [e.record.value for e in await log.read("A")] == [{"n": n} for n in range(4)]
    finally:
        await log.close()


def _page_size(path: Path) -> int:
    with sqlite3.connect(path) as raw:
        return int(raw.execute("PRAGMA page_size").fetchone()[0])


async def test_a_new_log_is_made_with_small_pages_and_a_record_over_a_page_round_trips(tmp_path):
    """A step's three pages are whole in each commit's WAL write: a new file has 1 KiB pages.
    A record bigger than many pages (overflow pages) is stored, checked and read back."""
    assert PAGE_SIZE == 1024
    path = tmp_path / "small.db"
    big = {"text": "é" * 20_000, "n": 1}  # ~40 KB of UTF-8: dozens of overflow pages
    log = SqliteLog(path)
    try:
        writer = await log.claim("A", owner="w", lease=timedelta(hours=1))
        await writer.append([StepResult("A", 1, "c1", "big", big)])
        await writer.append([StepResult("A", 1, "c1", "small", {"n": 2})])
    finally:
        await log.close()
    assert _page_size(path) == PAGE_SIZE
    log = SqliteLog(path, read_only=True)
    try:
        assert [e.record.value for e in await log.read("A")] == [big, {"n": 2}]
    finally:
        await log.close()


async def test_a_log_made_with_4_kib_pages_keeps_them_and_goes_on(tmp_path):
    """The page size is fixed when a file is made: a log of an older harness (SQLite's
    default 4 KiB) is opened, written and read as it is."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA page_size = 4096")
        raw.execute("PRAGMA journal_mode = WAL")  # (the header is written: the size is fixed)
    log = SqliteLog(path)
    try:
        writer = await log.claim("A", owner="w", lease=timedelta(hours=1))
        for n in range(3):
            await writer.append([StepResult("A", 1, "c1", f"s{n}", {"n": n})])
    finally:
        await log.close()
    assert _page_size(path) == 4096
    log = SqliteLog(path)
    try:
        assert [e.record.value for e in await log.read("A")] == [{"n": n} for n in range(3)]
    finally:
        await log.close()


async def test_a_schema_2_file_gets_a_one_tree_heads_table_and_goes_on(tmp_path):
    path = tmp_path / "v2.db"
    codec = default_codec()
    with sqlite3.connect(path) as raw:
        raw.executescript(SCHEMA_2)
        raw.executemany(
            "INSERT INTO meta VALUES (?, ?)",
            [("namespace", "ns-two"), ("schema_version", "2"), ("namespace_crc", namespace_crc("ns-two"))],
        )
        prev: dict[str, int] = {}
        for seq, (sid, text) in enumerate([("A", "one"), ("B", "two"), ("A", "three")], start=1):
            record = InputMessage(sid, 0, f"in-{text}", text)
            value = codec.encode(record)
            p = prev.get(sid, 0)
            raw.execute(
                "INSERT INTO records (seq, session_id, type, value, prev, crc) VALUES (?, ?, ?, ?, ?, ?)",
                (seq, sid, record.TYPE, value, p, row_crc(seq, p, sid, record.TYPE, value)),
            )
            raw.execute("INSERT OR REPLACE INTO heads VALUES (?, ?, ?)", (sid, seq, head_crc(sid, seq)))
            prev[sid] = seq
    log = SqliteLog(path)
    try:
        assert log.namespace == "ns-two"
        assert [e.record.text for e in await log.read("A")] == ["one", "three"]
        entry = await log.submit(InputMessage("B", 0, "in-four", "four"))
        assert entry.seq == 4
        assert [e.record.text for e in await log.read("B")] == ["two", "four"]
    finally:
        await log.close()
    with sqlite3.connect(path) as raw:
        heads_sql = raw.execute("SELECT sql FROM sqlite_master WHERE name = 'heads'").fetchone()[0]
        assert "WITHOUT ROWID" in heads_sql
        assert raw.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("3",)
        assert sorted(raw.execute("SELECT session_id, last_seq FROM heads")) == [("A", 3), ("B", 4)]
    log = SqliteLog(path)  # opened again: nothing more to upgrade, the same records
    try:
        assert [e.seq for e in await log.read_all()] == [1, 2, 3, 4]
    finally:
        await log.close()


async def test_a_file_of_a_newer_harness_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "new.db"
    log = SqliteLog(path)
    await log.submit(InputMessage("A", 0, "in-1", "hi"))
    await log.close()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")
    with pytest.raises(LogUnavailable) as caught:
        SqliteLog(path).namespace  # noqa: B018 (opening is what is tested)
    message = str(caught.value)
    assert "newer harness" in message and "upgrade harness" in message and "\n" not in message


async def test_a_file_whose_last_rows_are_gone_never_gives_a_head_position_again(tmp_path):
    """Positions are MAX(seq) + 1 (no AUTOINCREMENT): if the last rows went missing from a
    damaged file, the next record still goes after the session's head, and the read says
    that a record is missing instead of chaining onto a reused position."""
    path = tmp_path / "cut.db"
    log = SqliteLog(path)
    for i in range(3):
        await log.submit(InputMessage("A", i, f"in-{i}", "hi"))
    await log.close()
    with sqlite3.connect(path) as raw:
        raw.execute("DELETE FROM records WHERE seq = 3")
    log = SqliteLog(path)
    try:
        entry = await log.submit(InputMessage("A", 9, "in-9", "again"))
        assert entry.seq == 4
        with pytest.raises(CorruptRecord) as caught:
            await log.read("A")
        assert "seq=3" in str(caught.value)
    finally:
        await log.close()
