"""Following a session log as it grows, on any backend: ``subscribe(log, session_id, after=)``.

* Kafka has its own shared tail per partition (``KafkaLog.subscribe``,
  :mod:`harness.log.kafka.fanout`); :func:`subscribe` uses it.
* Memory and SQLite get the same shape here: ONE reader per log per process
  (:class:`LogFanout`) reads the records after its position whenever the log changed
  and routes them to every subscriber, so a thousand waiters cost one query per change,
  not a thousand. It learns of changes from a :class:`ChangeSource`: the memory log
  signals its own appends in-process; a SQLite file is watched with
  ``PRAGMA data_version`` every ``CHANGE_CHECK_S`` (a few microseconds a check, on a
  thread of its own), which sees commits of this process and of any other.
* Anything else is polled every ``POLL_S``.

No gap, no duplicate: a subscriber that starts behind the reader first reads its own
records up to the reader's position (an indexed read of one session), then takes the
live ones, which queue meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import sqlite3
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection
from typing import Any, Protocol

from harness.errors import CorruptRecord, LogClosed
from harness.log.base import LogEntry

__all__ = [
    "CHANGE_CHECK_S",
    "ChangeSignal",
    "ChangeSource",
    "DataVersionWatch",
    "LogFanout",
    "shared_reader",
    "subscribe",
    "watch_changes",
]

log = logging.getLogger("harness.log")

CHANGE_CHECK_S = 0.002
"""How often a SQLite file's ``PRAGMA data_version`` is checked (a few µs each)."""
POLL_S = 0.1
"""How often a log with no change source is read again."""
CHUNK = 2000
"""Records per read of the shared reader."""
LINGER_S = 30.0
"""A reader without subscribers stops after this long."""
MAX_QUEUED = 10_000
"""Records queued for one subscriber at most; past that it reads them back from the log."""


class ChangeSource(Protocol):
    """Tells that a log changed: ``version`` moves on at every commit."""

    @property
    def version(self) -> int: ...

    async def wait(self, seen: int) -> int:
        """Return the version once it differs from ``seen`` (at once if it already does)."""
        ...

    async def end(self) -> int:
        """The log's last position now (0 when empty)."""
        ...

    def acquire(self) -> None:
        """Somebody needs change notices (a watcher may start its thread)."""
        ...

    def release(self) -> None: ...


class ChangeSignal:
    """An in-process change notice, safe to ``notify`` from any thread, awaited on any loop.

    Args:
        end: the log's last position now.
    """

    def __init__(self, end: Callable[[], int]) -> None:
        self._end = end
        self._lock = threading.Lock()
        self._version = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def version(self) -> int:
        return self._version

    def notify(self) -> None:
        with self._lock:
            self._version += 1
            waiters, self._waiters = self._waiters, []
        if not waiters:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop, future in waiters:
            if loop is running:
                _wake(future)
            else:
                with contextlib.suppress(RuntimeError):  # that loop is closed
                    loop.call_soon_threadsafe(_wake, future)

    async def wait(self, seen: int) -> int:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._version != seen:
                return self._version
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, future))
        await future
        return self._version

    async def end(self) -> int:
        return self._end()

    def acquire(self) -> None:
        pass

    def release(self) -> None:
        pass


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class DataVersionWatch(ChangeSignal):
    """Watches a SQLite file for commits with ``PRAGMA data_version`` on a thread.

    The thread runs while somebody ``acquire``d the watch. Its connection never writes,
    so every commit (of this process's log connection or of another process) changes
    the value it reads. ``checks`` counts the checks made (for tests).
    """

    def __init__(
        self, path: str, *, every: float = CHANGE_CHECK_S, connect: Callable[[], sqlite3.Connection] | None = None
    ) -> None:
        super().__init__(end=self._max_seq)
        self._path = path
        self._connect = connect  # how to open the file (a read-only log's own way); else the path
        self._every = every
        self._users = 0
        self._users_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._db_lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self.checks = 0

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            if self._connect is not None:
                self._db = self._connect()
            else:
                self._db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        return self._db

    def _data_version(self) -> int:
        with self._db_lock:
            return int(self._conn().execute("PRAGMA data_version").fetchone()[0])

    def _max_seq(self) -> int:
        # The records table of harness.log.sqlite: seq is the log position.
        with self._db_lock:
            try:
                row = self._conn().execute("SELECT max(seq) FROM records").fetchone()
            except sqlite3.OperationalError:  # no table yet: an empty log
                return 0
        return int(row[0] or 0)

    async def end(self) -> int:
        return await asyncio.to_thread(self._max_seq)

    def acquire(self) -> None:
        with self._users_lock:
            self._users += 1
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="harness-sqlite-watch", daemon=True)
                self._thread.start()

    def release(self) -> None:
        with self._users_lock:
            self._users = max(0, self._users - 1)
            if self._users == 0:
                self._stop.set()

    def _run(self) -> None:
        try:
            last = self._data_version()
            while not self._stop.wait(self._every):
                now = self._data_version()
                self.checks += 1
                if now != last:
                    last = now
                    self.notify()
        except sqlite3.Error as exc:  # the file went away: wake everybody, they will see
            log.warning("watching %s for changes failed: %s", self._path, exc)
            self.notify()
        finally:
            with self._db_lock:
                if self._db is not None:
                    self._db.close()
                    self._db = None


_watches: weakref.WeakKeyDictionary[Any, ChangeSource] = weakref.WeakKeyDictionary()
_fanouts: weakref.WeakKeyDictionary[Any, LogFanout] = weakref.WeakKeyDictionary()


def watch_changes(session_log: Any) -> ChangeSource | None:
    """The change source of a log (one per log object), or None if it has none."""
    found = _watches.get(session_log)
    if found is not None:
        return found
    own = getattr(session_log, "changes", None)
    if own is not None:
        source: ChangeSource = own
    else:
        from harness.log.sqlite import SqliteLog

        if not isinstance(session_log, SqliteLog):
            return None
        source = DataVersionWatch(session_log.path, connect=session_log.connect_reader)
    _watches[session_log] = source
    return source


class _Sub:
    __slots__ = ("after", "catch_up_to", "queue", "session_id", "waiter")

    def __init__(self, session_id: str | None, after: int) -> None:
        self.session_id = session_id
        self.after = after
        self.queue: collections.deque[LogEntry] = collections.deque()
        self.catch_up_to: int | None = None
        self.waiter: asyncio.Future[None] | None = None

    def push(self, entry: LogEntry) -> None:
        if len(self.queue) >= MAX_QUEUED:
            # A stalled reader (a slow SSE client): forget what it has not taken; it reads
            # those records back from the log when it goes on, so memory stays bounded and
            # nothing is lost or repeated.
            self.queue.clear()
            self.catch_up_to = entry.seq
        else:
            self.queue.append(entry)
        self.wake()

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class LogFanout:
    """One shared reader of a memory or SQLite log, fanned out to subscribers (module doc)."""

    def __init__(self, session_log: Any, changes: ChangeSource) -> None:
        self._log = session_log
        self._changes = changes
        self._subs: dict[str | None, set[_Sub]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._started: asyncio.Future[None] | None = None
        self._linger: asyncio.TimerHandle | None = None
        self.position = 0  # every record <= position was dispatched
        self.reads = 0  # shared reads made (for tests)
        self._failure: Exception | None = None

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._reader is not None and not self._reader.done() and self._reader.get_loop() is loop:
            if self._linger is not None:
                self._linger.cancel()
                self._linger = None
            assert self._started is not None
            await asyncio.shield(self._started)
            return
        self._started = loop.create_future()
        self._failure = None
        self._changes.acquire()
        self._reader = loop.create_task(self._run(self._started), name="harness-log-fanout")
        await asyncio.shield(self._started)

    async def _run(self, started: asyncio.Future[None]) -> None:
        try:
            self.position = await self._changes.end()
            started.set_result(None)
            while True:
                version = self._changes.version
                items = await self._log.scan(None, after=self.position, limit=CHUNK)
                self.reads += 1
                for item in items:
                    if isinstance(item, LogEntry):
                        self._dispatch(item)
                    self.position = max(self.position, item.seq or self.position)
                if len(items) < CHUNK:
                    await self._changes.wait(version)
        except Exception as exc:  # noqa: BLE001 - every subscriber raises it
            # (a log closed under it: the process is stopping, nothing went wrong)
            log.log(logging.DEBUG if isinstance(exc, LogClosed) else logging.WARNING,
                    "following the log failed: %s", exc)
            self._failure = exc
            if not started.done():
                started.set_exception(exc)
            for subs in self._subs.values():
                for sub in subs:
                    sub.wake()
        finally:
            self._changes.release()

    def _dispatch(self, entry: LogEntry) -> None:
        for key in (entry.session_id, None):
            for sub in self._subs.get(key, ()):
                sub.push(entry)

    def subscribers(self, session_id: str | None) -> int:
        """Subscribers of ``session_id`` (of every session if None) now (for tests and metrics)."""
        return len(self._subs.get(session_id, ()))

    async def subscribe(self, session_id: str | None, *, after: int) -> AsyncIterator[LogEntry]:
        """Records of ``session_id`` (every session if None) with seq > ``after``, live."""
        await self._start()
        sub = _Sub(session_id, max(0, after))
        self._subs.setdefault(session_id, set()).add(sub)
        if sub.after < self.position:
            sub.catch_up_to = self.position
        try:
            while True:
                if sub.catch_up_to is not None:
                    end, sub.catch_up_to = sub.catch_up_to, None
                    async for entry in self._catch_up(session_id, sub.after, end):
                        sub.after = entry.seq
                        yield entry
                    sub.after = max(sub.after, end)
                while sub.queue and sub.catch_up_to is None:  # a pending read back comes first
                    entry = sub.queue.popleft()
                    if entry.seq > sub.after:
                        sub.after = entry.seq
                        yield entry
                if self._failure is not None:
                    raise self._failure
                if sub.queue or sub.catch_up_to is not None:
                    continue  # pushed (or cut short) while this reader was yielding
                sub.waiter = asyncio.get_running_loop().create_future()
                try:
                    await sub.waiter
                finally:
                    sub.waiter = None
        finally:
            subs = self._subs.get(session_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[session_id]
            if not self._subs and self._reader is not None and self._linger is None:
                self._linger = asyncio.get_running_loop().call_later(LINGER_S, self._stop_idle)

    async def _catch_up(self, session_id: str | None, after: int, end: int) -> AsyncIterator[LogEntry]:
        """The records of ``session_id`` in ``(after, end]`` (later ones come live)."""
        position = after
        while position < end:
            if session_id is None:
                items = await self._log.scan(None, after=position, limit=CHUNK)
            else:
                items = await self._log.scan(session_id, after=position, limit=CHUNK)
            for item in items:
                if item.seq is None or item.seq > end:
                    return
                position = item.seq
                if isinstance(item, CorruptRecord):
                    log.error("skipping an undecodable record: %s", item)
                    continue
                yield item
            if len(items) < CHUNK:
                return

    def _stop_idle(self) -> None:
        self._linger = None
        if not self._subs and self._reader is not None:
            self._reader.cancel()
            self._reader = None


def shared_reader(session_log: Any) -> LogFanout | None:
    """The shared reader of a memory or SQLite log (one per log object), None for others."""
    found = _fanouts.get(session_log)
    if found is None:
        changes = watch_changes(session_log)
        if changes is None or not hasattr(session_log, "scan"):
            return None
        found = _fanouts[session_log] = LogFanout(session_log, changes)
    return found


async def subscribe(
    session_log: Any,
    session_id: str,
    *,
    after: int | None = None,
    dead_letter: bool = True,
    types: Collection[str] | None = None,
) -> AsyncGenerator[LogEntry, None]:
    """The committed records of ``session_id`` with seq > ``after`` (all if None), live.

    Each entry's ``seq`` is its position: pass the last one seen as ``after`` to resume.
    Never ends by itself; close the iterator to stop. On Kafka a poison record is
    dead-lettered and skipped; ``dead_letter=False`` (a reader that writes nothing) skips
    it quietly (the other logs never dead-letter). ``types``: only records of these log
    record types (``LogEntry.record_type``); on Kafka the others are not even decoded.
    """
    wanted = frozenset(types) if types is not None else None
    own = getattr(session_log, "subscribe", None)
    if own is not None:  # Kafka: its shared per-partition tails
        if wanted is None:
            async for entry in own(session_id, after=after, dead_letter=dead_letter):
                yield entry
        else:
            async for entry in own(session_id, after=after, dead_letter=dead_letter, types=wanted):
                if entry.record_type in wanted:
                    yield entry
        return
    fanout = shared_reader(session_log)
    if fanout is not None:
        async for entry in fanout.subscribe(session_id, after=after or 0):
            if wanted is None or entry.record_type in wanted:
                yield entry
        return
    position = after or 0
    while True:  # a log of another kind: read again every POLL_S
        entries = await session_log.read(session_id, after=position)
        for entry in entries:
            position = entry.seq
            if wanted is None or entry.record_type in wanted:
                yield entry
        if not entries:
            await asyncio.sleep(POLL_S)
