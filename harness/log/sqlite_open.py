"""Opening a SQLite file as a session log: which files are logs, who may make one, and
whether the file can be written.

A :class:`~harness.log.sqlite.SqliteLog` opens its file one of three ways:

* ``create=True`` (the default: a worker, ``HarnessHost``): a missing or empty file
  becomes a log, its tables and namespace made in one transaction;
* ``create=False`` (a client: ``HarnessClient``, ``harness send`` / ``answer``): the
  file must already be a log; a client makes nothing;
* ``read_only=True`` (``harness sessions`` / ``show`` / ``tail``): the file must be a
  log, read through a read-only connection (``mode=ro``): nothing is made, upgraded
  or changed, and a write through it is refused.

Whichever way, a file that holds tables but no harness ``meta`` table (an application's
own database) is refused in one line naming its tables, before anything is written to
it: before even ``PRAGMA journal_mode = WAL``, which would rewrite its header.

A writer's opening transaction also runs a write that changes nothing
(:data:`PROBE_WRITE`): SQLite opens a file it may not write (mode 0444 for a user who
is not root, ``chattr +i``, a read-only mount) read-only without a word, and its
``BEGIN IMMEDIATE`` and ``CREATE TABLE IF NOT EXISTS`` succeed there; only a statement
that writes says so. So a log that cannot be written is refused at start with the fix,
instead of failing every write afterwards.

A reader in a folder it may not write: SQLite reads a WAL file read-only only through its
``-shm`` index, which it must create when it is missing (www.sqlite.org/wal.html,
"Read-Only Databases"). When that fails and no ``-wal`` file holds records, every
committed record is in the main file and no writer can be running (it would need those
files), so the file is read as ``immutable=1``: without locks and without looking for
changes. A ``-wal`` file with records in such a folder is refused (``immutable`` would
not see them).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import urllib.parse

from harness.errors import LogUnavailable
from harness.log.sqlite_positions import WriteConnection
from harness.log.sqlite_schema import PAGE_SIZE, SCHEMA, namespace_of, read_namespace, user_tables

__all__ = ["PROBE_WRITE", "connect_read", "open_hint", "open_reader", "open_writer"]

log = logging.getLogger("harness.log.sqlite")

PROBE_WRITE = "UPDATE meta SET value = value WHERE 0"
"""Matches no row, so it changes nothing; but it starts a write, which SQLite refuses
(``attempt to write a readonly database``) on a file it could only open read-only."""

_SHOWN_TABLES = 5


def _where(path: str) -> str:
    full = os.path.abspath(path)
    return path if full == path else f"{path} ({full})"


def open_hint(path: str) -> str:
    """Why a file could not be opened, when its folder says so."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.exists(folder) and not os.path.isdir(folder):
        return f" (its folder {folder} is a file, not a folder: fix the path)"
    if not os.path.isdir(folder):
        return (f" (its folder {folder} does not exist: create it, or fix the path; sqlite:///name.db is "
                "relative to the current folder, sqlite:////abs/path.db absolute)")
    if not os.access(folder, os.W_OK):
        return f" (its folder {folder} is not writable by this user)"
    return ""


def _no_file(path: str) -> LogUnavailable:
    return LogUnavailable(
        f"no SQLite log at {_where(path)}: a worker (or HarnessHost) creates the file when it first opens it"
    )


def _check_tables(conn: sqlite3.Connection, path: str, *, create: bool) -> bool:
    """Refuse a file that is not a log: one holding other tables, or (unless ``create``) none.
    Whether the file is new (it holds no tables: this opening makes the log)."""
    tables = user_tables(conn)
    if "meta" in tables:
        return False
    if tables:
        shown = ", ".join(tables[:_SHOWN_TABLES])
        more = f" and {len(tables) - _SHOWN_TABLES} more" if len(tables) > _SHOWN_TABLES else ""
        raise LogUnavailable(
            f"{_where(path)} is not a harness log: it holds the tables {shown}{more} and no harness meta table; "
            "check the path (a log needs a file of its own)"
        )
    if not create:
        raise LogUnavailable(
            f"no SQLite log at {_where(path)}: the file is empty (it holds no tables); a worker (or HarnessHost) "
            "makes it a log when it first opens it"
        )
    return True


def _unusable(path: str, exc: sqlite3.Error | UnicodeDecodeError) -> LogUnavailable:
    """A file SQLite cannot use: not a database at all (a mistyped path onto another file),
    or damaged."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == sqlite3.SQLITE_NOTADB:
        return LogUnavailable(
            f"{path} is not a SQLite database ({exc}): check the path; if it was a log, it is damaged beyond "
            "reading: restore it from a backup"
        )
    return LogUnavailable(f"SQLite log {path!r}: {exc}{open_hint(path)}")


def _is_readonly(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF == sqlite3.SQLITE_READONLY


def _readonly(path: str, exc: BaseException) -> LogUnavailable:
    return LogUnavailable(
        f"SQLite log {path!r} cannot be written by this process ({exc}): make the file, and its -wal and -shm "
        "files, writable by this user (their mode and owner; 'chattr -i' if one is immutable) or mount its "
        "filesystem read-write; 'harness sessions' and 'harness show' can read it as it is"
    )


def _uri(path: str, query: str) -> str:
    return f"file:{urllib.parse.quote(os.path.abspath(path))}?{query}"


def open_writer(path: str, busy_seconds: float, *, create: bool) -> tuple[WriteConnection, str]:
    """The write connection (any thread, one at a time, ``busy_timeout=0``), the schema
    made or upgraded, and the namespace.

    Raises:
        LogUnavailable: the file is not a log (or, without ``create``, does not exist or
            is empty), cannot be written, or is damaged.
    """
    if not create and not os.path.exists(path):
        raise _no_file(path)
    conn: WriteConnection | None = None
    try:
        # Without create, mode=rw: a file deleted since the check above is not made again.
        target, uri = (path, False) if create else (_uri(path, "mode=rw"), True)
        conn = sqlite3.connect(
            target, timeout=busy_seconds, isolation_level=None, check_same_thread=False, uri=uri, factory=WriteConnection
        )
        conn.execute(f"PRAGMA busy_timeout = {int(busy_seconds * 1000)}")
        if _check_tables(conn, path, create=create):  # before journal_mode: setting WAL rewrites the header
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # (a new file only: see PAGE_SIZE)
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LogUnavailable(f"SQLite log {path!r}: cannot use WAL (journal_mode={mode})")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            # One statement at a time: executescript() would COMMIT the transaction first.
            for statement in filter(None, (s.strip() for s in SCHEMA.split(";"))):
                conn.execute(statement)
            namespace = namespace_of(conn, path)
            conn.execute(PROBE_WRITE)
            conn.execute("COMMIT")
        except BaseException:
            conn.rollback()
            raise
        conn.execute("PRAGMA busy_timeout = 0")  # on the loop, never wait: see GroupCommit
    except BaseException as exc:
        if conn is not None:
            conn.close()
        if _is_readonly(exc):
            raise _readonly(path, exc) from exc
        if isinstance(exc, sqlite3.Error | UnicodeDecodeError):  # a file this damaged cannot be used
            raise _unusable(path, exc) from exc
        raise
    return conn, namespace


def connect_read(target: str, busy_seconds: float) -> sqlite3.Connection:
    """A connection that reads ``target`` (a path, or a ``file:`` URI) and never writes."""
    conn = sqlite3.connect(
        target, timeout=busy_seconds, isolation_level=None, check_same_thread=False,
        uri=target.startswith("file:"),
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_seconds * 1000)}")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA query_only = ON")
    except BaseException:
        conn.close()
        raise
    return conn


def open_reader(path: str, busy_seconds: float) -> tuple[sqlite3.Connection, str, str]:
    """For a log opened ``read_only``: its read connection (``mode=ro``), the namespace,
    and the target that opens more such connections (``connect_read``).

    Raises:
        LogUnavailable: no file, a file that is not a log (or an empty one), one that
            cannot be read from here, or a damaged one.
    """
    if not os.path.exists(path):
        raise _no_file(path)
    target = _uri(path, "mode=ro")
    conn: sqlite3.Connection | None = None
    try:
        try:
            conn = connect_read(target, busy_seconds)
            _check_tables(conn, path, create=False)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_CANTOPEN:
                raise
            if conn is not None:
                conn.close()
                conn = None
            target = _snapshot(path)
            conn = connect_read(target, busy_seconds)
            _check_tables(conn, path, create=False)
            log.warning(
                "reading %s as an unchanging snapshot: SQLite cannot create its -shm file in %s, so it reads the "
                "file without locks and does not see changes (nothing may write it meanwhile)",
                path, os.path.dirname(os.path.abspath(path)),
            )
        namespace = read_namespace(conn, path)
    except BaseException as exc:
        if conn is not None:
            conn.close()
        if isinstance(exc, sqlite3.Error | UnicodeDecodeError):
            raise _unusable(path, exc) from exc
        raise
    return conn, namespace, target


def _snapshot(path: str) -> str:
    """The URI that reads a WAL file whose ``-shm`` file SQLite could not create or open
    (in a folder this user may not write), or why it cannot be read."""
    folder = os.path.dirname(os.path.abspath(path))
    wal = f"{path}-wal"
    if os.path.exists(wal) and os.path.getsize(wal) > 0:
        raise LogUnavailable(
            f"SQLite log {path!r} cannot be read here: its -wal file holds records that SQLite reads only through "
            f"a -shm file, which it cannot create or open in {folder}{open_hint(path)}; copy "
            f"{os.path.basename(path)} and {os.path.basename(wal)} to a folder you may write and read the copy"
        )
    # No -wal records: every committed record is in the file itself, and no writer is
    # running (it would hold the -shm file and write the -wal file).
    return _uri(path, "mode=ro&immutable=1")
