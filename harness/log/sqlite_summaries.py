"""The SQLite log's stored summaries: a quiet session's summary as of its last record,
so that a listing need not read that session's records again.

One row per session (``summaries``, ``WITHOUT ROWID``): ``last_seq``, the position of
the session's last record when the summary was made, the summary (of a
:class:`~harness.views.SessionSummary`) and a CRC-32 over the three. A summary is stored only for a session with no turn in progress (``session_digest``
calls it quiet), whose summary depends on no clock: no sleep, no open ask. It is made by
the same code from the same checked rows as a listing makes it, so it is the summary of
the session's records up to ``last_seq``, and stays so: records are never changed.
Stored: a JSON array, its format first (~60 bytes a row), then the fields a quiet session's
summary can vary in.

A listing uses a row only when it checks (its CRC, its format) and its ``last_seq`` is
the session's head in ``heads`` (checked itself), and the session's last record
checks: nothing was appended since. Otherwise (no row, a stale row, a damaged one, a
row of another format) the session is read as without rows; a damaged row is counted
with the records that could not be read. A worker that starts drops the damaged rows
(:func:`delete_damaged`, before its first batch), so they are written again like missing
ones: a row damaged while its session stays quiet would otherwise stay, its head never
moving.

Rows are written by the worker that owns the file, next to its checkpoint (on a
connection and in a transaction of their own, never in a group commit), a bounded batch
at a time: the sessions whose row is missing or stale, the most recently changed first,
the live ones left out (:meth:`harness.log.sqlite.SqliteLog.summary_sources`). So a file
made before rows gets them too, a batch each sweep, once a worker runs on it. The table
(in ``sqlite_schema.SCHEMA``) is made ``IF NOT EXISTS`` when a writer opens the file (no
schema version of its own); a harness that does not know it ignores it, and a row it
leaves stale by appending is not used (its ``last_seq`` is no longer the head).
"""

from __future__ import annotations

import json
import sqlite3
import struct
import sys
import zlib
from collections.abc import Iterable
from dataclasses import fields
from typing import Any, cast

from harness.views import SESSION_STATES, SessionStateName, SessionSummary, Usage

__all__ = [
    "FORMAT",
    "PREFIX",
    "STORED_FIELDS",
    "decode_summary",
    "delete_damaged",
    "encode_summary",
    "summary_crc",
    "upsert_summaries",
]

FORMAT = 1
"""The format of a row's summary; a row of another format is not used (and is replaced).
Bump it when :class:`~harness.views.SessionSummary` changes (a test pins its fields)."""

STORED_FIELDS = (
    "session_id", "harness", "state", "last_activity", "sleeping_until", "open_asks", "turns", "last_outcome",
    "last_code", "active_input", "pending_inputs", "partial", "usage",
)
"""The fields of ``SessionSummary`` as of ``FORMAT`` (those of a quiet session that can vary
are stored, in this order, after the format: the others are what a quiet session has)."""

_FIELDS = tuple(f.name for f in fields(SessionSummary))

PREFIX = f"[{FORMAT},".encode()
"""How a row of this format begins (the worker replaces rows that do not)."""

_NO_USAGE = Usage()
_UPSERT = (
    "INSERT INTO summaries (session_id, last_seq, summary, crc) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(session_id) DO UPDATE SET last_seq = excluded.last_seq, summary = excluded.summary, "
    "crc = excluded.crc"
)


def summary_crc(session_id: str | bytes, last_seq: int, body: bytes) -> int:
    sid = session_id.encode() if isinstance(session_id, str) else bytes(session_id)
    return zlib.crc32(body, zlib.crc32(struct.pack(">q", last_seq) + sid + b"\x00"))


def encode_summary(summary: SessionSummary) -> bytes:
    """A quiet session's summary as stored: a JSON array (ValueError: a summary that
    depends on the clock, or a ``SessionSummary`` of other fields than ``FORMAT``'s)."""
    if summary.open_asks or summary.sleeping_until is not None or summary.active_input is not None or summary.partial:
        raise ValueError(f"the summary of session {summary.session_id!r} is not a quiet one")
    if _FIELDS != STORED_FIELDS:
        raise ValueError(f"SessionSummary has other fields than stored summaries of format {FORMAT}")
    u = summary.usage
    values = [FORMAT, summary.harness, summary.state, summary.last_activity, summary.turns, summary.last_outcome,
              summary.last_code, summary.pending_inputs, u.calls, u.input_tokens, u.output_tokens, u.cost]
    return json.dumps(values, separators=(",", ":")).encode()


def decode_summary(session_id: str, body: bytes) -> SessionSummary | None:
    """The summary of a row whose CRC checked (its words shared, as a listing keeps them),
    or None when it is of another format."""
    if not body.startswith(PREFIX) or _FIELDS != STORED_FIELDS:
        return None
    try:
        _, harness, state, last_activity, turns, outcome, code, pending, calls, tokens_in, tokens_out, cost = (
            json.loads(body)
        )
    except ValueError:
        return None
    if state not in SESSION_STATES:
        return None
    usage = Usage(calls, tokens_in, tokens_out, cost)
    return SessionSummary(
        session_id=session_id,
        harness=_shared(harness),
        state=cast(SessionStateName, sys.intern(state)),
        last_activity=last_activity,
        turns=turns,
        last_outcome=_shared(outcome),
        last_code=_shared(code),
        pending_inputs=pending,
        usage=_NO_USAGE if usage == _NO_USAGE else usage,
    )


def _shared(word: str | None) -> str | None:
    return None if word is None else sys.intern(word)


def _crc_of_row(session_id: Any, last_seq: Any, body: Any) -> int:
    """A row's CRC as SQL hands it over; -1 (no CRC-32) for a column of another type."""
    if not isinstance(session_id, bytes) or not isinstance(last_seq, int) or not isinstance(body, bytes):
        return -1
    return summary_crc(session_id, last_seq, body)


_DAMAGED = "harness_summary_crc(CAST(session_id AS BLOB), last_seq, summary) IS NOT crc"


def delete_damaged(db: sqlite3.Connection) -> int:
    """Delete, in ``db``'s open transaction, the rows that do not check (a changed byte:
    the CRC, or a column of another type); how many. One pass over the table in SQLite,
    each row's CRC in Python (~2 us a row)."""
    db.create_function("harness_summary_crc", 3, _crc_of_row, deterministic=True)
    return int(db.execute(f"DELETE FROM summaries WHERE {_DAMAGED}").rowcount)


def upsert_summaries(db: sqlite3.Connection, rows: Iterable[tuple[str, int, SessionSummary]]) -> int:
    """Write ``(session_id, last_seq, summary)`` rows in ``db``'s open transaction (a row
    there already is replaced: any row is true as of its ``last_seq``); how many."""
    params: list[tuple[Any, ...]] = []
    for sid, last_seq, summary in rows:
        body = encode_summary(summary)
        params.append((sid, last_seq, body, summary_crc(sid, last_seq, body)))
    db.executemany(_UPSERT, params)
    return len(params)
