"""Where the gateway reads sessions from: two small interfaces and their log-backed versions.

* :class:`EventSource`: ``subscribe(session_id, after)`` -> the session's committed
  records with ``seq > after``, live, with no gap and no duplicate; ``live(session_id)``
  -> live-only events (model text deltas) or nothing.
* :class:`SessionCatalog`: ``session_ids()`` and ``read(session_id)``.

:class:`LogEventSource` shares ONE reader per log (SQLite/memory: one poller for
the whole log) or per partition (Kafka: one tailing consumer per partition) among
every subscriber of the process, so a thousand SSE streams of a session cost one
reader. A subscriber registers with the shared reader first, then catches up with
``log.read(session_id, after=cursor)``, then takes the shared reader's entries with
``seq > cursor``: whatever the shared reader had not yet delivered when the
subscriber registered, the catch-up read holds, so nothing is lost and the cursor
drops repeats.

These are stand-ins for the shared fan-out and the session catalog that other parts
of the library provide; switching to them changes only :func:`default_sources`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from harness.errors import CorruptRecord, LogError
from harness.log.base import SessionLog
from harness.records import LogEntry

__all__ = ["EventSource", "LogCatalog", "LogEventSource", "SessionCatalog", "default_sources"]

log = logging.getLogger("harness.gateway")

POLL_S = 0.05
"""How often the shared reader of a SQLite/memory log looks for new records."""
QUEUE_MAX = 10_000
"""Entries a subscriber may be behind before it is cut off (it then resumes with Last-Event-ID)."""
SCAN_CHUNK = 2000


class SubscriberTooSlow(LogError):
    """A stream fell too far behind the log; the client reconnects with its last event id."""


class EventSource(Protocol):
    def subscribe(self, session_id: str, after: int) -> AsyncIterator[LogEntry]: ...

    def live(self, session_id: str) -> AsyncIterator[dict[str, Any]]: ...

    @property
    def subscribers(self) -> int: ...

    async def close(self) -> None: ...


class SessionCatalog(Protocol):
    async def session_ids(self) -> list[str]: ...

    async def read(self, session_id: str, *, after: int | None = None) -> list[LogEntry]: ...


class LogCatalog:
    """Sessions of any log: its own ``sessions()`` listing, ``read`` per session."""

    def __init__(self, log: SessionLog) -> None:
        self.log = log

    async def session_ids(self) -> list[str]:
        sessions = getattr(self.log, "sessions", None)
        if sessions is None:
            return []
        return list(await sessions())

    async def read(self, session_id: str, *, after: int | None = None) -> list[LogEntry]:
        return await self.log.read(session_id, after=after)


class _Feed:
    """One shared reader: its subscribers' queues, keyed by session id."""

    def __init__(self) -> None:
        self.queues: dict[str, set[asyncio.Queue[LogEntry | BaseException]]] = {}
        self.position: int | None = None  # delivered everything up to here
        self.task: asyncio.Task[None] | None = None

    def deliver(self, entry: LogEntry) -> None:
        for queue in list(self.queues.get(entry.session_id, ())):
            try:
                queue.put_nowait(entry)
            except asyncio.QueueFull:
                self._cut(queue, entry.session_id)

    def fail(self, exc: BaseException) -> None:
        for sid, queues in list(self.queues.items()):
            for queue in list(queues):
                self._cut(queue, sid, exc)

    def _cut(self, queue: asyncio.Queue[LogEntry | BaseException], sid: str,
             exc: BaseException | None = None) -> None:
        self.queues.get(sid, set()).discard(queue)
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(exc or SubscriberTooSlow(f"a stream of session {sid!r} fell behind; resume it"))

    @property
    def count(self) -> int:
        return sum(len(q) for q in self.queues.values())


class LogEventSource:
    """:class:`EventSource` on a session log, one shared reader per log or per partition."""

    def __init__(self, log: SessionLog, *, poll_s: float = POLL_S) -> None:
        self.log = log
        self.poll_s = poll_s
        self._feeds: dict[int, _Feed] = {}
        self._tail: Callable[..., AsyncIterator[LogEntry]] | None = getattr(log, "tail_partition", None)
        self.readers_started = 0  # shared readers started (for tests: one per log / partition)

    def _key(self, session_id: str) -> int:
        if self._tail is not None:
            return int(self.log.partition_for(session_id))  # type: ignore[attr-defined]
        return 0

    @property
    def subscribers(self) -> int:
        return sum(feed.count for feed in self._feeds.values())

    async def subscribe(self, session_id: str, after: int) -> AsyncIterator[LogEntry]:
        key = self._key(session_id)
        feed = self._feeds.setdefault(key, _Feed())
        queue: asyncio.Queue[LogEntry | BaseException] = asyncio.Queue(QUEUE_MAX)
        feed.queues.setdefault(session_id, set()).add(queue)
        cursor = after
        try:
            for entry in await self.log.read(session_id, after=cursor):  # catch up
                if entry.seq > cursor:
                    cursor = entry.seq
                    yield entry
            if feed.task is None or feed.task.done():
                if feed.position is None:
                    feed.position = cursor
                self.readers_started += 1
                feed.task = asyncio.create_task(self._run(key, feed), name=f"harness-gateway-feed-{key}")
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.seq > cursor:
                    cursor = item.seq
                    yield item
        finally:
            queues = feed.queues.get(session_id)
            if queues is not None:
                queues.discard(queue)
                if not queues:
                    del feed.queues[session_id]
            if not feed.queues and feed.task is not None:  # nobody listens: stop reading
                feed.task.cancel()
                feed.task = None
                feed.position = None

    async def _run(self, key: int, feed: _Feed) -> None:
        start = feed.position or 0
        try:
            if self._tail is not None:
                async for entry in self._tail(key, start):
                    feed.position = entry.seq
                    feed.deliver(entry)
            else:
                await self._poll(feed, start)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to every subscriber, which ends its stream
            log.warning("the gateway's reader of %s stopped: %s", key, exc)
            feed.fail(exc)

    async def _poll(self, feed: _Feed, position: int) -> None:
        scan = getattr(self.log, "scan", None)
        while True:
            items: list[Any] = await scan(None, after=position, limit=SCAN_CHUNK) if scan else []
            for item in items:
                if isinstance(item, CorruptRecord):
                    position = max(position, item.seq or position)
                    continue
                position = max(position, item.seq)
                feed.position = position
                feed.deliver(item)
            if len(items) < SCAN_CHUNK:
                await asyncio.sleep(self.poll_s)

    async def live(self, session_id: str) -> AsyncIterator[dict[str, Any]]:
        """Live-only events (model text deltas): none until the log publishes them."""
        return
        yield  # pragma: no cover  (an async generator that ends at once)

    async def close(self) -> None:
        for feed in self._feeds.values():
            if feed.task is not None:
                feed.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await feed.task
        self._feeds.clear()


def default_sources(log: SessionLog) -> tuple[EventSource, SessionCatalog]:
    """The event source and catalog the gateway uses for ``log``."""
    return LogEventSource(log), LogCatalog(log)
