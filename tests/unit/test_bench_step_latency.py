"""``bench/step_latency.py`` on SQLite times commits only once a file's WAL is full size
(its commits then rewrite it, as a long-running log's do)."""

from __future__ import annotations

import sqlite3
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
