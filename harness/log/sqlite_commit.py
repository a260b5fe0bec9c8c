"""Group commit for the SQLite log: many writes, one transaction, one fsync.

Group commit: every write (append, submit, claim, renew, release) is queued on
the event loop that awaits it. The first one while nothing is queued or committing
opens the next group: it gives the tasks that are ready one loop step to join
(``asyncio.sleep(0)``; none when no other task is ready), then flushes the group
itself, so a lone writer pays no loop iteration, not two (a flush callback, then its
own wake-up); a write that joins
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
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from harness.errors import FencedError, LogClosed, LogUnavailable, SessionBusy
from harness.log.sqlite_positions import WriteConnection
from harness.observability import metrics

__all__ = ["NOT_ALONE", "GroupCommit", "SqliteStats"]

_REFUSALS = (FencedError, SessionBusy)
"""What a single write may fail with alone; it raises them before writing anything."""


@dataclass(slots=True)
class SqliteStats:
    """Counters of one :class:`~harness.log.sqlite.SqliteLog` (for tests and benchmarks)."""

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


def _others_ready(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether anything but the running task is ready to run on ``loop`` now.

    When nothing is, a loop step gathers no other write (what I/O wakes in that step
    runs after this task's flush anyway), so a lone writer flushes at once and saves
    the step (~15 us, a tenth of a sequential step). A loop that does not say (not
    asyncio's own) is taken to have others ready.
    """
    ready = getattr(loop, "_ready", None)
    return ready is None or len(ready) > 0


class _Busy(Exception):
    """The write lock is held elsewhere; retry where waiting does not block the loop."""


NOT_ALONE = object()
"""``GroupCommit.alone``'s answer when the write must join a group (nothing was written)."""


class GroupCommit:
    """The write side of one SQLite file: queues writes per event loop and commits them.

    Args:
        path: the database file (for messages and the writer thread's connection).
        conn: the write connection, schema ready, ``busy_timeout=0`` (used on the loop).
        busy_seconds: how long the writer thread waits for another connection's lock.
        inline_limit: commits run on the loop thread while their moving average is below
            this (seconds); 0 runs every commit on the writer thread.
        stats: the counters to update.
    """

    def __init__(
        self,
        path: str,
        conn: WriteConnection,
        *,
        busy_seconds: float,
        inline_limit: float,
        stats: SqliteStats,
    ) -> None:
        self._path = path
        self._busy_seconds = busy_seconds
        self._inline_limit = inline_limit
        self._stats = stats
        self._commit_avg = 0.0  # moving average of commit times, seconds
        self._groups: dict[asyncio.AbstractEventLoop, _Group] = {}
        self._wlock = threading.Lock()  # the write connection: one thread at a time
        self._wconn: WriteConnection | None = conn  # commits on the loop (busy_timeout 0)
        self._tconn: WriteConnection | None = None  # commits on the writer thread (waits for locks)
        # (the thread starts on first use: a log whose commits all run on the loop has none)
        self._writer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harness-sqlite-write")
        self.closed = False
        """No new write is taken; the queued ones still land (see :meth:`drain`)."""

    async def drain(self) -> None:
        """Land every write queued on the running loop (after ``closed`` is set)."""
        loop = asyncio.get_running_loop()
        while (group := self._groups.get(loop)) is not None and (group.queue or group.inflight is not None):
            if group.inflight is not None:
                await asyncio.wait([group.inflight])  # its done callback (_landed) runs first
            else:
                self._flush(loop, group)

    def close_conns(self) -> None:
        """Close the write connections (after any commit in progress); any thread."""
        with self._wlock:
            for conn in (self._wconn, self._tconn):
                if conn is not None:
                    conn.close()
            self._wconn = self._tconn = None
        self._writer_thread.shutdown(wait=False)

    async def run(self, fn: Callable[..., Any], args: tuple[Any, ...], is_append: bool) -> Any:
        """Run ``fn(db, *args)`` in the next group commit of the running loop; its value.

        A write that finds the loop's writes idle and no other task ready to join it
        commits at once, without a group (:meth:`alone`); a write that finds them idle
        otherwise opens the group and flushes it itself after one loop step (see the
        module doc); any other waits for its group's flush.
        """
        done = self.alone(fn, args, is_append)
        if done is not NOT_ALONE:
            return done
        return await self.grouped(fn, args, is_append)

    def alone(self, fn: Callable[..., Any], args: tuple[Any, ...], is_append: bool) -> Any:
        """``fn(db, *args)``'s value, committed at once in a transaction of its own, when
        this write is alone: no group on the running loop, no other task ready to join
        one, commits cheap enough for the loop, the write lock free (the common case: one
        session's sequential steps). Else ``NOT_ALONE``, and nothing was written: await
        :meth:`grouped`. No group and no future to make and resolve, no loop step: the
        whole write is straight-line code on the loop's thread.

        Raises what :meth:`run` raises.
        """
        if self.closed:
            raise LogClosed(f"the SQLite log {self._path!r} is closed")
        loop = asyncio.get_running_loop()
        ready = getattr(loop, "_ready", None)  # (see _others_ready)
        if (
            (self._groups and self._groups.get(loop) is not None)
            or ready is None
            or ready
            or self._inline_limit <= 0
            or self._commit_avg > self._inline_limit
        ):
            return NOT_ALONE
        with self._wlock:
            db = self._wconn
            if db is None:
                raise LogClosed(f"the SQLite log {self._path!r} is closed")
            try:
                try:
                    db.statements.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError as exc:
                    if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_BUSY:
                        return NOT_ALONE  # locked by another connection: the group waits for it
                    raise
                started = time.perf_counter()
                try:
                    db.known.begin(db)
                    try:
                        out = fn(db, *args)
                    except _REFUSALS:
                        db.execute("ROLLBACK")  # (a refusal wrote nothing: what is known holds)
                        self._committed(time.perf_counter() - started, -1, False)
                        raise
                    db.statements.execute("COMMIT")
                except _REFUSALS:
                    raise
                except BaseException:
                    self._abort(db)
                    raise
                self._committed(time.perf_counter() - started, int(is_append), False)
                return out
            except (sqlite3.Error, UnicodeDecodeError) as exc:
                raise LogUnavailable(f"SQLite log {self._path!r}: {exc}") from exc

    async def grouped(self, fn: Callable[..., Any], args: tuple[Any, ...], is_append: bool) -> Any:
        """Run ``fn(db, *args)`` in the next group commit of the running loop; its value
        (a write :meth:`alone` did not take)."""
        if self.closed:
            raise LogClosed(f"the SQLite log {self._path!r} is closed")
        loop = asyncio.get_running_loop()
        group = self._groups.get(loop)
        if (group is not None and (group.queue or group.scheduled or group.inflight is not None)) or (
            self._inline_limit <= 0 or self._commit_avg > self._inline_limit
        ):
            return await self.write(fn, args, is_append)
        if group is None:
            group = self._groups[loop] = _Group()
        fut = loop.create_future()
        group.queue.append((fn, args, fut, is_append))
        group.scheduled = True  # (the flush is this task's: later writes only queue)
        if _others_ready(loop):
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

    def run_blocking(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Run ``fn(db, *args)`` in a transaction of its own on the calling thread (not an
        event loop's: it waits for the write lock); its value, or its refusal raised."""
        if self.closed:
            raise LogClosed(f"the SQLite log {self._path!r} is closed")
        [outcome] = self._commit([(fn, args, None, False)], wait=True)  # type: ignore[list-item]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def write(self, fn: Callable[..., Any], args: tuple[Any, ...], is_append: bool) -> asyncio.Future[Any]:
        """Queue ``fn(db, *args)`` for the next group commit of the running loop."""
        if self.closed:
            raise LogClosed(f"the SQLite log {self._path!r} is closed")
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
            if not fut.done():
                fut.set_exception(self._write_error(exc))

    def _write_error(self, exc: BaseException) -> BaseException:
        """What a write of a failed transaction raises: a ``LogUnavailable`` of its own
        (the SQLite error as its cause), or a bug as itself."""
        if isinstance(exc, LogUnavailable) or not isinstance(exc, Exception):
            err = LogUnavailable(str(exc) or f"SQLite log {self._path!r}: write interrupted")
            err.__cause__ = exc.__cause__ if isinstance(exc, LogUnavailable) else exc
            return err
        return exc

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
                raise LogClosed(f"the SQLite log {self._path!r} is closed")
            try:
                if wait:
                    db = self._thread_conn()
                try:
                    db.statements.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError as exc:
                    if not wait and (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_BUSY:
                        raise _Busy() from None
                    raise
                started = time.perf_counter()
                try:
                    db.known.begin(db)
                    outcomes, appends = self._run_ops(db, ops)
                except BaseException:
                    self._abort(db)
                    raise
                self._committed(time.perf_counter() - started, appends, wait)
                return outcomes
            except (sqlite3.Error, UnicodeDecodeError) as exc:
                raise LogUnavailable(f"SQLite log {self._path!r}: {exc}") from exc

    @staticmethod
    def _abort(db: WriteConnection) -> None:
        """A transaction that failed: forget what it wrote, roll it back."""
        db.known.forget()  # (what this transaction wrote is gone)
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")

    def _committed(self, took: float, appends: int, offloaded: bool) -> None:
        """A transaction that ended (``appends`` -1: every write of it refused)."""
        # A moving average of commit times, each clipped so one stall (a checkpoint, a
        # noisy neighbour) does not move commits off the loop.
        self._commit_avg += (min(took, 2 * self._inline_limit) - self._commit_avg) * 0.125
        if appends >= 0:
            metrics.group_commit(appends)
            stats = self._stats
            stats.transactions += 1
            stats.appends += appends
            stats.offloaded += offloaded

    def _thread_conn(self) -> WriteConnection:
        """The writer thread's connection (made at its first commit, ``_wlock`` held): it
        waits up to ``busy_timeout`` for another connection's lock; its pragmas are set once."""
        conn = self._tconn
        if conn is None:
            conn = sqlite3.connect(
                self._path,
                timeout=self._busy_seconds,
                isolation_level=None,
                check_same_thread=False,
                factory=WriteConnection,
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_seconds * 1000)}")
            conn.execute("PRAGMA synchronous = FULL")
            self._tconn = conn
        return conn

    @staticmethod
    def _run_ops(db: WriteConnection, ops: list[_Op]) -> tuple[list[Any], int]:
        """Inside BEGIN: run each op, then COMMIT (or ROLLBACK when none landed: -1 appends)."""
        if len(ops) == 1:  # the sequential case: the transaction is the op
            fn, args, _, is_append = ops[0]
            try:
                out = fn(db, *args)
            except _REFUSALS as exc:
                db.execute("ROLLBACK")
                return [exc], -1
            db.statements.execute("COMMIT")
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
