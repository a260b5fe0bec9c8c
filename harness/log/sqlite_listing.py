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
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from harness.errors import CorruptRecord
from harness.log.sqlite_schema import _corrupt, head_crc, verify_rows

__all__ = ["ListingRows", "select_listing"]

_COLUMNS = "r.seq, r.session_id, r.type, r.value, r.prev, r.crc"
_PREDECESSOR = (  # 1 when the row has no predecessor or its predecessor is there, in its session
    "(r.prev IS NULL OR r.prev = 0 OR EXISTS "
    "(SELECT 1 FROM records p WHERE p.seq = r.prev AND p.session_id = r.session_id))"
)


@dataclass(frozen=True, slots=True)
class ListingRows:
    """Checked rows (``(seq, session_id, value)`` or the ``CorruptRecord`` of a bad one).

    Attributes:
        rows: the records of the types asked for, in log order.
        lasts: each session of ``heads`` -> its last record (a ``CorruptRecord`` when
            that record, or the head row naming it, does not check).
        end: the log's last position in the snapshot read.
    """

    rows: list[tuple[int, str, bytes] | CorruptRecord]
    lasts: dict[str, tuple[int, str, bytes] | CorruptRecord]
    end: int


def select_listing(db: sqlite3.Connection, types: Collection[str]) -> ListingRows:
    """The records of ``types``, every session's last record and the log's end, from one
    snapshot, checked (on the reader thread)."""
    wanted = sorted(types)
    marks = ", ".join("?" for _ in wanted)
    db.text_factory = bytes  # text as read: a flipped bit is a bad row, not a UnicodeDecodeError
    db.execute("BEGIN")
    try:
        rows = db.execute(
            f"SELECT {_COLUMNS}, {_PREDECESSOR} FROM records r WHERE r.type IN ({marks}) ORDER BY r.seq", wanted
        ).fetchall()
        heads = db.execute(
            f"SELECT h.session_id, h.last_seq, h.crc, {_COLUMNS} FROM heads h LEFT JOIN records r ON r.seq = h.last_seq"
        ).fetchall()
        (end,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM records").fetchone()
    finally:
        db.execute("COMMIT")
        db.text_factory = str
    return ListingRows(_checked(rows), _lasts(heads), int(end))


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
        sid = bytes(sid_raw).decode("utf-8", "replace") if isinstance(sid_raw, bytes) else str(sid_raw)
        if not isinstance(last_seq, int) or crc != head_crc(sid, last_seq):
            lasts[sid] = _corrupt(sid, None, b"", "the session's head row has a changed byte")
        elif row[0] is None:
            lasts[sid] = _corrupt(sid, last_seq, b"", f"its last record (seq={last_seq}) is missing")
        else:
            (lasts[sid],) = verify_rows([tuple(row)], session_id=sid, after=0, chained=False)
    return lasts
