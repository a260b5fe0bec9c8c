"""The SQLite log's tables: their queries, their checksums, the upgrade of older files.

Every stored record is verified when it is read, so a flipped bit on disk is a
``CorruptRecord`` at its position, never a silently changed value:

* each row carries ``prev`` (the position of the session's previous record, 0 for
  its first) and ``crc``, a CRC-32 (zlib) over ``seq, prev, session_id, type, value``:
  a flip in any of them, or a row moved to another position, fails its check;
* ``heads`` keeps each session's last position (with its own CRC): a read follows the
  ``prev`` chain from where it starts to the head, so a row an index no longer finds
  (a flip in ``records_session_seq``) is missing from the chain, and a read that
  comes back with another session's row says so;
* ``meta`` keeps a CRC of the namespace (part of every idempotency key).

Files made by schema version 1 (no checksums) are upgraded when first opened by
this version: their rows get ``prev``, ``crc`` and ``heads`` in one transaction.

Schema 3 writes fewer pages a commit than schema 2 (each page is 4 KiB more in the WAL's
fsync): ``records`` has no ``AUTOINCREMENT`` (its ``sqlite_sequence`` row was a page of
its own each commit; rows are never deleted, so ``MAX(seq)`` is the last position) and
``heads`` is ``WITHOUT ROWID`` (one b-tree keyed by the session, not a table and its
index). A schema-2 file gets the new ``heads`` when first opened (a row per session);
its ``records`` keeps ``AUTOINCREMENT`` (rebuilding every record is not worth a page).
An older version refuses a schema-3 file as of an unknown version.

A new file is made with 1 KiB pages (:data:`PAGE_SIZE`), not SQLite's 4 KiB: a step's
commit writes three pages whose changes are a few dozen bytes each, and every page is
whole in the WAL and in its fsync. The page size is fixed when a file is made; an older
file keeps its own, and both kinds are read and written alike.

The ``checkpoint`` table (one row: where a worker's restart starts reading,
:mod:`harness.log.sqlite_checkpoint`) came later within schema 3: a writer opening a
file made before it makes it (``CREATE TABLE IF NOT EXISTS``), and a harness that does
not know it ignores it. It holds no record, only which sessions were live as of a
position, so a row left behind by any version is still true. The ``summaries`` table (a
quiet session's summary as of its last record, :mod:`harness.log.sqlite_summaries`) came
the same way, and a row is used only while its position is the session's head.
"""

from __future__ import annotations

import sqlite3
import struct
import uuid
import zlib
from collections.abc import Collection, Sequence
from typing import Any

from harness.errors import CorruptRecord, LogUnavailable
from harness.log.sqlite_positions import KnownPositions

__all__ = [
    "INSERT",
    "PAGE_SIZE",
    "SCHEMA",
    "SCHEMA_VERSION",
    "append_rows",
    "head_crc",
    "migrate",
    "namespace_crc",
    "namespace_of",
    "read_namespace",
    "row_crc",
    "select_changes",
    "select_owner",
    "select_rows",
    "select_sessions",
    "user_tables",
    "verify_rows",
]

SCHEMA_VERSION = "3"

PAGE_SIZE = 1024
"""Bytes a page of a new log file (``PRAGMA page_size``, set before the file's first write).

A sequential append changes a few dozen bytes in each of three pages (its record's
leaf, its session index's, its head's) and SQLite writes each page whole into the WAL:
12 KiB a commit with 4 KiB pages, 3 KiB with these. Measured in one process on this
machine's disk, alternating blocks: a no-op ``step.do`` took 9-18 us less on a 1 KiB
file than on a 4 KiB one (512 B: no better), while a raw commit of two pages took the
same at either size. The price: a record over ~1 KiB takes overflow pages (the same
bytes as before, in more, smaller pages; reading 20 KB records is ~2.5x the SQL time,
still far below their decoding), and a file holds at most SQLite's page count limit of
pages: 1 TiB (4 TiB from SQLite 3.45, whose limit is four times higher)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    type TEXT NOT NULL,
    value BLOB NOT NULL,
    prev INTEGER,
    crc INTEGER
);
CREATE INDEX IF NOT EXISTS records_session_seq ON records (session_id, seq);
CREATE TABLE IF NOT EXISTS owners (
    session_id TEXT PRIMARY KEY,
    owner TEXT,
    epoch INTEGER NOT NULL,
    lease_until REAL
);
CREATE TABLE IF NOT EXISTS heads (
    session_id TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL,
    crc INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoint (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL,
    covers INTEGER NOT NULL,
    live BLOB NOT NULL,
    crc INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS summaries (
    session_id TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL,
    summary BLOB NOT NULL,
    crc INTEGER NOT NULL
) WITHOUT ROWID;
"""

_HEADS_WITHOUT_ROWID = (
    "CREATE TABLE heads_v3 (session_id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL, crc INTEGER NOT NULL) WITHOUT ROWID",
    "INSERT INTO heads_v3 (session_id, last_seq, crc) SELECT session_id, last_seq, crc FROM heads",
    "DROP TABLE heads",
    "ALTER TABLE heads_v3 RENAME TO heads",
)

INSERT = "INSERT INTO records (seq, session_id, type, value, prev, crc) VALUES (?, ?, ?, ?, ?, ?)"
SET_HEAD = (
    "INSERT INTO heads (session_id, last_seq, crc) VALUES (?, ?, ?) "
    "ON CONFLICT(session_id) DO UPDATE SET last_seq = excluded.last_seq, crc = excluded.crc"
)


def _b(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else bytes(text)


_NEXT = (
    "SELECT (SELECT last_seq FROM heads WHERE session_id = ?), "
    "COALESCE((SELECT MAX(seq) FROM records), 0)"
)
_NEXT_OWNED = (
    "SELECT (SELECT last_seq FROM heads WHERE session_id = ?), "
    "COALESCE((SELECT MAX(seq) FROM records), 0), "
    "(SELECT epoch FROM owners WHERE session_id = ? AND owner = ?)"
)


_pack_qq = struct.Struct(">qq").pack
_pack_q = struct.Struct(">q").pack


def row_crc(seq: int, prev: int, session_id: str | bytes, type_: str | bytes, value: bytes) -> int:
    sid = session_id.encode() if type(session_id) is str else _b(session_id)  # (_b written out: a hot path)
    kind = type_.encode() if type(type_) is str else _b(type_)
    return zlib.crc32(value, zlib.crc32(_pack_qq(seq, prev) + sid + b"\x00" + kind + b"\x00"))


def head_crc(session_id: str, last_seq: int) -> int:
    return zlib.crc32(_pack_q(last_seq) + session_id.encode())


def namespace_crc(namespace: str) -> str:
    return str(zlib.crc32(namespace.encode()))


def append_rows(
    db: sqlite3.Connection,
    session_id: str,
    encoded: Sequence[tuple[str, bytes]],
    owner: tuple[str, int] | None = None,
    known: KnownPositions | None = None,
) -> list[int] | None:
    """Insert ``encoded`` (type, bytes) as the session's next records, chained and checksummed.

    ``owner`` (owner, epoch): the same statement that reads the positions checks that
    this owner still holds the session at that epoch; if not, nothing is written and
    the answer is None (the caller raises ``FencedError``). ``known``: what the write
    connection knows since its last commit (:mod:`harness.log.sqlite_positions`); the
    positions (and the owner) it knows are not read again.
    """
    found = None if known is None else known.next_of(session_id, owner)
    if found is not None:
        prev, last = found
    else:
        if owner is None:
            head, last = db.execute(_NEXT, (session_id,)).fetchone()
        else:
            head, last, epoch = db.execute(_NEXT_OWNED, (session_id, session_id, owner[0])).fetchone()
            if epoch != owner[1]:
                if known is not None:
                    known.read(session_id, last, None)
                return None
        if known is not None:
            known.read(session_id, last, owner)
        prev = head if head is not None else 0
        last = max(last, prev)  # a damaged file whose last rows are gone: never reuse a head's position
    run = getattr(db, "statements", db).execute  # (a write connection's own cursor: none made a statement)
    if len(encoded) == 1:  # a step's one record: the loop below written out (a step's hot path)
        ((type_, value),) = encoded
        seq = last + 1
        run(INSERT, (seq, session_id, type_, value, prev, row_crc(seq, prev, session_id, type_, value)))
        run(SET_HEAD, (session_id, seq, head_crc(session_id, seq)))
        if known is not None:
            known.appended(session_id, seq)
        return [seq]
    seqs: list[int] = []
    for type_, value in encoded:
        last += 1
        run(INSERT, (last, session_id, type_, value, prev, row_crc(last, prev, session_id, type_, value)))
        seqs.append(last)
        prev = last
    if seqs:
        run(SET_HEAD, (session_id, prev, head_crc(session_id, prev)))
        if known is not None:
            known.appended(session_id, prev)
    return seqs


def migrate(db: sqlite3.Connection) -> None:
    """Upgrade a schema-1 file in the open write transaction: checksums, chains, heads."""
    columns = {name for (_, name, *_rest) in db.execute("PRAGMA table_info(records)")}
    if "crc" not in columns:
        db.execute("ALTER TABLE records ADD COLUMN prev INTEGER")
        db.execute("ALTER TABLE records ADD COLUMN crc INTEGER")
    last_of: dict[str, int] = {}
    rows = db.execute("SELECT seq, session_id, type, value FROM records ORDER BY seq").fetchall()
    for seq, sid, type_, value in rows:
        prev = last_of.get(sid, 0)
        db.execute(
            "UPDATE records SET prev = ?, crc = ? WHERE seq = ?", (prev, row_crc(seq, prev, sid, type_, bytes(value)), seq)
        )
        last_of[sid] = seq
    for sid, last in last_of.items():
        db.execute(SET_HEAD, (sid, last, head_crc(sid, last)))


def _corrupt(session_id: str | None, seq: int | None, raw: bytes, why: str) -> CorruptRecord:
    return CorruptRecord(
        f"record seq={seq} of session {session_id!r} is corrupt: {why}", session_id=session_id, seq=seq, raw=raw
    )


def verify_rows(
    rows: Sequence[tuple[Any, ...]],
    *,
    session_id: str | None,
    after: int,
    head: tuple[int, int] | None = None,
    whole: bool = False,
    chained: bool = True,
) -> list[tuple[int, str, bytes] | CorruptRecord]:
    """Check rows read (``seq, session_id, type, value, prev, crc``, in seq order; the
    text columns as bytes, so a flipped bit in them is a bad row, not a decode error).

    Returns ``(seq, session_id, value)`` per good row and a ``CorruptRecord`` per bad
    one. ``whole``: the rows are all of ``session_id``'s records after ``after`` (no
    limit), so they must end at its ``head`` (``(last_seq, crc)`` from ``heads``).
    ``chained=False``: the rows are not every record of their sessions (a listing reads
    some types only), so each is checked alone (its CRC covers its ``prev``); the caller
    checks that its predecessor exists.
    """
    out: list[tuple[int, str, bytes] | CorruptRecord] = []
    last_of: dict[str, int] = {}
    for seq, sid_raw, type_, value, prev, crc in rows:
        why = None
        if isinstance(value, bytes | bytearray | memoryview):
            raw = bytes(value)
        else:  # a changed byte in the row's header made the BLOB a number or NULL
            raw, why = str(value).encode(), "its value is not a blob (a changed byte)"
        if not isinstance(sid_raw, str | bytes) or not isinstance(type_, str | bytes):
            sid, why = str(sid_raw), "its session id or type is not text (a changed byte)"
            sid_raw = sid
        elif not isinstance(prev, int | None) or not isinstance(crc, int | None):
            why = "its chain or checksum column is not a number (a changed byte)"
        try:
            sid = _b(sid_raw).decode("utf-8")
        except UnicodeDecodeError:
            sid = _b(sid_raw).decode("utf-8", "replace")
            why = "its session id is not UTF-8 (a changed byte)"
        if why is not None:
            pass
        elif crc is not None and crc != row_crc(seq, prev, sid_raw, type_, raw):
            why = "its checksum does not match (a changed byte)"
        elif session_id is not None and sid != session_id:
            why = f"the read of session {session_id!r} found a record of session {sid!r}"
        elif prev is not None and chained:
            before = last_of.get(sid)
            if before is None and prev > max(after, 0):
                why = f"the record before it (seq={prev}) is missing"
            elif before is not None and prev != before:
                why = f"it follows seq={prev}, not seq={before}: a record in between is missing"
        last_of[sid] = seq
        out.append(_corrupt(sid, seq, raw, why) if why is not None else (seq, sid, raw))
    if whole and session_id is not None and head is not None:
        last_seq, crc = head
        seen = last_of.get(session_id)
        if crc != head_crc(session_id, last_seq):
            out.append(_corrupt(session_id, last_seq, b"", "the session's head row has a changed byte"))
        elif last_seq > after and seen != last_seq:
            out.append(
                _corrupt(session_id, last_seq, b"", f"its last record is seq={last_seq}, but the read ended at {seen}")
            )
    return out


def user_tables(conn: sqlite3.Connection) -> list[str]:
    """The tables the file holds, by name, SQLite's own (``sqlite_*``) left out."""
    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
    ).fetchall()
    return [str(name) for (name,) in rows]


def _checked_meta(meta: dict[Any, Any], path: str) -> tuple[str, str]:
    """The namespace and schema version of a ``meta`` table that holds some keys, or why not."""
    found, version = meta.get("namespace"), meta.get("schema_version")
    if found is not None and str(version).isdigit() and int(str(version)) > int(SCHEMA_VERSION):
        raise LogUnavailable(
            f"SQLite log {path!r} was written by a newer harness (schema_version {version}; this one reads up to "
            f"{SCHEMA_VERSION}): upgrade harness to open it"
        )
    if found is None or version not in ("1", "2", SCHEMA_VERSION):
        raise LogUnavailable(
            f"SQLite log {path!r} is corrupt or of an unknown version: its meta table holds {sorted(map(str, meta))} "
            f"(schema_version {version!r})"
        )
    namespace = str(found)
    if version != "1" and meta.get("namespace_crc") != namespace_crc(namespace):
        raise LogUnavailable(
            f"SQLite log {path!r} is corrupt: its namespace (part of every idempotency key) "
            "does not match its checksum"
        )
    return namespace, str(version)


def _no_namespace(conn: sqlite3.Connection, path: str) -> LogUnavailable | None:
    """Why an empty ``meta`` table refuses the file: it holds records (None: a new file)."""
    if conn.execute("SELECT 1 FROM records LIMIT 1").fetchone() is not None:
        return LogUnavailable(f"SQLite log {path!r} is corrupt: it holds records but no namespace")
    return None


def namespace_of(conn: sqlite3.Connection, path: str) -> str:
    """The file's namespace, made with the file (by the first process to open it), its
    schema upgraded to this version; a damaged ``meta`` table refuses the file."""
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if not meta:
        refused = _no_namespace(conn, path)
        if refused is not None:
            raise refused
        namespace = uuid.uuid4().hex  # a new file: the namespace never changes afterwards (idempotency keys)
        conn.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [("namespace", namespace), ("schema_version", SCHEMA_VERSION), ("namespace_crc", namespace_crc(namespace))],
        )
        return namespace
    namespace, version = _checked_meta(meta, path)
    if version == "1":  # made by an older version: checksums and chains for its rows
        migrate(conn)
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('namespace_crc', ?)", (namespace_crc(namespace),))
    elif version == "2":  # its heads as a table and an index: one b-tree instead
        for statement in _HEADS_WITHOUT_ROWID:
            conn.execute(statement)
    if version != SCHEMA_VERSION:
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
    return namespace


def read_namespace(conn: sqlite3.Connection, path: str) -> str:
    """The namespace of a log opened only to read it: checked as :func:`namespace_of`
    checks it, but nothing is made or upgraded. A schema-1 file (no checksums) is
    refused: reading it needs its upgrade, which a writer makes."""
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if not meta:
        raise _no_namespace(conn, path) or LogUnavailable(
            f"SQLite file {path!r} is not a harness log: its meta table holds no namespace"
        )
    namespace, version = _checked_meta(meta, path)
    if version == "1":
        raise LogUnavailable(
            f"SQLite log {path!r} was written by an older harness (schema_version 1) and is upgraded by the first "
            "writer that opens it: start a worker on it (or send it an input with `harness send`), then read it"
        )
    return namespace


# --- reads (on the reader thread; every statement runs to its end: a statement left
# unfinished would keep its read transaction, an old snapshot, open) ------------------------


def select_rows(
    db: sqlite3.Connection, session_id: str | None, after: int, limit: int
) -> tuple[list[tuple[Any, ...]], tuple[int, int] | None]:
    """Rows after ``after`` (of one session, or all), text as bytes, and for a whole read of
    one session (``limit`` < 0) its head, from one snapshot."""
    head = None
    db.text_factory = bytes  # text as read: a flipped bit is a bad row, not a UnicodeDecodeError
    db.execute("BEGIN")
    try:
        if session_id is None:
            rows = db.execute(
                "SELECT seq, session_id, type, value, prev, crc FROM records WHERE seq > ? ORDER BY seq LIMIT ?",
                (after, limit),
            ).fetchall()
        else:
            rows = db.execute(
                "SELECT seq, session_id, type, value, prev, crc FROM records "
                "WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (session_id, after, limit),
            ).fetchall()
            if limit < 0:
                head = db.execute("SELECT last_seq, crc FROM heads WHERE session_id = ?", (session_id,)).fetchone()
    finally:
        db.execute("COMMIT")
        db.text_factory = str
    return rows, head


def select_changes(
    db: sqlite3.Connection, after: int | None, session_ids: Collection[str]
) -> tuple[int, dict[str, list[int]]]:
    """Where the log ends, and the positions after ``after`` of records of ``session_ids``."""
    if after is None:
        (end,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM records").fetchone()
        return int(end), {}
    rows = db.execute("SELECT seq, session_id FROM records WHERE seq > ? ORDER BY seq", (after,)).fetchall()
    found: dict[str, list[int]] = {}
    for seq, sid in rows:
        if sid in session_ids:
            found.setdefault(sid, []).append(seq)
    return (rows[-1][0] if rows else after), found


def select_sessions(db: sqlite3.Connection) -> list[str]:
    rows = db.execute("SELECT session_id FROM records GROUP BY session_id ORDER BY MIN(seq)").fetchall()
    return [sid for (sid,) in rows]


def select_owner(db: sqlite3.Connection, session_id: str) -> tuple[str | None, int, float | None] | None:
    rows = db.execute("SELECT owner, epoch, lease_until FROM owners WHERE session_id = ?", (session_id,)).fetchall()
    return rows[0] if rows else None
