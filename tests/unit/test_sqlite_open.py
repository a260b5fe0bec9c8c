"""Which files the SQLite log opens, and how (``harness.log.sqlite_open``): a file holding
another application's tables is refused by everyone before anything is written to it, a
client (``create=False``) and a reader (``read_only=True``) never make a log of an empty
file, and a reader changes no byte and takes no write."""

from __future__ import annotations

import hashlib
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest

from harness import HarnessClient
from harness.errors import LogUnavailable
from harness.log import open_log
from harness.log.sqlite import SqliteLog
from harness.records import InputMessage


def files_of(folder: Path) -> dict[str, str]:
    """Every file of ``folder`` and a digest of its bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def app_database(path: Path) -> Path:
    with sqlite3.connect(path) as raw:  # an application's own database (rollback journal, as sqlite3 makes it)
        raw.execute("CREATE TABLE foo (x)")
        raw.execute("CREATE TABLE bar (y)")
        raw.execute("INSERT INTO foo VALUES (1)")
    return path


@pytest.mark.parametrize("how", [{}, {"create": False}, {"read_only": True}], ids=["worker", "client", "reader"])
def test_an_app_database_is_refused_by_everyone_and_left_as_it_was(tmp_path: Path, how: dict[str, bool]) -> None:
    path = app_database(tmp_path / "app.db")
    before = files_of(tmp_path)
    with pytest.raises(LogUnavailable) as caught:
        SqliteLog(path, **how)
    assert str(caught.value) == (
        f"{path} is not a harness log: it holds the tables bar, foo and no harness meta table; check the path "
        "(a log needs a file of its own)"
    )
    assert files_of(tmp_path) == before  # not even its journal mode changed
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert [name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["foo", "bar"]


def test_the_refusal_names_five_tables_and_counts_the_others(tmp_path: Path) -> None:
    path = tmp_path / "big.db"
    with sqlite3.connect(path) as raw:
        for n in range(7):
            raw.execute(f"CREATE TABLE t{n} (x)")
    with pytest.raises(LogUnavailable, match=r"holds the tables t0, t1, t2, t3, t4 and 2 more and no harness meta"):
        SqliteLog(path, read_only=True)


@pytest.mark.parametrize("how", [{"create": False}, {"read_only": True}], ids=["client", "reader"])
def test_an_empty_file_is_no_log_for_a_client_or_a_reader(tmp_path: Path, how: dict[str, bool]) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(LogUnavailable) as caught:
        SqliteLog(path, **how)
    assert str(caught.value) == (
        f"no SQLite log at {path}: the file is empty (it holds no tables); a worker (or HarnessHost) makes it a "
        "log when it first opens it"
    )
    assert files_of(tmp_path) == {"empty.db": hashlib.sha256(b"").hexdigest()}


@pytest.mark.parametrize("how", [{"create": False}, {"read_only": True}], ids=["client", "reader"])
def test_a_missing_file_is_not_made_by_a_client_or_a_reader(tmp_path: Path, how: dict[str, bool]) -> None:
    with pytest.raises(LogUnavailable, match=r"no SQLite log at .*a worker \(or HarnessHost\) creates the file"):
        SqliteLog(tmp_path / "typo.db", **how)
    assert list(tmp_path.iterdir()) == []


async def test_harness_client_makes_no_log_of_an_empty_or_foreign_file(tmp_path: Path) -> None:
    empty, app = tmp_path / "empty.db", app_database(tmp_path / "app.db")
    empty.touch()
    before = files_of(tmp_path)
    with pytest.raises(LogUnavailable, match="the file is empty"):
        HarnessClient(log=f"sqlite:///{empty}")
    with pytest.raises(LogUnavailable, match="is not a harness log: it holds the tables bar, foo"):
        HarnessClient(log=f"sqlite:///{app}")
    assert files_of(tmp_path) == before


async def test_a_new_or_empty_file_still_becomes_a_log_for_a_worker(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (empty, tmp_path / "new.db"):
        log = open_log(f"sqlite:///{path}")
        try:
            assert (await log.submit(InputMessage("s-1", 0, "in-1", "hi"))).seq == 1
        finally:
            await log.close()
        async with HarnessClient(log=f"sqlite:///{path}") as client:  # a log now: a client opens it
            assert [e.seq for e in await client.log.read("s-1")] == [1]


async def test_a_reader_reads_the_log_changes_no_byte_and_takes_no_write(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    writer = SqliteLog(path)
    await writer.submit(InputMessage("s-1", 0, "in-1", "hello"))
    namespace = writer.namespace
    await writer.close()
    main = hashlib.sha256(path.read_bytes()).hexdigest()

    reader = SqliteLog(path, read_only=True)
    try:
        assert reader.read_only and reader.namespace == namespace
        assert [e.record.text for e in await reader.read("s-1")] == ["hello"]  # type: ignore[attr-defined]
        with pytest.raises(LogUnavailable, match="was opened read-only: it takes no writes"):
            await reader.submit(InputMessage("s-1", 0, "in-2", "more"))
        with pytest.raises(LogUnavailable, match="was opened read-only"):
            await reader.claim("s-1", owner="me", lease=timedelta(seconds=30))
        watcher = reader.connect_reader()  # a watcher's connection (harness tail) cannot write either
        try:
            with pytest.raises(sqlite3.OperationalError, match=r"readonly|query_only|read-only"):
                watcher.execute("DELETE FROM records")
        finally:
            watcher.close()
    finally:
        await reader.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == main


def test_a_schema_1_file_is_refused_by_a_reader_with_what_upgrades_it(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as raw:  # schema 1: no checksums, no heads
        raw.executescript(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
            "CREATE TABLE records (seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, "
            "type TEXT NOT NULL, value BLOB NOT NULL);"
            "CREATE TABLE owners (session_id TEXT PRIMARY KEY, owner TEXT, epoch INTEGER NOT NULL, lease_until REAL);"
            "INSERT INTO meta VALUES ('namespace', 'ns-one'), ('schema_version', '1');"
        )
    before = files_of(tmp_path)
    with pytest.raises(LogUnavailable, match=r"written by an older harness .*start a worker on it"):
        SqliteLog(path, read_only=True)
    assert files_of(tmp_path) == before
