"""SQLite-specific behaviour of the session log (the shared contract is in tests/conformance)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from harness.errors import (
    CorruptRecord,
    FencedError,
    LogUnavailable,
    MissingExtra,
)
from harness.log import open_log
from harness.log.memory import MemoryLog
from harness.log.sqlite import SqliteLog
from harness.records import InputMessage, StepResult

pytestmark = pytest.mark.asyncio

REPO = Path(__file__).resolve().parents[2]
LEASE = timedelta(seconds=30)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "harness.db"


@pytest_asyncio.fixture
async def log(db: Path):
    log = SqliteLog(db)
    yield log
    await log.close()


def step(session: str, n: int) -> StepResult:
    return StepResult(session_id=session, ts=n, tool_call_id="call-1", name=f"step-{n}", value={"n": n})


# --- corrupt rows --------------------------------------------------------------------------


async def test_corrupt_row_raises_corrupt_record_naming_session_and_seq(log, db):
    wa = await log.claim("A", owner="w", lease=LEASE)
    wb = await log.claim("B", owner="w", lease=LEASE)
    good = await wa.append([step("A", 1), step("A", 2)])
    b_entries = await wb.append([step("B", 1)])
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE records SET value = ? WHERE seq = ?", (b"\x00garbage\xff", good[1].seq))

    with pytest.raises(CorruptRecord) as caught:
        await log.read("A")
    err = caught.value
    assert err.session_id == "A"
    assert err.seq == good[1].seq
    assert err.raw == b"\x00garbage\xff"
    assert str(good[1].seq) in str(err) and "'A'" in str(err)

    assert await log.read("B") == b_entries  # another session is unaffected
    assert await log.read("A", after=good[1].seq) == []  # reading past the bad row works
    scanned = await log.scan("A")
    assert scanned[0] == good[0] and isinstance(scanned[1], CorruptRecord)


async def test_truncated_row_raises_corrupt_record(log, db):
    wa = await log.claim("A", owner="w", lease=LEASE)
    (entry,) = await wa.append([step("A", 1)])
    await log.submit(InputMessage(session_id="B", ts=1, input_id="i", text="hi"))
    with sqlite3.connect(db) as raw:
        (value,) = raw.execute("SELECT value FROM records WHERE seq = ?", (entry.seq,)).fetchone()
        raw.execute("UPDATE records SET value = ? WHERE seq = ?", (value[: len(value) // 2], entry.seq))
    with pytest.raises(CorruptRecord) as caught:
        await log.read("A")
    assert (caught.value.session_id, caught.value.seq) == ("A", entry.seq)
    assert [e.record.session_id for e in await log.read("B")] == ["B"]


# --- durability settings --------------------------------------------------------------------


async def test_wal_and_synchronous_full_are_set(log, db):
    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent, per file
    # synchronous is per connection: ask the log's own connection, on its own thread
    sync = await log._call(lambda: log._db().execute("PRAGMA synchronous").fetchone()[0])
    assert sync == 2  # FULL
    busy = await log._call(lambda: log._db().execute("PRAGMA busy_timeout").fetchone()[0])
    assert busy == 10_000
    # the write connection: FULL too, and it never waits on the loop (a locked file
    # moves the commit to the writer thread, which waits busy_timeout)
    assert log._commits._wconn.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert log._commits._wconn.execute("PRAGMA busy_timeout").fetchone()[0] == 0


async def test_tables_and_namespace_row(log, db):
    with sqlite3.connect(db) as raw:
        tables = {name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"meta", "records", "owners"} <= tables
        (namespace,) = raw.execute("SELECT value FROM meta WHERE key = 'namespace'").fetchone()
        indexes = {name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert namespace == log.namespace
    assert "records_session_seq" in indexes


async def test_rows_hold_the_codecs_bytes(log, db):
    from harness.codec import default_codec

    writer = await log.claim("A", owner="w", lease=LEASE)
    (entry,) = await writer.append([step("A", 1)])
    with sqlite3.connect(db) as raw:
        row = raw.execute("SELECT session_id, type, value FROM records WHERE seq = ?", (entry.seq,)).fetchone()
    assert row == ("A", StepResult.TYPE, default_codec().encode(step("A", 1)))
    assert row[2][:2] == b"\xc3\x01"  # Avro single-object encoding


async def test_two_files_have_different_namespaces(tmp_path):
    one, two = SqliteLog(tmp_path / "1.db"), SqliteLog(tmp_path / "2.db")
    try:
        assert one.namespace != two.namespace
    finally:
        await one.close()
        await two.close()


async def test_closed_log_refuses_calls(db):
    log = SqliteLog(db)
    await log.close()
    with pytest.raises(LogUnavailable):
        await log.read("s")


# --- group commit ---------------------------------------------------------------------------


async def test_concurrent_appends_of_many_sessions_share_transactions(log):
    writers = [await log.claim(f"s{k}", owner="w", lease=LEASE) for k in range(50)]
    before = (log.stats.appends, log.stats.transactions)
    batches = await asyncio.gather(*(w.append([step(w.session_id, n) for n in range(3)]) for w in writers))
    appends, transactions = log.stats.appends - before[0], log.stats.transactions - before[1]
    assert appends == 50
    assert 1 <= transactions < appends  # one fsync served many appends
    for w, entries in zip(writers, batches, strict=True):
        seqs = [e.seq for e in entries]
        assert seqs == list(range(seqs[0], seqs[0] + 3))  # an append is never split
        assert await log.read(w.session_id) == entries
    all_seqs = sorted(e.seq for entries in batches for e in entries)
    assert len(set(all_seqs)) == 150


async def test_a_fenced_writer_in_a_group_fails_alone(log):
    old = await log.claim("x", owner="w1", lease=LEASE)
    await log.claim("x", owner="w1", lease=LEASE)  # fences `old` (same owner, new epoch)
    others = [await log.claim(f"s{k}", owner="w", lease=LEASE) for k in range(5)]
    before = log.stats.transactions
    results = await asyncio.gather(
        others[0].append([step("s0", 1)]),
        old.append([step("x", 1), step("x", 2)]),
        *(w.append([step(w.session_id, 1), step(w.session_id, 2)]) for w in others[1:]),
        return_exceptions=True,
    )
    assert log.stats.transactions == before + 1  # all of them in one transaction
    assert isinstance(results[1], FencedError) and results[1].session_id == "x"
    assert await log.read("x") == []
    for w, entries in zip(others, [results[0], *results[2:]], strict=True):
        assert not isinstance(entries, BaseException), entries
        assert await log.read(w.session_id) == entries


async def test_an_append_checks_ownership_in_its_positions_query_and_renews_only_when_due(db):
    now = [1000.0]
    log = SqliteLog(db, clock=lambda: now[0])
    statements: list[str] = []
    try:
        writer = await log.claim("s", owner="w", lease=LEASE)
        assert (await log.lease_info("s")).lease_until == 1030.0
        log._commits._wconn.set_trace_callback(statements.append)  # type: ignore[union-attr]
        now[0] += 9  # under a third of the lease: no renewal
        await writer.append([step("s", 1)])
        assert not any(s.startswith("UPDATE owners") for s in statements)
        # (the claim changed the owner: the positions and the owner are read, not known)
        assert [s.split()[0] for s in statements] == ["BEGIN", "PRAGMA", "SELECT", "INSERT", "INSERT", "COMMIT"]
        assert (await log.lease_info("s")).lease_until == 1030.0
        now[0] += 2  # 11 s: a third of the lease has passed: this append renews it
        await writer.append([step("s", 2)])
        assert (await log.lease_info("s")).lease_until == 1041.0
        statements.clear()
        await writer.append([step("s", 3)])  # and the next one does not
        assert not any(s.startswith("UPDATE owners") for s in statements)
        # Nobody else committed since this connection's last commit: nothing is read again.
        assert [s.split()[0] for s in statements] == ["BEGIN", "PRAGMA", "INSERT", "INSERT", "COMMIT"]
        await log.claim("s", owner="w", lease=LEASE)  # a newer claim fences it, renewal or not
        with pytest.raises(FencedError):
            await writer.append([step("s", 4)])
        now[0] += 20
        with pytest.raises(FencedError):
            await writer.append([step("s", 5)])
        assert [e.data["name"] for e in await log.read("s")] == ["step-1", "step-2", "step-3"]
    finally:
        await log.close()


async def test_an_idle_writers_append_is_flushed_by_its_own_task_in_one_loop_step(log, monkeypatch):
    writer = await log.claim("s", owner="w", lease=LEASE)
    loop = asyncio.get_running_loop()
    scheduled: list[object] = []
    real = loop.call_soon

    def call_soon(callback, *args, **kwargs):  # type: ignore[no-untyped-def]
        scheduled.append(getattr(callback, "__name__", callback))
        return real(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon", call_soon)
    before = log.stats.transactions
    for n in range(5):
        await writer.append([step("s", n)])
    monkeypatch.undo()
    assert log.stats.transactions == before + 5
    assert "_flush" not in scheduled  # no flush callback: each append committed in its own task
    assert len(await log.read("s")) == 5


async def test_writes_that_join_a_group_share_its_commit_and_a_cancelled_opener_writes_nothing(log):
    opener = await log.claim("a", owner="w", lease=LEASE)
    others = [await log.claim(f"b{k}", owner="w", lease=LEASE) for k in range(3)]
    before = log.stats.transactions
    first = asyncio.ensure_future(opener.append([step("a", 1)]))
    await asyncio.sleep(0)  # it opened the group and gives others a loop step to join
    joined = [asyncio.ensure_future(w.append([step(w.session_id, 1)])) for w in others]
    first.cancel()
    results = await asyncio.gather(first, *joined, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert all(not isinstance(r, BaseException) for r in results[1:]), results
    assert log.stats.transactions == before + 1  # the joiners landed together
    assert await log.read("a") == []
    for w, entries in zip(others, results[1:], strict=True):
        assert await log.read(w.session_id) == entries


async def test_a_database_error_fails_every_append_of_its_transaction(log, monkeypatch):
    writers = [await log.claim(f"s{k}", owner="w", lease=LEASE) for k in range(4)]
    real = log._op_append

    def failing(db, session_id, encoded, writer):
        seqs = real(db, session_id, encoded, writer)  # inserted, then the disk fails
        if session_id == "s2":
            raise sqlite3.OperationalError("disk I/O error")
        return seqs

    monkeypatch.setattr(log, "_op_append", failing)
    results = await asyncio.gather(
        *(w.append([step(w.session_id, 1)]) for w in writers), return_exceptions=True
    )
    assert all(isinstance(r, LogUnavailable) for r in results), results
    assert len({id(r) for r in results}) == 4  # each caller gets its own error
    monkeypatch.undo()
    for w in writers:
        assert await log.read(w.session_id) == []  # nothing of that transaction is visible
    (entry,) = await writers[0].append([step("s0", 2)])  # the log still works
    assert await log.read("s0") == [entry]


async def test_a_lone_write_that_fails_writes_nothing_and_the_next_one_reads_its_positions_again(log, monkeypatch):
    writer = await log.claim("s", owner="w", lease=LEASE)
    (first,) = await writer.append([step("s", 0)])
    real = log._op_append

    def failing(db, session_id, encoded, writer_):  # type: ignore[no-untyped-def]
        real(db, session_id, encoded, writer_)  # inserted (and remembered), then the disk fails
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(log, "_op_append", failing)
    before = log.stats.transactions
    with pytest.raises(LogUnavailable) as caught:
        await writer.append([step("s", 1)])  # alone: committed (here: failed) at once
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    assert log.stats.transactions == before
    monkeypatch.undo()
    assert await log.read("s") == [first]  # nothing of it is visible
    (again,) = await writer.append([step("s", 2)])  # what the failed one "wrote" is not taken as known
    assert again.seq == first.seq + 1
    assert [e.seq for e in await log.read("s")] == [first.seq, again.seq]


async def test_a_file_locked_by_another_connection_never_blocks_the_loop(log, db):
    writer = await log.claim("s", owner="w", lease=LEASE)
    other = sqlite3.connect(db, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # holds the write lock, like another process
        append = asyncio.ensure_future(writer.append([step("s", 1)]))
        ticks = 0
        for _ in range(20):  # the loop keeps running while the append waits for the lock
            await asyncio.sleep(0.005)
            ticks += 1
        assert ticks == 20 and not append.done()
        other.execute("COMMIT")
        (entry,) = await append
    finally:
        other.close()
    assert await log.read("s") == [entry]
    assert log.stats.offloaded >= 1
    (again,) = await writer.append([step("s", 2)])  # and the next one is back on the loop
    assert again.seq == entry.seq + 1
    # The writer thread waited on a connection of its own: no pragma set per commit.
    assert log._commits._wconn.execute("PRAGMA busy_timeout").fetchone()[0] == 0  # type: ignore[union-attr]
    assert log._commits._tconn.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000  # type: ignore[union-attr]


async def test_commits_run_on_the_writer_thread_when_storage_is_slow(db):
    log = SqliteLog(db, inline_commit_limit=0)  # as if every commit were slow
    try:
        writers = [await log.claim(f"s{k}", owner="w", lease=LEASE) for k in range(10)]
        batches = await asyncio.gather(
            *(w.append([step(w.session_id, 1), step(w.session_id, 2)]) for w in writers)
        )
        for w, entries in zip(writers, batches, strict=True):
            assert entries[1].seq == entries[0].seq + 1
            assert await log.read(w.session_id) == entries
        assert log.stats.offloaded == log.stats.transactions >= 1
    finally:
        await log.close()


async def test_one_log_serves_event_loops_in_several_threads(log):
    writers = [await log.claim(f"t{k}", owner="w", lease=LEASE) for k in range(4)]

    async def appends(writer):
        return [await writer.append([step(writer.session_id, n), step(writer.session_id, n + 1)]) for n in range(30)]

    # each thread runs its own loop, all of them writing through the same log at once
    results = await asyncio.gather(*(asyncio.to_thread(asyncio.run, appends(w)) for w in writers))
    for w, batches in zip(writers, results, strict=True):
        entries = [e for batch in batches for e in batch]
        assert all(b[1].seq == b[0].seq + 1 for b in batches)
        assert await log.read(w.session_id) == entries
    assert log._commits._groups == {}  # no loop is remembered once its writes landed


async def test_close_lands_the_writes_already_queued(db):
    log = SqliteLog(db)
    writer = await log.claim("s", owner="w", lease=LEASE)
    pending = [asyncio.ensure_future(writer.append([step("s", n)])) for n in range(5)]
    await asyncio.sleep(0)  # queued, not yet committed
    await log.close()
    entries = [e for p in pending for e in await p]
    with pytest.raises(LogUnavailable):
        await writer.append([step("s", 9)])
    again = SqliteLog(db)
    try:
        assert await again.read("s") == entries
    finally:
        await again.close()


# --- several processes on one file -------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from datetime import timedelta
    from harness.errors import SessionBusy
    from harness.log.sqlite import SqliteLog
    from harness.records import InputMessage, StepResult

    async def main(path, mode, session, owner):
        log = SqliteLog(path)
        try:
            if mode == "try_claim":
                try:
                    w = await log.claim(session, owner=owner, lease=timedelta(seconds=30))
                    return {"result": "claimed", "epoch": w.epoch}
                except SessionBusy as exc:
                    return {"result": "busy", "owner": exc.owner, "lease_until": exc.lease_until}
            if mode == "claim_when_free":
                deadline = time.monotonic() + 60
                busy = 0
                while True:
                    try:
                        w = await log.claim(session, owner=owner, lease=timedelta(seconds=30))
                        break
                    except SessionBusy:
                        busy += 1
                        if time.monotonic() > deadline:
                            return {"result": "timeout"}
                        await asyncio.sleep(0.05)
                (entry,) = await w.append(
                    [StepResult(session_id=session, ts=0, tool_call_id="c", name=owner, value=1)]
                )
                return {"result": "claimed", "epoch": w.epoch, "seq": entry.seq, "busy": busy}
            if mode == "submit_many":
                for n in range(200):
                    await log.submit(InputMessage(session_id=session, ts=n, input_id=f"{owner}-{n}", text="x"))
                return {"result": "ok"}
        finally:
            await log.close()

    print(json.dumps(asyncio.run(main(*sys.argv[1:]))))
    """
)


def run_child(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def child_result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


async def test_second_process_is_refused_while_the_lease_is_live(log, db):
    await log.claim("s", owner="parent", lease=timedelta(minutes=5))
    result = child_result(run_child(str(db), "try_claim", "s", "child"))
    assert result["result"] == "busy"
    assert result["owner"] == "parent"
    assert (await log.lease_info("s")).owner == "parent"


async def test_second_process_takes_over_after_expiry_and_fences_the_first(log, db):
    parent = await log.claim("s", owner="parent", lease=timedelta(seconds=0.5))
    await parent.append([step("s", 1)])
    # The child polls until the parent's short lease expires; never a timing assertion.
    result = child_result(run_child(str(db), "claim_when_free", "s", "child"))
    assert result["result"] == "claimed"
    assert result["epoch"] > parent.epoch

    with pytest.raises(FencedError):
        await parent.append([step("s", 2)])
    with pytest.raises(FencedError):
        await parent.renew()
    read = await log.read("s")
    assert [e.record.name for e in read] == ["step-1", "child"]
    assert read[-1].seq == result["seq"]
    assert (await log.lease_info("s")).owner == "child"


async def test_concurrent_processes_wait_for_the_lock_instead_of_failing(log, db):
    procs = [run_child(str(db), "submit_many", "s", f"p{i}") for i in range(3)]
    for n in range(50):
        await log.submit(InputMessage(session_id="s", ts=n, input_id=f"parent-{n}", text="x"))
    assert all(child_result(p)["result"] == "ok" for p in procs)
    read = await log.read("s")
    assert len(read) == 3 * 200 + 50
    assert len({e.record.input_id for e in read}) == len(read)
    for i in range(3):  # each process's submits keep their order
        mine = [e.record.ts for e in read if e.record.input_id.startswith(f"p{i}-")]
        assert mine == sorted(mine)


# --- open_log --------------------------------------------------------------------------------


async def test_open_log_sqlite_relative_and_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rel = open_log("sqlite:///rel.db")
    absolute = open_log(f"sqlite:///{tmp_path / 'abs.db'}")  # -> sqlite:////tmp/...
    try:
        assert isinstance(rel, SqliteLog) and isinstance(absolute, SqliteLog)
        assert (tmp_path / "rel.db").exists() and (tmp_path / "abs.db").exists()
        assert absolute.path == str(tmp_path / "abs.db")
    finally:
        await rel.close()
        await absolute.close()


async def test_open_log_memory_and_unknown_scheme():
    log = open_log("memory:", namespace="ns-1")
    assert isinstance(log, MemoryLog) and log.namespace == "ns-1"
    with pytest.raises(ValueError, match="memory:"):
        open_log("postgres://x")
    with pytest.raises(ValueError):
        open_log("sqlite:///")
    with pytest.raises(ValueError, match="keywords"):
        open_log("sqlite:///x.db?busy_timeout=3")


async def test_open_log_kafka_without_the_client_is_a_missing_extra(monkeypatch):
    import importlib.util

    monkeypatch.setitem(sys.modules, "harness.log.kafka", None)  # import fails
    monkeypatch.setitem(sys.modules, "harness.log.kafka.log", None)  # even when an earlier test imported it
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "confluent_kafka" else real_find_spec(name, *a)
    )
    with pytest.raises(MissingExtra) as caught:
        open_log("kafka://127.0.0.1:9092")
    assert caught.value.extra == "kafka"


async def test_open_log_kafka_other_import_errors_propagate(monkeypatch):
    import importlib.util

    monkeypatch.setitem(sys.modules, "harness.log.kafka", None)
    monkeypatch.setitem(sys.modules, "harness.log.kafka.log", None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # client "installed"
    with pytest.raises(ImportError) as caught:
        open_log("kafka://127.0.0.1:9092")
    assert not isinstance(caught.value, MissingExtra)
