"""The embedded session log: one SQLite file (``sqlite:///path``).

Layout::

    meta(key PRIMARY KEY, value)               namespace (random, made with the file), schema
    records(seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id, type, value BLOB)
    owners(session_id PRIMARY KEY, owner, epoch, lease_until)

Durability: WAL with ``synchronous=FULL``; every batch is one ``BEGIN IMMEDIATE``
... ``COMMIT`` transaction, so it is fsync'd when ``append`` returns and a crash
leaves all of it or none.

Fencing: ``claim`` bumps the session's epoch. Every ``append``/``renew`` first runs
``UPDATE owners SET lease_until=? WHERE session_id=? AND epoch=? AND owner=?`` in
its transaction: no row changed means a newer claim (or a release) happened, and
the transaction rolls back with ``FencedError``. That one statement is the whole
ownership check, so an append costs one UPDATE plus its INSERTs. The lease only
decides whether a *claim* is refused (``SessionBusy``); an owner whose lease ran
out keeps writing until somebody actually claims.

Threading: sqlite3 calls block, so each log owns one worker thread with its own
connection and every call runs there through ``loop.run_in_executor``: the event
loop never blocks and the connection is only ever used from that thread. Several
processes may open the same file; ``busy_timeout`` makes a writer wait for the
lock instead of failing.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Self, TypeVar

from harness.errors import (
    CorruptRecord,
    FencedError,
    LogError,
    LogUnavailable,
    SessionBusy,
)
from harness.log import (
    _check_input,
    _Codec,
    _decode_row,
    _default_codec,
    _encode_batch,
    _lease_seconds,
    _strict,
)
from harness.log.base import LeaseInfo, LogEntry
from harness.records import Record

__all__ = ["SqliteLog", "SqliteWriter"]

T = TypeVar("T")

SCHEMA_VERSION = "1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    type TEXT NOT NULL,
    value BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS records_session_seq ON records (session_id, seq);
CREATE TABLE IF NOT EXISTS owners (
    session_id TEXT PRIMARY KEY,
    owner TEXT,
    epoch INTEGER NOT NULL,
    lease_until REAL
);
"""

_INSERT = "INSERT INTO records (session_id, type, value) VALUES (?, ?, ?)"
_FENCE = "UPDATE owners SET lease_until = ? WHERE session_id = ? AND epoch = ? AND owner = ?"

DEFAULT_BUSY_TIMEOUT = timedelta(seconds=10)
"""How long a write waits for another connection's write lock before failing."""


class SqliteLog:
    """A :class:`~harness.log.base.SessionLog` in one SQLite file.

    The constructor opens (or creates) the file and reads its namespace, waiting
    for that on the calling thread: open logs at startup, not per request.

    Args:
        path: the database file; created with its tables when missing.
        clock: seconds since the epoch, for leases. All processes sharing the file
            must use the same time base (``time.time`` by default).
        busy_timeout: how long a write waits for another writer's lock.
        codec: the record codec; ``harness.codec.default_codec()`` by default.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout: timedelta | float = DEFAULT_BUSY_TIMEOUT,
        codec: _Codec | None = None,
    ) -> None:
        self._path = str(path)
        self._clock = clock
        self._busy_seconds = busy_timeout.total_seconds() if isinstance(busy_timeout, timedelta) else float(busy_timeout)
        self._codec = codec if codec is not None else _default_codec()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harness-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        try:
            self._namespace = self._executor.submit(self._guard, self._open).result()
        except BaseException:
            self._executor.shutdown(wait=True)
            raise

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def path(self) -> str:
        return self._path

    # --- reads ---------------------------------------------------------------------------

    async def read(self, session_id: str, *, after: int | None = None) -> list[LogEntry]:
        """Committed records of ``session_id`` in order; ``CorruptRecord`` on an unreadable one."""
        return _strict(await self.scan(session_id, after=after))

    async def read_all(self, *, after: int | None = None, limit: int | None = None) -> list[LogEntry]:
        """Committed records of every session in log order (for workers polling inputs)."""
        return _strict(await self.scan(None, after=after, limit=limit))

    async def scan(
        self, session_id: str | None = None, *, after: int | None = None, limit: int | None = None
    ) -> list[LogEntry | CorruptRecord]:
        """Like ``read``/``read_all`` but an unreadable row comes back as its ``CorruptRecord``."""
        return await self._call(self._scan, session_id, after or 0, -1 if limit is None else limit)

    async def sessions(self) -> list[str]:
        """Every session with at least one record, in order of its first record."""
        return await self._call(self._sessions)

    async def lease_info(self, session_id: str) -> LeaseInfo:
        return await self._call(self._lease_info, session_id)

    # --- writes --------------------------------------------------------------------------

    async def submit(self, record: Record) -> LogEntry:
        """Append one input record (``IS_INPUT``) without ownership."""
        _check_input(record)
        encoded = _encode_batch(self._codec, record.session_id, [record])
        (seq,) = await self._call(self._append, record.session_id, encoded, None)
        return LogEntry(seq, record)

    async def claim(self, session_id: str, *, owner: str, lease: timedelta) -> SqliteWriter:
        """Become the writer of ``session_id``; fences any previous writer.

        Raises:
            SessionBusy: another owner's lease is still live. The same owner may
                claim again at once (e.g. after its own restart); that fences its
                previous writer too.
        """
        seconds = _lease_seconds(lease)
        epoch = await self._call(self._claim, session_id, owner, seconds)
        return SqliteWriter(self, session_id, owner=owner, epoch=epoch, lease_seconds=seconds)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_conn)
        self._executor.shutdown(wait=False)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- running on the log's thread -----------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise LogUnavailable(f"the SQLite log {self._path!r} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._guard, fn, *args)

    def _guard(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the log thread; database failures become ``LogUnavailable``."""
        try:
            return fn(*args)
        except sqlite3.Error as exc:
            if self._conn is not None and self._conn.in_transaction:
                self._conn.rollback()
            raise LogUnavailable(f"SQLite log {self._path!r}: {exc}") from exc

    def _open(self) -> str:
        conn = sqlite3.connect(self._path, timeout=self._busy_seconds, isolation_level=None)
        self._conn = conn
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_seconds * 1000)}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LogUnavailable(f"SQLite log {self._path!r}: cannot use WAL (journal_mode={mode})")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            # One statement at a time: executescript() would COMMIT the transaction first.
            for statement in filter(None, (s.strip() for s in _SCHEMA.split(";"))):
                conn.execute(statement)
            # INSERT OR IGNORE: the first process to create the file picks the namespace;
            # it never changes afterwards (it is part of every idempotency key).
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('namespace', ?)", (uuid.uuid4().hex,))
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
            namespace = conn.execute("SELECT value FROM meta WHERE key = 'namespace'").fetchone()[0]
            conn.execute("COMMIT")
        except BaseException:
            conn.rollback()
            raise
        return str(namespace)

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise LogUnavailable(f"the SQLite log {self._path!r} is closed")
        return self._conn

    def _scan(self, session_id: str | None, after: int, limit: int) -> list[LogEntry | CorruptRecord]:
        db = self._db()
        if session_id is None:
            rows = db.execute(
                "SELECT seq, session_id, value FROM records WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)
            ).fetchall()
        else:
            rows = db.execute(
                "SELECT seq, session_id, value FROM records WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (session_id, after, limit),
            ).fetchall()
        return [_decode_row(self._codec, sid, seq, bytes(value)) for seq, sid, value in rows]

    def _sessions(self) -> list[str]:
        rows = self._db().execute("SELECT session_id FROM records GROUP BY session_id ORDER BY MIN(seq)").fetchall()
        return [sid for (sid,) in rows]

    def _lease_info(self, session_id: str) -> LeaseInfo:
        row = self._db().execute(
            "SELECT owner, epoch, lease_until FROM owners WHERE session_id = ?", (session_id,)
        ).fetchone()
        if row is None:
            return LeaseInfo(owner=None, epoch=0, lease_until=None)
        return LeaseInfo(owner=row[0], epoch=row[1], lease_until=row[2])

    def _claim(self, session_id: str, owner: str, lease_seconds: float) -> int:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            now = self._clock()
            row = db.execute("SELECT owner, epoch, lease_until FROM owners WHERE session_id = ?", (session_id,)).fetchone()
            if row is not None:
                cur_owner, _, cur_until = row
                if cur_owner is not None and cur_owner != owner and cur_until is not None and cur_until > now:
                    raise SessionBusy(
                        f"session {session_id!r} is owned by {cur_owner!r} until {cur_until}",
                        session_id=session_id,
                        owner=cur_owner,
                        lease_until=cur_until,
                    )
            epoch = (row[1] if row is not None else 0) + 1
            db.execute(
                "INSERT OR REPLACE INTO owners (session_id, owner, epoch, lease_until) VALUES (?, ?, ?, ?)",
                (session_id, owner, epoch, now + lease_seconds),
            )
            db.execute("COMMIT")
        except BaseException:
            db.rollback()
            raise
        return epoch

    def _append(
        self, session_id: str, encoded: Sequence[tuple[str, bytes]], writer: SqliteWriter | None
    ) -> list[int]:
        """One transaction: fence check (writers only), the inserts, commit."""
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            if writer is not None:
                self._fence(db, writer)
            seqs: list[int] = []
            for type_, value in encoded:
                seq = db.execute(_INSERT, (session_id, type_, value)).lastrowid
                assert seq is not None  # an INSERT always sets it
                seqs.append(seq)
            db.execute("COMMIT")
        except BaseException:
            db.rollback()
            raise
        return seqs

    def _renew(self, writer: SqliteWriter) -> None:
        db = self._db()
        # Autocommit: the single UPDATE is its own transaction.
        self._fence(db, writer)

    def _fence(self, db: sqlite3.Connection, writer: SqliteWriter) -> None:
        cur = db.execute(_FENCE, (self._clock() + writer._lease_seconds, writer.session_id, writer.epoch, writer.owner))
        if cur.rowcount != 1:
            raise FencedError(
                f"writer epoch {writer.epoch} of session {writer.session_id!r} lost ownership",
                session_id=writer.session_id,
                epoch=writer.epoch,
            )

    def _release(self, writer: SqliteWriter) -> None:
        self._db().execute(
            "UPDATE owners SET owner = NULL, lease_until = NULL WHERE session_id = ? AND epoch = ? AND owner = ?",
            (writer.session_id, writer.epoch, writer.owner),
        )


class SqliteWriter:
    """The owner's handle on one session of a :class:`SqliteLog`."""

    def __init__(self, log: SqliteLog, session_id: str, *, owner: str, epoch: int, lease_seconds: float) -> None:
        self._log = log
        self._session_id = session_id
        self._owner = owner
        self._epoch = epoch
        self._lease_seconds = lease_seconds

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def owner(self) -> str:
        return self._owner

    async def append(self, records: Sequence[Record]) -> list[LogEntry]:
        """Append all ``records`` in one fsync'd transaction, renewing the lease.

        Raises:
            FencedError: a newer claim (or ``release``) took the session; nothing written.
        """
        encoded = _encode_batch(self._log._codec, self._session_id, records)
        seqs = await self._log._call(self._log._append, self._session_id, encoded, self)
        return [LogEntry(seq, record) for seq, record in zip(seqs, records, strict=True)]

    async def renew(self) -> None:
        await self._log._call(self._log._renew, self)

    async def release(self) -> None:
        """Give the session up so another owner can claim at once (no-op if already lost)."""
        try:
            await self._log._call(self._log._release, self)
        except LogError:
            if not self._log._closed:
                raise
