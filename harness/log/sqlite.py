"""The embedded session log: one SQLite file (``sqlite:///path``).

Layout::

    meta(key PRIMARY KEY, value)               namespace (random, made with the file), schema
    records(seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id, type, value BLOB)
    owners(session_id PRIMARY KEY, owner, epoch, lease_until)

Durability: WAL with ``synchronous=FULL``; every write is part of one ``BEGIN
IMMEDIATE`` ... ``COMMIT`` transaction, so it is fsync'd when ``append`` returns
and a crash leaves all of it or none.

Fencing: ``claim`` bumps the session's epoch. Every ``append`` checks, in its
transaction and in the statement that reads the next positions, that the owners row
still names this writer at its epoch: a newer claim (or a release) makes that write
fail with ``FencedError`` having written nothing. So an append costs one SELECT, its
INSERTs and the head's upsert. The lease is renewed by ``renew`` (the host's poller)
and by an append only when a third of it has passed since it was last renewed (then
the check is ``UPDATE owners SET lease_until=? WHERE session_id=? AND epoch=? AND
owner=?``: no row changed means fenced). The lease only decides whether a *claim* is
refused (``SessionBusy``); an owner whose lease ran out keeps writing until somebody
actually claims.

Group commit: every write (append, submit, claim, renew, release) is queued on
the event loop that awaits it. The first one while nothing is queued or committing
opens the next group: it gives the tasks that are ready one loop step to join
(``asyncio.sleep(0)``), then flushes the group itself, so a lone writer pays one
loop iteration, not two (a flush callback, then its own wake-up); a write that joins
a group, or any write while commits go to the writer thread, waits for the flush
(``loop.call_soon``, or the end of the commit in flight). The flush takes everything
queued and runs it as ONE transaction, each write in its own ``SAVEPOINT`` (when there are several), in
queue order: a write refused by the log (``FencedError``, ``SessionBusy``) rolls
back alone and the others commit; one fsync serves them all. An append's records
are inserted one after the other inside it, so their seqs are contiguous. Any
SQLite error fails every write of that transaction with ``LogUnavailable``
(rolled back: nothing of it is visible). ``stats`` counts appends and
transactions.

Threading: the flush normally runs on the event-loop thread, on a write
connection of its own: a sequential append costs one loop iteration, not a hop
to a thread and back (measured at 100-200 µs, a third of a step). The loop is
then blocked for the commit (an fsync, ~0.3 ms on an SSD), which is why two
things move a flush to a writer thread instead, so the loop never waits long:

* *slow storage*: while the moving average of recent commits is over
  ``inline_commit_limit`` (2 ms by default), flushes run on the writer thread,
  and writes queued meanwhile form the next group;
* *another process's lock*: on the loop the write connection never waits
  (``busy_timeout=0``). If ``BEGIN IMMEDIATE`` finds the file locked by another
  process (or another handle), that flush is retried on the writer thread, whose
  own write connection (``busy_timeout`` set once, when it is first needed)
  waits up to ``busy_timeout`` (10 s by default) for the lock. So contention costs
  the loop nothing; the waiting writes fail with ``LogUnavailable`` only when
  the lock is held longer than ``busy_timeout``. The embedded log is meant for
  one machine whose processes hold the lock for short commits; a process that
  keeps a write transaction open for long stalls the others' writes (never
  their event loops).

Reads (``read``, ``scan``, ``read_all``, ``sessions``, ``lease_info``) run on a
reader thread with their own connection: WAL lets it read while a write
commits, and a big read never blocks the loop. A read sees every write whose
``append`` has returned.

A log may be used from several event loops, one after another or at once (each
loop has its own queue; the write connection is used by one thread at a time).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

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
from harness.log.sqlite_schema import (
    SCHEMA,
    append_rows,
    namespace_of,
    select_changes,
    select_owner,
    select_rows,
    select_sessions,
    verify_rows,
)
from harness.observability import metrics
from harness.records import Record

__all__ = ["SqliteLog", "SqliteStats", "SqliteWriter"]

T = TypeVar("T")

_FENCE = "UPDATE owners SET lease_until = ? WHERE session_id = ? AND epoch = ? AND owner = ?"

DEFAULT_BUSY_TIMEOUT = timedelta(seconds=10)
"""How long a write waits for another connection's write lock before failing."""

DEFAULT_INLINE_COMMIT_LIMIT = timedelta(milliseconds=2)
"""Commits slower than this (moving average) run on the writer thread, not the loop."""

_REFUSALS = (FencedError, SessionBusy)
"""What a single write may fail with alone; it raises them before writing anything."""


@dataclass(slots=True)
class SqliteStats:
    """Counters of one :class:`SqliteLog` (for tests and benchmarks)."""

    appends: int = 0
    """Appends and submits committed."""
    transactions: int = 0
    """Write transactions committed (one per group of queued writes)."""
    offloaded: int = 0
    """Of those, the ones committed on the writer thread (slow storage, a locked file)."""


_Op = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]", bool]
"""A queued write: ``fn(db, *args)``, the future its caller awaits, whether it is an append."""


class _Group:
    """The writes queued on one event loop, and its flush in progress on the writer thread."""

    __slots__ = ("inflight", "queue", "scheduled")

    def __init__(self) -> None:
        self.queue: list[_Op] = []
        self.scheduled = False
        self.inflight: asyncio.Future[Any] | None = None


class _Busy(Exception):
    """The write lock is held elsewhere; retry where waiting does not block the loop."""


def _seconds(value: timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


class SqliteLog:
    """A :class:`~harness.log.base.SessionLog` in one SQLite file.

    The constructor opens (or creates) the file and reads its namespace, waiting
    for that on the calling thread: open logs at startup, not per request.

    Args:
        path: the database file; created with its tables when missing.
        clock: seconds since the epoch, for leases. All processes sharing the file
            must use the same time base (``time.time`` by default).
        busy_timeout: how long a write waits for another writer's lock (on the
            writer thread, never on the event loop).
        codec: the record codec; ``harness.codec.default_codec()`` by default.
        inline_commit_limit: commits run on the event-loop thread while they take
            less than this on average; 0 runs every commit on the writer thread.
    """

    has_leases: ClassVar[bool] = True  # claims are refused while another lease is live

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout: timedelta | float = DEFAULT_BUSY_TIMEOUT,
        codec: _Codec | None = None,
        inline_commit_limit: timedelta | float = DEFAULT_INLINE_COMMIT_LIMIT,
    ) -> None:
        self._path = str(path)
        self._clock = clock
        self._busy_seconds = _seconds(busy_timeout)
        self._codec = codec if codec is not None else _default_codec()
        self._inline_limit = _seconds(inline_commit_limit)
        self._commit_avg = 0.0  # moving average of commit times, seconds
        self._stats = SqliteStats()
        self._closed = False
        self._groups: dict[asyncio.AbstractEventLoop, _Group] = {}
        self._wlock = threading.Lock()  # the write connection: one thread at a time
        self._wconn: sqlite3.Connection | None = None  # commits on the loop (busy_timeout 0)
        self._tconn: sqlite3.Connection | None = None  # commits on the writer thread (waits for locks)
        self._conn: sqlite3.Connection | None = None  # the reader thread's connection
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harness-sqlite-read")
        # (threads start on first use: a log whose commits all run on the loop has none)
        self._writer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harness-sqlite-write")
        try:
            self._namespace = self._open_writer()
            self._executor.submit(self._guard, self._open_reader).result()
        except BaseException:
            if self._wconn is not None:
                self._wconn.close()
            self._executor.shutdown(wait=True)
            self._writer_thread.shutdown(wait=True)
            raise

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def path(self) -> str:
        return self._path

    @property
    def stats(self) -> SqliteStats:
        """Live counters: appends committed, transactions that carried them."""
        return self._stats

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

    async def positions_since(
        self, after: int | None, session_ids: Collection[str]
    ) -> tuple[int, dict[str, list[int]]]:
        """Where the log ends now, and the positions of records after ``after`` of the
        given sessions (nothing is decoded). ``after=None``: only where it ends."""
        return await self._call(self._changes, after, session_ids)

    async def lease_info(self, session_id: str) -> LeaseInfo:
        return await self._call(self._lease_info, session_id)

    # --- writes --------------------------------------------------------------------------

    async def submit(self, record: Record) -> LogEntry:
        """Append one input record (``IS_INPUT``) without ownership."""
        _check_input(record)
        encoded = _encode_batch(self._codec, record.session_id, [record])
        (seq,) = await self._run(self._op_append, (record.session_id, encoded, None), True)
        return LogEntry(seq, record)

    async def claim(self, session_id: str, *, owner: str, lease: timedelta) -> SqliteWriter:
        """Become the writer of ``session_id``; fences any previous writer.

        Raises:
            SessionBusy: another owner's lease is still live. The same owner may
                claim again at once (e.g. after its own restart); that fences its
                previous writer too.
        """
        seconds = _lease_seconds(lease)
        epoch = await self._run(self._op_claim, (session_id, owner, seconds), False)
        return SqliteWriter(self, session_id, owner=owner, epoch=epoch, lease_seconds=seconds)

    async def close(self) -> None:
        """Land the writes already queued on this loop, then close."""
        if self._closed:
            return
        self._closed = True  # no new writes; the queued ones still land
        loop = asyncio.get_running_loop()
        while (group := self._groups.get(loop)) is not None and (group.queue or group.inflight is not None):
            if group.inflight is not None:
                await asyncio.wait([group.inflight])  # its done callback (_landed) runs first
            else:
                self._flush(loop, group)
        await loop.run_in_executor(self._executor, self._close_conns)
        self._executor.shutdown(wait=False)
        self._writer_thread.shutdown(wait=False)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- group commit ----------------------------------------------------------------------

    async def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], is_append: bool) -> Any:
        """Run ``fn(db, *args)`` in the next group commit of the running loop; its value.

        A write that finds the loop's writes idle opens the group and flushes it itself
        after one loop step (see the module doc); any other waits for its group's flush.
        """
        if self._closed:
            raise LogUnavailable(f"the SQLite log {self._path!r} is closed")
        loop = asyncio.get_running_loop()
        group = self._groups.get(loop)
        if (group is not None and (group.queue or group.scheduled or group.inflight is not None)) or (
            self._inline_limit <= 0 or self._commit_avg > self._inline_limit
        ):
            return await self._write(fn, args, is_append)
        if group is None:
            group = self._groups[loop] = _Group()
        fut = loop.create_future()
        group.queue.append((fn, args, fut, is_append))
        group.scheduled = True  # (the flush is this task's: later writes only queue)
        try:
            await asyncio.sleep(0)  # the tasks ready now may join this group
        except asyncio.CancelledError:
            fut.cancel()  # a cancelled write writes nothing; the others still land
            if group.scheduled:
                loop.call_soon(self._flush, loop, group)
            raise
        if group.scheduled:  # (else close() flushed it meanwhile)
            self._flush(loop, group)
        return await fut  # done, unless the commit went to the writer thread

    def _write(self, fn: Callable[..., Any], args: tuple[Any, ...], is_append: bool) -> asyncio.Future[Any]:
        """Queue ``fn(db, *args)`` for the next group commit of the running loop."""
        if self._closed:
            raise LogUnavailable(f"the SQLite log {self._path!r} is closed")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        group = self._groups.get(loop)
        if group is None:
            group = self._groups[loop] = _Group()
        group.queue.append((fn, args, fut, is_append))
        if not group.scheduled and group.inflight is None:
            group.scheduled = True
            loop.call_soon(self._flush, loop, group)
        return fut

    def _flush(self, loop: asyncio.AbstractEventLoop, group: _Group) -> None:
        """Commit everything queued on ``loop`` as one transaction (on the loop if cheap)."""
        group.scheduled = False
        if group.inflight is not None:  # _landed flushes the queue when that one is done
            return
        ops = [op for op in group.queue if not op[2].done()]  # a cancelled write writes nothing
        group.queue = []
        if ops and not self._flush_here(ops):
            group.inflight = loop.run_in_executor(self._writer_thread, partial(self._commit, ops, wait=True))
            group.inflight.add_done_callback(partial(self._landed, loop, group, ops))
            return
        self._forget_if_idle(loop, group)

    def _flush_here(self, ops: list[_Op]) -> bool:
        """Commit ``ops`` on this thread; False: they belong on the writer thread."""
        if self._inline_limit <= 0 or self._commit_avg > self._inline_limit:
            return False  # slow storage (or inline commits turned off)
        try:
            outcomes = self._commit(ops, wait=False)
        except _Busy:
            return False  # locked by another connection: wait for it on the writer thread
        except BaseException as exc:
            self._fail(ops, exc)
            if not isinstance(exc, Exception):
                raise
            return True
        self._resolve(ops, outcomes)
        return True

    def _landed(
        self, loop: asyncio.AbstractEventLoop, group: _Group, ops: list[_Op], done: asyncio.Future[Any]
    ) -> None:
        group.inflight = None
        if done.cancelled():
            self._fail(ops, LogUnavailable(f"SQLite log {self._path!r}: the write was cancelled"))
        elif (exc := done.exception()) is not None:
            self._fail(ops, exc)
        else:
            self._resolve(ops, done.result())
        if group.queue:  # queued while that commit ran: the next group
            self._flush(loop, group)
        else:
            self._forget_if_idle(loop, group)

    def _forget_if_idle(self, loop: asyncio.AbstractEventLoop, group: _Group) -> None:
        if (
            not group.queue
            and group.inflight is None
            and not group.scheduled
            and self._groups.get(loop) is group
        ):
            del self._groups[loop]

    @staticmethod
    def _resolve(ops: list[_Op], outcomes: list[Any]) -> None:
        for (_, _, fut, _), outcome in zip(ops, outcomes, strict=True):
            if fut.done():
                continue
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

    def _fail(self, ops: list[_Op], exc: BaseException) -> None:
        """The whole transaction failed: every write of it gets its own error."""
        for _, _, fut, _ in ops:
            if fut.done():
                continue
            if isinstance(exc, LogUnavailable) or not isinstance(exc, Exception):
                err = LogUnavailable(str(exc) or f"SQLite log {self._path!r}: write interrupted")
                err.__cause__ = exc.__cause__ if isinstance(exc, LogUnavailable) else exc
                fut.set_exception(err)
            else:  # a bug: show it as itself
                fut.set_exception(exc)

    def _commit(self, ops: list[_Op], *, wait: bool) -> list[Any]:
        """Run ``ops`` in one transaction; a value or a refusal (exception) per op.

        ``wait=False`` (the loop thread): raise ``_Busy`` at once when another
        connection holds the write lock. ``wait=True`` (the writer thread): wait
        up to ``busy_timeout`` for it.

        Raises:
            LogUnavailable: a SQLite error; nothing of the transaction was kept.
        """
        with self._wlock:
            db = self._wconn
            if db is None:
                raise LogUnavailable(f"the SQLite log {self._path!r} is closed")
            try:
                if wait:
                    db = self._thread_conn()
                try:
                    db.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError as exc:
                    if not wait and (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_BUSY:
                        raise _Busy() from None
                    raise
                started = time.perf_counter()
                try:
                    outcomes, appends = self._run_ops(db, ops)
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                    raise
                # A moving average of commit times, each clipped so one stall (a
                # checkpoint, a noisy neighbour) does not move commits off the loop.
                took = min(time.perf_counter() - started, 2 * self._inline_limit)
                self._commit_avg += (took - self._commit_avg) * 0.125
                if appends >= 0:
                    metrics.group_commit(appends)
                    self._stats.transactions += 1
                    self._stats.appends += appends
                    self._stats.offloaded += wait
                return outcomes
            except (sqlite3.Error, UnicodeDecodeError) as exc:
                raise LogUnavailable(f"SQLite log {self._path!r}: {exc}") from exc

    def _thread_conn(self) -> sqlite3.Connection:
        """The writer thread's connection (made at its first commit, ``_wlock`` held): it
        waits up to ``busy_timeout`` for another connection's lock; its pragmas are set once."""
        conn = self._tconn
        if conn is None:
            conn = sqlite3.connect(
                self._path, timeout=self._busy_seconds, isolation_level=None, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_seconds * 1000)}")
            conn.execute("PRAGMA synchronous = FULL")
            self._tconn = conn
        return conn

    @staticmethod
    def _run_ops(db: sqlite3.Connection, ops: list[_Op]) -> tuple[list[Any], int]:
        """Inside BEGIN: run each op, then COMMIT (or ROLLBACK when none landed: -1 appends)."""
        if len(ops) == 1:  # the sequential case: the transaction is the op
            fn, args, _, is_append = ops[0]
            try:
                out = fn(db, *args)
            except _REFUSALS as exc:
                db.execute("ROLLBACK")
                return [exc], -1
            db.execute("COMMIT")
            return [out], int(is_append)
        outcomes: list[Any] = []
        landed = appends = 0
        for fn, args, _, is_append in ops:
            db.execute("SAVEPOINT op")
            try:
                out = fn(db, *args)
            except _REFUSALS as exc:
                db.execute("ROLLBACK TO op")
                db.execute("RELEASE op")
                outcomes.append(exc)
                continue
            db.execute("RELEASE op")
            outcomes.append(out)
            landed += 1
            appends += is_append
        if not landed:
            db.execute("ROLLBACK")
            return outcomes, -1
        db.execute("COMMIT")
        return outcomes, appends

    # --- the writes, run inside a group's transaction ----------------------------------------
    # Each raises FencedError/SessionBusy BEFORE changing anything (an UPDATE that
    # matches no row changes nothing); the savepoint is the second line of defence.

    def _op_append(
        self,
        db: sqlite3.Connection,
        session_id: str,
        encoded: Sequence[tuple[str, bytes]],
        writer: SqliteWriter | None,
    ) -> list[int]:
        """The fence check (writers only; a renewal when one is due), then the inserts."""
        owner = None
        if writer is not None:
            now = self._clock()
            if now >= writer._renew_at:
                self._fence(db, writer)  # checks and renews
                writer._renew_at = now + writer._lease_seconds / 3
            else:
                owner = (writer.owner, writer.epoch)  # checked by the positions' query
        seqs = append_rows(db, session_id, encoded, owner)
        if seqs is None:
            assert writer is not None
            raise self._fenced(writer)
        return seqs

    def _op_claim(self, db: sqlite3.Connection, session_id: str, owner: str, lease_seconds: float) -> int:
        now = self._clock()
        row = db.execute(
            "SELECT owner, epoch, lease_until FROM owners WHERE session_id = ?", (session_id,)
        ).fetchone()
        if row is not None:
            cur_owner, _, cur_until = row
            if cur_owner is not None and cur_owner != owner and cur_until is not None and cur_until > now:
                raise SessionBusy(
                    f"session {session_id!r} is owned by {cur_owner!r} until {cur_until}",
                    session_id=session_id,
                    owner=cur_owner,
                    lease_until=cur_until,
                )
        epoch: int = (row[1] if row is not None else 0) + 1
        db.execute(
            "INSERT OR REPLACE INTO owners (session_id, owner, epoch, lease_until) VALUES (?, ?, ?, ?)",
            (session_id, owner, epoch, now + lease_seconds),
        )
        return epoch

    def _op_renew(self, db: sqlite3.Connection, writer: SqliteWriter) -> None:
        now = self._clock()
        self._fence(db, writer)
        writer._renew_at = now + writer._lease_seconds / 3

    def _op_release(self, db: sqlite3.Connection, writer: SqliteWriter) -> None:
        db.execute(
            "UPDATE owners SET owner = NULL, lease_until = NULL WHERE session_id = ? AND epoch = ? AND owner = ?",
            (writer.session_id, writer.epoch, writer.owner),
        )

    def _fence(self, db: sqlite3.Connection, writer: SqliteWriter) -> None:
        cur = db.execute(
            _FENCE, (self._clock() + writer._lease_seconds, writer.session_id, writer.epoch, writer.owner)
        )
        if cur.rowcount != 1:
            raise self._fenced(writer)

    @staticmethod
    def _fenced(writer: SqliteWriter) -> FencedError:
        return FencedError(
            f"writer epoch {writer.epoch} of session {writer.session_id!r} lost ownership",
            session_id=writer.session_id,
            epoch=writer.epoch,
        )

    # --- opening and closing -----------------------------------------------------------------

    def _open_writer(self) -> str:
        """The write connection (any thread, one at a time), the schema, the namespace."""
        try:
            conn = sqlite3.connect(
                self._path, timeout=self._busy_seconds, isolation_level=None, check_same_thread=False
            )
            self._wconn = conn
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_seconds * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise LogUnavailable(f"SQLite log {self._path!r}: cannot use WAL (journal_mode={mode})")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                # One statement at a time: executescript() would COMMIT the transaction first.
                for statement in filter(None, (s.strip() for s in SCHEMA.split(";"))):
                    conn.execute(statement)
                namespace = namespace_of(conn, self._path)
                conn.execute("COMMIT")
            except BaseException:
                conn.rollback()
                raise
            conn.execute("PRAGMA busy_timeout = 0")  # on the loop, never wait: see _commit
        except (sqlite3.Error, UnicodeDecodeError) as exc:  # a file this damaged cannot be used
            raise LogUnavailable(f"SQLite log {self._path!r}: {exc}") from exc
        return str(namespace)

    def _open_reader(self) -> None:
        conn = sqlite3.connect(self._path, timeout=self._busy_seconds, isolation_level=None)
        self._conn = conn
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_seconds * 1000)}")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA query_only = ON")

    def _close_conns(self) -> None:
        """On the reader thread: the write connection (after any write in progress), then its own."""
        with self._wlock:
            for conn in (self._wconn, self._tconn):
                if conn is not None:
                    conn.close()
            self._wconn = self._tconn = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- reads, on the reader thread ------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise LogUnavailable(f"the SQLite log {self._path!r} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._guard, fn, *args)

    def _guard(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the reader thread; database failures become ``LogUnavailable``."""
        try:
            return fn(*args)
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            raise LogUnavailable(f"SQLite log {self._path!r}: {exc}") from exc

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise LogUnavailable(f"the SQLite log {self._path!r} is closed")
        return self._conn

    # Every read uses fetchall(): a statement left unfinished would keep its read
    # transaction (an old snapshot) open and later reads would miss new commits.

    def _scan(self, session_id: str | None, after: int, limit: int) -> list[LogEntry | CorruptRecord]:
        rows, head = select_rows(self._db(), session_id, after, limit)
        checked = verify_rows(rows, session_id=session_id, after=after, head=head, whole=limit < 0)
        return [
            item if isinstance(item, CorruptRecord) else _decode_row(self._codec, item[1], item[0], item[2])
            for item in checked
        ]

    def _changes(self, after: int | None, session_ids: Collection[str]) -> tuple[int, dict[str, list[int]]]:
        return select_changes(self._db(), after, session_ids)

    def _sessions(self) -> list[str]:
        return select_sessions(self._db())

    def _lease_info(self, session_id: str) -> LeaseInfo:
        row = select_owner(self._db(), session_id)
        if row is None:
            return LeaseInfo(owner=None, epoch=0, lease_until=None)
        owner, epoch, lease_until = row
        return LeaseInfo(owner=owner, epoch=epoch, lease_until=lease_until)


class SqliteWriter:
    """The owner's handle on one session of a :class:`SqliteLog`."""

    def __init__(
        self, log: SqliteLog, session_id: str, *, owner: str, epoch: int, lease_seconds: float
    ) -> None:
        self._log = log
        self._session_id = session_id
        self._owner = owner
        self._epoch = epoch
        self._lease_seconds = lease_seconds
        # The claim set the lease: appends renew it again once a third of it has passed.
        self._renew_at = log._clock() + lease_seconds / 3

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
        """Append all ``records`` (contiguous seqs) in a fsync'd transaction (renewing the
        lease when a third of it has passed).

        Raises:
            FencedError: a newer claim (or ``release``) took the session; nothing written.
            LogUnavailable: the database failed; nothing written.
        """
        log = self._log
        encoded = _encode_batch(log._codec, self._session_id, records)
        seqs = await log._run(log._op_append, (self._session_id, encoded, self), True)
        return [LogEntry(seq, record) for seq, record in zip(seqs, records, strict=True)]

    async def renew(self) -> None:
        await self._log._run(self._log._op_renew, (self,), False)

    async def release(self) -> None:
        """Give the session up so another owner can claim at once (no-op if already lost)."""
        try:
            await self._log._run(self._log._op_release, (self,), False)
        except LogError:
            if not self._log._closed:
                raise
