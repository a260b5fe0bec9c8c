"""``bench/step_latency.py`` on SQLite times commits only once a file's WAL is full size
(its commits then rewrite it, as a long-running log's do)."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

from bench.step_latency import wal_full


def test_wal_full_only_once_the_wal_reached_its_checkpoint_size(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")
        db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
        assert not wal_full(path)
        db.execute("INSERT INTO t (v) VALUES (?)", (b"x" * 100,))
        assert not wal_full(path)  # growing
        for _ in range(1100):  # about a page a commit: past the default 1,000 pages it is full size
            db.execute("INSERT INTO t (v) VALUES (?)", (b"x" * 100,))
        assert wal_full(path)
    finally:
        db.close()


async def test_the_floor_benchs_minimal_step_writes_what_the_log_reads_and_verifies(tmp_path: Path) -> None:
    """``bench/step_floor.py``'s minimal step does the log's own writes (checksummed rows,
    the chain, the head): a floor that skipped some would flatter nothing but itself."""
    from bench.step_floor import MinimalStep
    from harness.log import open_log
    from harness.log.sqlite_schema import head_crc

    made = open_log(f"sqlite:///{tmp_path / 'm.db'}")  # the file as the log makes it (its namespace)
    await made.claim("other", owner="w", lease=timedelta(seconds=30))
    await made.close()
    minimal = MinimalStep(tmp_path / "m.db")

    async def value() -> str:
        return "x" * 100

    for n in range(3):
        await minimal.do(f"s{n}", value)
    log = open_log(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        entries = await log.read("s1")
        assert [(e.seq, e.record.name, e.record.value) for e in entries] == [(n + 1, f"s{n}", "x" * 100) for n in range(3)]
        assert [item.seq for item in await log.scan("s1")] == [1, 2, 3]  # checksums and chain hold
    finally:
        await log.close()
    db = sqlite3.connect(tmp_path / "m.db")
    try:
        assert db.execute("SELECT last_seq, crc FROM heads WHERE session_id = 's1'").fetchone() == (3, head_crc("s1", 3))
    finally:
        db.close()
