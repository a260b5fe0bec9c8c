"""What a listing of every session reads of a SQLite file: the records of a few types,
each session's last record, and where the log ends, from one snapshot.

A summary of a session with no turn in progress needs its inputs, settlements, turn
starts and ends and model usage (:mod:`harness.runtime.session_digest` says why), and
the time of its last record: a small share of the file (step results, model responses
and tool results, the bulk of it, are left in it: SQLite reads their pages but neither
they nor their checks reach Python). Each row read is checked as every read checks it
(:func:`~harness.log.sqlite_schema.verify_rows`), except that its session's chain
cannot be followed through the rows not read: instead the row's predecessor (its
``prev``, covered by its CRC) must exist in the same session, which a lost row fails.
A session's last record comes through ``heads``, whose row is checked too.

No new index: an index on ``type`` would cost every commit one more page. The ``type IN``
filter is a scan of ``records`` in SQLite's C code (~0.1 s at 200k rows).

A session with a stored summary (:mod:`harness.log.sqlite_summaries`) whose position is
its head, and whose head row checks, is not read at all: its summary is the stored one
(a record of it damaged since is found by the next read of that session, not by the
listing). The others are read as above: when they are few (at most a quarter of
the sessions, and every head row checks) session by session through
``records_session_seq``, else by the scan, the rows of the sessions with a summary left
out. So a file whose sessions are mostly quiet and summarized lists in a time that grows
with the sessions, not with their records. As a restart from a checkpoint does, such a
listing takes the sessions of ``heads`` for every session of the file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.errors import CorruptRecord
from harness.log.sqlite_schema import _corrupt, head_crc, verify_rows
from harness.log.sqlite_summaries import PREFIX, decode_summary, summary_crc
from harness.views import SessionSummary

__all__ = ["ListingRows", "select_listing", "select_sources"]

_COLUMNS = "r.seq, r.session_id, r.type, r.value, r.prev, r.crc"
_PREDECESSOR = (  # 1 when the row has no predecessor or its predecessor is there, in its session
    "(r.prev IS NULL OR r.prev = 0 OR EXISTS "
    "(SELECT 1 FROM records p WHERE p.seq = r.prev AND p.session_id = r.session_id))"
)
_HEADS = f"SELECT h.session_id, h.last_seq, h.crc, {_COLUMNS} FROM heads h LEFT JOIN records r ON r.seq = h.last_seq"
_HEADS_STORED = (
    "SELECT h.session_id, h.last_seq, h.crc, s.last_seq, s.summary, s.crc FROM heads h "
    "LEFT JOIN summaries s ON s.session_id = h.session_id"
)
_LAST = f"SELECT {_COLUMNS} FROM records r WHERE r.seq = ?"
_UNSUMMARIZED = (  # the sessions whose stored summary is missing, not of their head or of another format
    "SELECT h.session_id, h.last_seq FROM heads h LEFT JOIN summaries s ON s.session_id = h.session_id "
    "WHERE s.session_id IS NULL OR s.last_seq != h.last_seq OR substr(s.summary, 1, ?) != ? "
    "ORDER BY h.last_seq DESC LIMIT ?"
)
_NO_ROW = (None,) * 6
BY_SESSION_SHARE = 4
"""The sessions to read are read one by one when they are at most 1/this of them (else the scan)."""


@dataclass(frozen=True, slots=True)
class ListingRows:
    """Checked rows (``(seq, session_id, value)`` or the ``CorruptRecord`` of a bad one).

    Attributes:
        rows: the records of the types asked for, in log order (none of the sessions of
            ``stored``).
        lasts: each session of ``heads`` without a usable stored summary -> its last
            record (a ``CorruptRecord`` when that record, or the head row naming it, does
            not check).
        end: the log's last position in the snapshot read.
        stored: the sessions whose stored summary is their summary -> it.
        damaged: the stored summaries that do not check (a changed byte).
    """

    rows: list[tuple[int, str, bytes] | CorruptRecord]
    lasts: dict[str, tuple[int, str, bytes] | CorruptRecord]
    end: int
    stored: dict[str, SessionSummary] = field(default_factory=dict)
    damaged: int = 0


def select_listing(db: sqlite3.Connection, types: Collection[str]) -> ListingRows:
    """The records of ``types``, every session's last record (or stored summary) and the
    log's end, from one snapshot, checked (on the reader thread)."""
    wanted = sorted(types)
    db.text_factory = bytes  # text as read: a flipped bit is a bad row, not a UnicodeDecodeError
    db.execute("BEGIN")
    try:
        try:
            heads = db.execute(_HEADS_STORED).fetchall()
        except sqlite3.OperationalError as exc:  # a file made before stored summaries, opened read-only
            if "no such table" not in str(exc):
                raise
            heads = []
        stored, damaged, todo, heads_check = _stored(heads)
        if stored and heads_check and len(todo) * BY_SESSION_SHARE <= len(heads):
            lasts = _lasts([(sid_raw, last_seq, crc, *_last(db, last_seq)) for sid_raw, last_seq, crc in todo])
            rows = _by_session(db, lasts, wanted)
        else:
            leave = {sid.encode() for sid in stored}
            lasts = _lasts([row for row in db.execute(_HEADS).fetchall() if row[0] not in leave])
            rows = _scan(db, wanted, leave)
        (end,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM records").fetchone()
    finally:
        db.execute("COMMIT")
        db.text_factory = str
    return ListingRows(_checked(rows), lasts, int(end), stored, damaged)


def select_sources(
    db: sqlite3.Connection, types: Collection[str], skip: Mapping[str, int | None], limit: int
) -> tuple[ListingRows, bool]:
    """What the summaries of up to ``limit`` sessions are made of (as a listing reads
    them): the sessions whose stored summary is missing or stale, the latest changed
    first, but those of ``skip`` (session -> its head when it was skipped, None: always);
    and whether more are left. Empty on a file with no ``summaries`` table."""
    wanted = sorted(types)
    db.text_factory = bytes
    db.execute("BEGIN")
    try:
        try:
            found = db.execute(_UNSUMMARIZED, (len(PREFIX), PREFIX, limit + len(skip) + 1)).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            found = []
        chosen: list[str] = []
        for sid_raw, last_seq in found:
            sid = _sid(sid_raw)
            if sid in skip and skip[sid] in (None, last_seq):
                continue
            chosen.append(sid)
        more = len(chosen) > limit
        chosen = chosen[:limit]
        heads: list[tuple[Any, ...]] = []
        for sid in chosen:
            heads.extend(db.execute(_HEADS + " WHERE h.session_id = ?", (sid,)).fetchall())  # (checked anew)
        lasts = _lasts(heads)
        rows = _by_session(db, lasts, wanted)
        (end,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM records").fetchone()
    finally:
        db.execute("COMMIT")
        db.text_factory = str
    return ListingRows(_checked(rows), lasts, int(end)), more


def _scan(db: sqlite3.Connection, wanted: list[str], leave: set[bytes]) -> list[tuple[Any, ...]]:
    marks = ", ".join("?" for _ in wanted)
    rows = db.execute(
        f"SELECT {_COLUMNS}, {_PREDECESSOR} FROM records r WHERE r.type IN ({marks}) ORDER BY r.seq", wanted
    ).fetchall()
    return [row for row in rows if row[1] not in leave] if leave else rows


def _by_session(db: sqlite3.Connection, sessions: Collection[str], wanted: list[str]) -> list[tuple[Any, ...]]:
    marks = ", ".join("?" for _ in wanted)
    query = (
        f"SELECT {_COLUMNS}, {_PREDECESSOR} FROM records r "
        f"WHERE r.session_id = ? AND r.type IN ({marks}) ORDER BY r.seq"
    )
    rows: list[tuple[Any, ...]] = []
    for sid in sessions:
        rows.extend(db.execute(query, (sid, *wanted)).fetchall())
    rows.sort(key=lambda row: row[0])
    return rows


def _last(db: sqlite3.Connection, seq: Any) -> tuple[Any, ...]:
    found = db.execute(_LAST, (seq,)).fetchall() if isinstance(seq, int) else []
    return tuple(found[0]) if found else _NO_ROW


def _stored(
    heads: list[tuple[Any, ...]],
) -> tuple[dict[str, SessionSummary], int, list[tuple[Any, Any, Any]], bool]:
    """``(the stored summaries usable, how many stored rows do not check, the head rows
    of the other sessions, whether every head row checks)``."""
    stored: dict[str, SessionSummary] = {}
    damaged = 0
    todo: list[tuple[Any, Any, Any]] = []
    heads_check = True
    for sid_raw, last_seq, crc, s_last, body, s_crc in heads:
        sid = _sid(sid_raw)
        head_ok = isinstance(sid_raw, bytes) and isinstance(last_seq, int) and crc == head_crc(sid, last_seq)
        heads_check = heads_check and head_ok
        summary = None
        if s_last is None and body is None:
            pass
        elif (
            not isinstance(s_last, int)
            or not isinstance(body, bytes)
            or not isinstance(sid_raw, bytes)
            or s_crc != summary_crc(sid_raw, s_last, body)
        ):
            damaged += 1
        elif head_ok and s_last == last_seq:  # else stale: records came since
            summary = decode_summary(sid, body)  # (None: of another format)
        if summary is not None:
            stored[sid] = summary
        else:
            todo.append((sid_raw, last_seq, crc))
    return stored, damaged, todo, heads_check


def _checked(rows: list[tuple[Any, ...]]) -> list[tuple[int, str, bytes] | CorruptRecord]:
    checked = verify_rows([row[:6] for row in rows], session_id=None, after=0, chained=False)
    for k, (row, item) in enumerate(zip(rows, checked, strict=True)):
        if row[6] != 1 and not isinstance(item, CorruptRecord):
            seq, sid, raw = item
            checked[k] = _corrupt(sid, seq, raw, f"the record before it (seq={row[4]}) is missing")
    return checked


def _lasts(heads: list[tuple[Any, ...]]) -> dict[str, tuple[int, str, bytes] | CorruptRecord]:
    lasts: dict[str, tuple[int, str, bytes] | CorruptRecord] = {}
    for sid_raw, last_seq, crc, *row in heads:
        sid = _sid(sid_raw)
        if not isinstance(last_seq, int) or crc != head_crc(sid, last_seq):
            lasts[sid] = _corrupt(sid, None, b"", "the session's head row has a changed byte")
        elif row[0] is None:
            lasts[sid] = _corrupt(sid, last_seq, b"", f"its last record (seq={last_seq}) is missing")
        else:
            (lasts[sid],) = verify_rows([tuple(row)], session_id=sid, after=0, chained=False)
    return lasts


def _sid(raw: Any) -> str:
    return bytes(raw).decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
