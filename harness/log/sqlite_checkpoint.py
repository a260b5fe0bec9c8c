"""The SQLite log's checkpoint: where a worker's restart starts reading.

One row (``checkpoint``, id 1) says, as of a log position ``covers``, which sessions
were not ended (``live``: the driven ones, and the parked ones, whose unreadable
record must be found again). Every other session with a row in ``heads`` had ended by
then, or began after ``covers``. So a restart reads the ``live`` sessions whole through
``records_session_seq`` (each read checks every record's CRC and the session's chain up
to its head, as a full read does: a damaged record of a live session parks it just the
same), lists the ended ones from ``heads`` without reading them, and reads the records
after ``covers`` in log order. Unlike a Kafka checkpoint it holds no record, only ids:
everything the restart uses is read from the records themselves.

The row is written by the worker that owns the file, on a connection and in a
transaction of its own (never in a group commit: a step's commit writes no page more),
at most every ``CHECKPOINT_EVERY_RECORDS`` records or ``CHECKPOINT_EVERY_S``, and
when the worker stops (if anything came since the last). Several
processes may write it: a write keeps the row whose ``covers`` is the highest, and any
row is true whoever wrote it (it only says what the log held up to ``covers``, which
never changes). A row that is damaged (its CRC), of another ``VERSION``, or that covers
more than the file holds (a file put back from a copy) is not used: the restart reads
the whole file, as without a checkpoint, and says why; the next write replaces it. No table (a file made before
checkpoints, opened read-only since) reads as no checkpoint. The table (in
``sqlite_schema.SCHEMA``) is made by ``CREATE TABLE IF NOT EXISTS`` when a writer opens the file: no schema version of its
own, and a harness that does not know it leaves it alone (its records after ``covers``
are the tail the next restart reads).
"""

from __future__ import annotations

import json
import sqlite3
import struct
import zlib
from collections.abc import Collection
from dataclasses import dataclass

from harness.log.sqlite_schema import head_crc

__all__ = ["VERSION", "NoCheckpoint", "Stored", "select_checkpoint", "select_heads", "upsert_checkpoint"]

VERSION = 1
"""The row's format; a row of another version is not used (the restart reads it all)."""

_UPSERT = (
    "INSERT INTO checkpoint (id, version, covers, live, crc) VALUES (1, ?, ?, ?, ?) "
    "ON CONFLICT(id) DO UPDATE SET version = excluded.version, covers = excluded.covers, live = excluded.live, "
    "crc = excluded.crc WHERE excluded.covers > checkpoint.covers OR checkpoint.version != excluded.version"
)


@dataclass(frozen=True, slots=True)
class Stored:
    """A checkpoint as read: every session not ended as of ``covers``."""

    covers: int
    live: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NoCheckpoint:
    """Why there is no checkpoint to use; ``damaged``: one is there but cannot be trusted
    (said at WARNING; none yet, or of another version, at INFO)."""

    why: str
    damaged: bool = False


def _crc(version: int, covers: int, live: bytes) -> int:
    return zlib.crc32(live, zlib.crc32(struct.pack(">qq", version, covers)))


def upsert_checkpoint(db: sqlite3.Connection, covers: int, live: Collection[str]) -> bool:
    """Write the checkpoint in ``db``'s open transaction, unless one covers as much
    already; whether it was written. A stored row that cannot be used (damaged, or
    covering more than the file) is replaced whatever it covers: kept, a changed byte in
    its ``covers`` would keep every later checkpoint out and each restart would read the
    whole file."""
    body = json.dumps(sorted(live), separators=(",", ":")).encode()
    stored = select_checkpoint(db)
    if isinstance(stored, NoCheckpoint) and stored.damaged:
        db.execute("DELETE FROM checkpoint WHERE id = 1")
    cur = db.execute(_UPSERT, (VERSION, covers, body, _crc(VERSION, covers, body)))
    return cur.rowcount == 1


def select_checkpoint(db: sqlite3.Connection) -> Stored | NoCheckpoint:
    """The checkpoint, or why there is none to use (one line, for the worker's log)."""
    try:
        row = db.execute("SELECT version, covers, live, crc FROM checkpoint WHERE id = 1").fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        return NoCheckpoint("the file has no checkpoint table yet (made before checkpoints)")
    if not row:
        return NoCheckpoint("the file has no checkpoint yet")
    version, covers, live, crc = row[0]
    if version != VERSION:
        return NoCheckpoint(f"its checkpoint is of version {version!r}, this harness reads version {VERSION}")
    body = bytes(live) if isinstance(live, bytes | bytearray | memoryview) else str(live).encode()
    if not isinstance(covers, int) or crc != _crc(VERSION, covers, body):
        return NoCheckpoint("its checkpoint's checksum does not match (a changed byte)", damaged=True)
    try:
        ids = json.loads(body)
    except ValueError:
        return NoCheckpoint("its checkpoint cannot be decoded", damaged=True)
    if not isinstance(ids, list) or not all(isinstance(sid, str) for sid in ids):
        return NoCheckpoint("its checkpoint cannot be decoded", damaged=True)
    (end,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM records").fetchone()
    if covers > end:
        return NoCheckpoint(
            f"its checkpoint covers position {covers} but the log ends at {end} (the file was put back from a copy?)",
            damaged=True,
        )
    return Stored(covers=covers, live=tuple(ids))


def select_heads(db: sqlite3.Connection) -> tuple[list[str], int]:
    """Every session of the file (one ``heads`` row each), and how many rows fail their
    check (a changed byte: the caller cannot know which session it was)."""
    sessions: list[str] = []
    bad = 0
    db.text_factory = bytes
    try:
        rows = db.execute("SELECT session_id, last_seq, crc FROM heads").fetchall()
    finally:
        db.text_factory = str
    for raw, last_seq, crc in rows:
        try:
            sid = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            bad += 1
            continue
        if crc != head_crc(sid, last_seq):
            bad += 1
            continue
        sessions.append(sid)
    return sessions, bad
