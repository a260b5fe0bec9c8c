"""The sessions a gateway process read lately: their records and folded state, caught up per request.

Every request about a session needs its records (a receipt looks through its inputs, the
page shows its timeline) and its folded state (its harness, open asks, the views).
Reading and decoding a whole history per request costs time linear in its length (about
18 ms for 1,100 records on SQLite), on every message, answer and page view. So the
gateway keeps the sessions it read last: a request reads only the records after the
position it knows (``read(session, after=position)``) and folds them on.

A session's committed records never change and only grow at the end (SQLite and memory
commit in position order; a Kafka read_committed reader never sees past an open
transaction), so catching up gives what reading it all again would: every replica
answers the same. Bounded: whole sessions are evicted, least recently used first, once
the kept records pass ``MAX_ENTRIES`` or their size passes ``max_bytes`` (``MAX_BYTES``,
``harness gateway --session-cache-mb``; a record counts its encoded size, or the text
and JSON it holds: kept in memory it takes a few times that). A session with no record is never kept (a 404
costs one small read, and probing ids fills nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass
from typing import Protocol

from harness.errors import LogError
from harness.jsonvalues import dumps
from harness.records import LogEntry
from harness.replay.state import SessionState, fold

__all__ = [
    "FOLLOW_TIMEOUT_S", "MAX_BYTES", "MAX_ENTRIES", "SessionFollower", "SessionReader", "SessionView", "Sessions",
    "entry_bytes",
]

MAX_ENTRIES = 200_000
"""Records kept in memory across sessions, at most."""
MAX_BYTES = 64 * 1024 * 1024
"""The size of the kept records (:func:`entry_bytes`) at most: with Python's objects around
them a few times that in memory, within the chart's 512Mi gateway limit. Record counts
alone did not bound it: 200,000 model answers of a few KB each are a GB."""
FOLLOW_TIMEOUT_S = 5.0
"""How long :meth:`Sessions.get_through` waits on the live records before it reads instead."""


class SessionReader(Protocol):
    """A session's committed records with seq > ``after`` (all if None), read-only."""

    def __call__(self, session_id: str, *, after: int | None = None) -> Awaitable[list[LogEntry]]: ...


class SessionFollower(Protocol):
    """A session's committed records with seq > ``after`` (all if None), live (never ends)."""

    def __call__(self, session_id: str, *, after: int | None = None) -> AsyncGenerator[LogEntry, None]: ...


_RECORD_OVERHEAD = 64
"""What a record counts besides its text and JSON (its ids, numbers and framing)."""


def entry_bytes(entry: LogEntry) -> int:
    """About the bytes a record takes in the log: its encoded value when the entry still
    has it (a Kafka read), else the text and the JSON of its fields."""
    raw = getattr(entry, "raw", None)
    if isinstance(raw, bytes | bytearray):
        return len(raw)
    size = _RECORD_OVERHEAD
    record = entry.record
    for name in record.__dataclass_fields__:
        value = getattr(record, name)
        if isinstance(value, str):
            size += len(value)
        elif isinstance(value, dict | list | tuple):
            size += len(dumps(value))
    return size


@dataclass(slots=True)
class SessionView:
    """A session as far as it was read: its records in log order and their fold.

    Shared by the requests of the process: read it, never change it.
    """

    session_id: str
    entries: list[LogEntry]
    state: SessionState
    size: int = 0
    """The :func:`entry_bytes` of ``entries``."""

    @property
    def position(self) -> int:
        """The last position read (0: none)."""
        return self.entries[-1].seq if self.entries else 0

    def _take(self, entries: list[LogEntry]) -> tuple[int, int]:
        """Fold on the entries past ``position`` (in order); how many there were, their bytes."""
        new = [e for e in entries if e.seq > self.position]
        size = 0
        for entry in new:
            self.state.apply(entry.seq, entry.record)
            self.entries.append(entry)
            size += entry_bytes(entry)
        if new:
            self.state.mark_read(self.position)
        self.size += size
        return len(new), size


class Sessions:
    """The latest sessions read, each caught up on every :meth:`get` (see the module doc).

    Args:
        read: how a session's records are read (``harness.runtime.catalog.read_session``).
        max_entries: records kept across sessions before the least recently used go.
        max_bytes: their :func:`entry_bytes` before the least recently used go.
        follow: the log's live records of a session (``harness.log.follow.subscribe``),
            for :meth:`get_through`; None: it reads.
        follow_timeout: how long :meth:`get_through` waits on ``follow`` before it reads.
        watch: the log's live records of a session on any log, for :meth:`changes`.
    """

    def __init__(
        self,
        read: SessionReader,
        *,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        follow: SessionFollower | None = None,
        follow_timeout: float = FOLLOW_TIMEOUT_S,
        watch: SessionFollower | None = None,
    ) -> None:
        self._read = read
        self._follow = follow
        self._watch = watch
        self._follow_timeout = follow_timeout
        self._max = max_entries
        self._max_bytes = max_bytes
        self._views: OrderedDict[str, SessionView] = OrderedDict()
        self._kept = 0
        self._kept_bytes = 0
        self.full_reads = 0  # whole histories read (for tests)

    async def get(self, session_id: str) -> SessionView:
        """The session with every record committed when it was asked (empty: no such session)."""
        view = self._views.get(session_id)
        if view is None:
            self.full_reads += 1
            entries = await self._read(session_id)
            view = self._views.get(session_id)  # another request may have read it meanwhile
            if view is None:
                view = SessionView(session_id, [], fold(session_id, []))
                view._take(entries)
                if view.entries:
                    self._keep(view)
                return view
        else:
            entries = await self._read(session_id, after=view.position)
        self._catch_up(view, entries)
        return view

    async def get_through(self, session_id: str, seq: int) -> SessionView:
        """The session with every record up to position ``seq`` at least, where the caller
        knows a committed record of it is (its own input, just written).

        With ``follow`` the records come from the log's live subscription (on Kafka the
        process's shared tail of the partition: no read of its own, which costs the
        broker a watermark query, an assignment and fetches); the view stays a prefix of
        the session, in log order. Without it, or if the records do not come within
        ``follow_timeout`` (or the subscription fails), it is :meth:`get`.
        """
        base = self._views.get(session_id)
        if base is not None and base.position >= seq:
            return base
        if self._follow is None:
            return await self.get(session_id)
        entries: list[LogEntry] = []
        try:
            async with asyncio.timeout(self._follow_timeout):
                stream = self._follow(session_id, after=base.position if base is not None else None)
                async with contextlib.aclosing(stream) as live:
                    async for entry in live:
                        entries.append(entry)
                        if entry.seq >= seq:
                            break
        except (TimeoutError, LogError):
            return await self.get(session_id)
        view = base if base is not None else self._views.get(session_id)  # (another request's meanwhile)
        if view is None:
            view = SessionView(session_id, [], fold(session_id, []))
            view._take(entries)
            if view.entries:
                self._keep(view)
            return view
        self._catch_up(view, entries)
        return view

    async def changes(self, session_id: str) -> AsyncGenerator[SessionView, None]:
        """The session now, then again each time a record of it is committed, live: never
        ends (close it to stop). The view is the kept one when it is kept (other requests
        see the records too), else this watch's own. A kept view is not read first: the
        live records after its position catch it up (on Kafka a read would cost the
        broker a consumer's fetches; the shared tail has the records already).

        Raises:
            RuntimeError: no ``watch`` was given.
        """
        if self._watch is None:
            raise RuntimeError("Sessions.changes needs watch= (the log's live records of a session)")
        view = self._views.get(session_id) or await self.get(session_id)
        yield view
        stream = self._watch(session_id, after=view.position)
        async with contextlib.aclosing(stream) as live:
            async for entry in live:
                kept = self._views.get(session_id)
                if kept is not None and kept is not view and kept.position >= view.position:
                    view = kept  # read anew by another request (this one was evicted meanwhile)
                self._catch_up(view, [entry])
                yield view

    def known(self, session_id: str) -> SessionView | None:
        """The session as far as it was read already, without reading (None: not kept)."""
        return self._views.get(session_id)

    def _catch_up(self, view: SessionView, entries: list[LogEntry]) -> None:
        """Fold ``entries`` on into ``view``; a kept view counts them and is the most recently used."""
        taken, size = view._take(entries)
        if self._views.get(view.session_id) is view:  # (not evicted meanwhile)
            self._kept += taken
            self._kept_bytes += size
            self._views.move_to_end(view.session_id)
            self._evict()

    def _keep(self, view: SessionView) -> None:
        self._views[view.session_id] = view
        self._kept += len(view.entries)
        self._kept_bytes += view.size
        self._evict()

    def _evict(self) -> None:
        """The least recently used sessions go while over a bound (the latest one stays)."""
        while (self._kept > self._max or self._kept_bytes > self._max_bytes) and len(self._views) > 1:
            _, old = self._views.popitem(last=False)
            self._kept -= len(old.entries)
            self._kept_bytes -= old.size

    @property
    def kept(self) -> tuple[int, int]:
        """(sessions, records) kept now."""
        return len(self._views), self._kept

    @property
    def kept_bytes(self) -> int:
        """The :func:`entry_bytes` of the records kept now."""
        return self._kept_bytes
