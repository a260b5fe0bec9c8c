"""A SQLite listing reads a few record types of each session, not every record, and lists
exactly what a fold of every record lists: on a rich file (sessions completed, failed,
waiting, sleeping, queued, cancelled, with usage and app records, and damaged rows),
through ``list_sessions``, a kept ``SessionIndex`` and the real ``harness sessions --json``."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness import open_log
from harness.codec import default_codec
from harness.errors import CorruptRecord
from harness.log import _encode_batch
from harness.log.sqlite_schema import append_rows
from harness.records import (
    AppRecord,
    AskAnswered,
    AskOpened,
    InputAnswer,
    InputCancel,
    InputMessage,
    InputRecords,
    InputSettled,
    ModelResponseRecord,
    ModelUsage,
    Record,
    SleepScheduled,
    StepResult,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnResumed,
    TurnStarted,
)
from harness.replay import fold
from harness.runtime.catalog import SessionIndex, list_sessions, sort_summaries
from harness.runtime.session_digest import SUMMARY_TYPES
from harness.runtime.session_index import split_readable
from harness.views import summarize

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000
LATER = 4_000_000_000_000  # a wake time far ahead of any test's clock
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


def turn(sid: str, ts: int, n: int, input_id: str, *, outcome: str = "completed", code: str | None = None,
         cost: float | None = 0.25, settle: bool = True) -> list[Record]:
    """A message and its turn: a tool call (a step, an app record), usage, the final answer."""
    call = f"c{n}"
    records: list[Record] = [
        InputMessage(sid, ts, input_id, f"do {n}", "rich"),
        TurnStarted(sid, ts + 1, input_id, n),
        ModelResponseRecord(sid, ts + 2, n, 0, "working " * 20, ({"id": call, "name": "work", "arguments": {}},)),
        ModelUsage(sid, ts + 2, n, 0, "m", 100, 20, cost),
        ToolStarted(sid, ts + 3, call, "work", 1),
        StepResult(sid, ts + 4, call, "s0", {"big": "x" * 500}),
        AppRecord(sid, ts + 5, "app.note", {"type": "app.note", "n": n}, tool_call_id=call),
        ToolResult(sid, ts + 6, call, "work", {"ok": True}),
        ModelResponseRecord(sid, ts + 7, n, 1, "done"),
        ModelUsage(sid, ts + 7, n, 1, "m", 50, 10, cost),
        TurnFinished(sid, ts + 8, input_id, n, outcome, "done", code),
    ]
    if settle:
        records.append(InputSettled(sid, ts + 9, input_id, outcome, code))
    return records


def open_turn(sid: str, ts: int, what: list[Record]) -> list[Record]:
    """A message whose turn's tool call is still open, stopped at ``what``."""
    call = {"id": "c1", "name": "work", "arguments": {}}
    return [
        InputMessage(sid, ts, "m1", "go", "rich"),
        TurnStarted(sid, ts + 1, "m1", 1),
        ModelResponseRecord(sid, ts + 2, 1, 0, "on it", (call,)),
        ModelUsage(sid, ts + 2, 1, 0, "m", 10, 2, None),
        ToolStarted(sid, ts + 3, "c1", "work", 1),
        *what,
    ]


def rich_sessions(ts: int) -> dict[str, list[Record]]:
    s: dict[str, list[Record]] = {}
    s["done"] = turn("done", ts, 1, "m1") + turn("done", ts + 100, 2, "m2", cost=None)
    s["failed"] = turn("failed", ts + 200, 1, "m1", outcome="failed", code="tool_error")
    s["waiting"] = open_turn("waiting", ts + 300, [AskOpened("waiting", ts + 304, "c1", "ok", "Approve?", SCHEMA)])
    s["sleeping"] = open_turn("sleeping", ts + 400, [SleepScheduled("sleeping", ts + 404, "c1", "nap", LATER)])
    s["answered"] = [
        *open_turn("answered", ts + 500, [AskOpened("answered", ts + 504, "c1", "ok", "Approve?", SCHEMA)]),
        InputAnswer("answered", ts + 505, "a1", "c1", "ok", {"ok": True}),
        AskAnswered("answered", ts + 506, "c1", "ok", {"ok": True}, "a1"),
        InputSettled("answered", ts + 506, "a1", "completed"),
        TurnResumed("answered", ts + 507, "m1", 1, 2, False),
        ToolResult("answered", ts + 508, "c1", "work", True),
        ModelResponseRecord("answered", ts + 509, 1, 1, "approved"),
        TurnFinished("answered", ts + 510, "m1", 1, "completed", "approved"),
        InputSettled("answered", ts + 510, "m1", "completed"),
    ]
    s["answer-pending"] = [
        *open_turn("answer-pending", ts + 600, [AskOpened("answer-pending", ts + 604, "c1", "ok", "Approve?", SCHEMA)]),
        InputAnswer("answer-pending", ts + 605, "a1", "c1", "ok", {"ok": True}),
    ]
    s["queued"] = [*turn("queued", ts + 700, 1, "m1"), InputMessage("queued", ts + 720, "m2", "more", "rich")]
    s["cancelled"] = [
        *open_turn("cancelled", ts + 800, [StepResult("cancelled", ts + 804, "c1", "s0", 1)]),
        InputCancel("cancelled", ts + 805, "cancel:m1", "m1"),
        TurnFinished("cancelled", ts + 806, "m1", 1, "aborted", None, "cancelled"),
        InputSettled("cancelled", ts + 806, "m1", "aborted", "cancelled"),
        InputSettled("cancelled", ts + 806, "cancel:m1", "completed"),
    ]
    s["records"] = [
        InputRecords("records", ts + 900, "r1", [{"type": "app.fact", "v": 1}]),
        InputSettled("records", ts + 901, "r1", "completed"),
        AppRecord("records", ts + 902, "app.free", {"type": "app.free"}),
    ]
    s["running"] = [InputMessage("running", ts + 1000, "m1", "go", "rich")]
    s["other-harness"] = turn("other-harness", ts + 1100, 1, "m1")
    s["other-harness"][0] = InputMessage("other-harness", ts + 1100, "m1", "go", "second")
    # damaged rows (see damage()): a turn's end, a step result, a session's last record, a lost row
    s["bad-end"] = turn("bad-end", ts + 1200, 1, "m1") + turn("bad-end", ts + 1300, 2, "m2")
    s["bad-step"] = turn("bad-step", ts + 1400, 1, "m1")
    s["bad-last"] = turn("bad-last", ts + 1500, 1, "m1")
    s["lost-row"] = turn("lost-row", ts + 1600, 1, "m1")
    return s


def build(path: Path) -> None:
    """The rich file, written as a worker writes it (each session's records in batches),
    then damaged on disk."""
    log = open_log(f"sqlite:///{path}")
    del log  # its tables and namespace
    codec = default_codec()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    sessions = rich_sessions(T0)
    # interleaved, a few records of each in turn, as sessions run side by side
    cursor = dict.fromkeys(sessions, 0)
    while any(cursor[sid] < len(records) for sid, records in sessions.items()):
        for sid, records in sessions.items():
            batch = records[cursor[sid]: cursor[sid] + 3]
            if batch:
                append_rows(db, sid, _encode_batch(codec, sid, batch))
                cursor[sid] += len(batch)
    db.execute("COMMIT")
    damage(db)
    db.close()


def _seq(db: sqlite3.Connection, sid: str, type_: str, nth: int = -1) -> int:
    seqs = [s for (s,) in db.execute("SELECT seq FROM records WHERE session_id = ? AND type = ? ORDER BY seq",
                                     (sid, type_))]
    return int(seqs[nth])


def _flip(db: sqlite3.Connection, seq: int) -> None:
    (value,) = db.execute("SELECT value FROM records WHERE seq = ?", (seq,)).fetchone()
    changed = bytearray(value)
    changed[-1] ^= 0x01
    db.execute("UPDATE records SET value = ? WHERE seq = ?", (bytes(changed), seq))


def damage(db: sqlite3.Connection) -> None:
    _flip(db, _seq(db, "bad-end", "harness.turn.finished"))  # its second turn reads as running
    _flip(db, _seq(db, "bad-step", "harness.step.result"))
    (last,) = db.execute("SELECT last_seq FROM heads WHERE session_id = 'bad-last'").fetchone()
    _flip(db, last)
    lost = _seq(db, "lost-row", "harness.model.response")  # the final answer: its usage follows it
    db.execute("DELETE FROM records WHERE seq = ?", (lost,))


async def folded(path: Path, now_ms: int) -> tuple[list[dict[str, Any]], int]:
    """The listing as the full read made it: every record of the file, checked in one
    read, folded per session; (its JSON, the records that did not check or decode)."""
    log = open_log(f"sqlite:///{path}")
    try:
        items = await log.scan(None)
    finally:
        await log.close()
    good, unreadable = split_readable(items)
    by_session: dict[str, list[Any]] = defaultdict(list)
    for entry in good:
        by_session[entry.session_id].append(entry)
    # The quick listing reads a few record types (and each session's last record): an
    # unreadable record among those makes its session ``unreadable`` there (one of another
    # type shows in ``harness show`` and the gateway's session view, which read them all).
    bad = {i.seq for i in items if isinstance(i, CorruptRecord)}
    with sqlite3.connect(path) as raw:
        rows = raw.execute("SELECT seq, session_id, type FROM records").fetchall()
    lasts = {sid: seq for seq, sid, _ in sorted(rows)}
    damaged = Counter(sid for seq, sid, type_ in rows
                      if seq in bad and (type_ in SUMMARY_TYPES or lasts[sid] == seq))
    summaries = [
        summarize(fold(sid, entries), now_ms=now_ms, last_activity_ms=max(e.record.ts for e in entries),
                  unreadable=damaged[sid])
        for sid, entries in by_session.items()
    ]
    return [s.to_json() for s in sort_summaries(summaries)], unreadable


def every_record_folded(path: Path, now_ms: int) -> tuple[list[dict[str, Any]], int]:
    return asyncio.run(folded(path, now_ms))


class FullRead:
    """A log without ``scan_listing``: the index reads every record, as before."""

    def __init__(self, log: Any) -> None:
        self._log = log
        self.by_id: list[str] = []
        self.whole = 0

    async def scan(self, session_id: str | None = None, **kwargs: Any) -> Any:
        items = await self._log.scan(session_id, **kwargs)
        if session_id is None:
            self.whole += len(items)
        else:
            self.by_id.append(session_id)
        return items


class Spy(FullRead):
    async def scan_listing(self, types: Any) -> Any:
        return await self._log.scan_listing(types)


def _json(summaries: list[Any]) -> list[dict[str, Any]]:
    return [s.to_json() for s in sort_summaries(summaries)]


def test_the_oracle_sees_every_kind_of_session(tmp_path: Path) -> None:
    """The rich file is rich: every state, usage with and without cost, damaged rows."""
    path = tmp_path / "rich.db"
    build(path)
    listed, unreadable = every_record_folded(path, T0 + 10_000)
    by_id = {s["session_id"]: s for s in listed}
    assert {s["state"] for s in listed} == {"running", "waiting", "sleeping", "idle", "failed", "unreadable"}
    assert by_id["waiting"]["open_asks"] and by_id["sleeping"]["sleeping_until"] == LATER
    assert by_id["done"]["usage"] == {"calls": 4, "input_tokens": 300, "output_tokens": 60, "cost": 0.5}
    # its lost end: folded without it the turn would read as running; it is unreadable
    assert by_id["bad-end"]["state"] == "unreadable" and by_id["bad-end"]["turns"] == 2
    assert by_id["lost-row"]["usage"]["calls"] == 1  # the usage after the lost row is refused
    assert by_id["cancelled"]["last_outcome"] == "aborted"
    assert by_id["other-harness"]["harness"] == "second"
    assert unreadable == 4


async def test_a_listing_reads_a_few_types_and_lists_what_a_fold_of_every_record_lists(tmp_path: Path) -> None:
    path = tmp_path / "rich.db"
    build(path)
    now = T0 + 10_000
    expected, _ = await folded(path, now)
    log = open_log(f"sqlite:///{path}")
    try:
        spy = Spy(log)
        quick = SessionIndex(spy)  # type: ignore[arg-type]
        assert _json(await quick.summaries(now_ms=now)) == expected
        assert spy.whole == 0  # no read of every record
        # read whole: the sessions with a turn in progress and those with a damaged record read
        assert sorted(spy.by_id) == ["answer-pending", "bad-end", "bad-last", "lost-row", "sleeping", "waiting"]
        assert quick.unreadable == 3  # the step result's damage is in a record the listing does not read

        full = SessionIndex(FullRead(log))  # type: ignore[arg-type]
        # reading every record, it also sees bad-step's damaged step result: unreadable there
        whole = {**{s["session_id"]: s for s in expected}}
        whole["bad-step"] = {**whole["bad-step"], "state": "unreadable"}
        assert _json(await full.summaries(now_ms=now)) == [whole[s["session_id"]] for s in expected]
        assert full.unreadable == 4
        assert _json(await list_sessions(log, now_ms=now)) == expected

        # the index reads on from where its first listing ended: new records are listed too
        writer = await log.claim("queued", owner="t", lease=timedelta(seconds=5))
        await writer.append([TurnStarted("queued", T0 + 5000, "m2", 2)])
        await writer.release()
        later, _ = await folded(path, now)
        assert _json(await quick.summaries(now_ms=now)) == later
        assert {s["session_id"]: s["state"] for s in later}["queued"] == "running"
    finally:
        await log.close()


def test_harness_sessions_json_on_a_rich_file_is_what_a_fold_of_every_record_lists(tmp_path: Path) -> None:
    path = tmp_path / "rich.db"
    build(path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = int(time.time() * 1000)
    done = subprocess.run([sys.executable, "-m", "harness", "sessions", "--json", "--log", f"sqlite:///{path}"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    expected, _ = every_record_folded(path, before)  # no sleep or ask expires between the two clocks
    assert listed == expected
    assert len(listed) == len(rich_sessions(T0))
    assert "records could not be decoded and were left out" in done.stderr
