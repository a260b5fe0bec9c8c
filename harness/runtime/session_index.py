"""Every session of a SQLite or memory log at a glance, kept up to date as the log grows.

A listing of such a log reads it whole and folds every session (``list_sessions``): on a
file of 100k records that is seconds, on every request of a long-running reader. A
:class:`SessionIndex` reads the log once, then only what was appended since its previous
listing, and folds each new record into its session:

* a session with a turn in progress keeps its folded state (its summary depends on the
  time: a sleep ends);
* a session with no turn in progress keeps only its summary, which no clock changes; a
  new record of it reads that session again (by its id) and folds it whole.

So the memory is one small summary per session plus the state of the busy ones. Records
that cannot be decoded are skipped (and counted), never dead-lettered: a reader writes
nothing. Commits land in position order in these logs, so a position read past is never
filled in later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from harness.errors import CorruptRecord
from harness.log.base import SessionLog
from harness.records import LogEntry
from harness.replay import SessionState, fold
from harness.views import SessionSummary, summarize

__all__ = ["SessionIndex"]

CHUNK = 5000
"""Records per read while catching up."""

log_ = logging.getLogger("harness.catalog")


class SessionIndex:
    """The sessions of one SQLite or memory log (one ``scan``-able log; not Kafka).

    Args:
        log: the log to index; read-only (never claims, writes or fences).
    """

    def __init__(self, log: SessionLog) -> None:
        self._log: Any = log
        self._position = 0  # the log is folded up to here
        self._busy: dict[str, tuple[SessionState, int]] = {}  # a turn in progress: (state, last ts)
        self._quiet: dict[str, SessionSummary] = {}  # no turn in progress: the summary
        self._lock = asyncio.Lock()
        self.unreadable = 0
        """Records skipped so far because they could not be decoded."""

    async def summaries(self, *, now_ms: int | None = None) -> list[SessionSummary]:
        """One summary per session (no particular order), as of ``now_ms`` (default: now)."""
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        async with self._lock:  # one catch-up at a time; the others then read its result
            touched = await self._catch_up()
            for sid in touched:
                self._settle(sid, now)
            busy = [summarize(state, now_ms=now, last_activity_ms=ts) for state, ts in self._busy.values()]
            return [*self._quiet.values(), *busy]

    async def _catch_up(self) -> set[str]:
        """Fold every record appended since the last call; the sessions it touched."""
        touched: set[str] = set()
        unreadable = 0
        while True:
            items = await self._log.scan(None, after=self._position, limit=CHUNK)
            if not items:
                break
            for item in items:
                if isinstance(item, CorruptRecord):
                    unreadable += 1
                else:
                    await self._fold(item)
                    touched.add(item.session_id)
                self._position = max(self._position, item.seq or self._position)
        if unreadable:
            self.unreadable += unreadable
            log_.warning("%d records could not be decoded and were left out", unreadable)
        return touched

    async def _fold(self, entry: LogEntry) -> None:
        sid = entry.session_id
        known = self._busy.get(sid)
        if known is None:
            entries: list[LogEntry] = [entry]
            if self._quiet.pop(sid, None) is not None:  # quiet until now: read it whole
                entries = [e for e in await self._log.scan(sid) if not isinstance(e, CorruptRecord)]
            state = fold(sid, entries)
            self._busy[sid] = (state, max((e.record.ts for e in entries), default=entry.record.ts))
            return
        state, ts = known
        state.apply(entry.seq, entry.record)  # (already folded by a whole read: ignored)
        state.mark_read(entry.seq)
        self._busy[sid] = (state, max(ts, entry.record.ts))

    def _settle(self, sid: str, now_ms: int) -> None:
        """A session with no turn in progress keeps only its summary."""
        known = self._busy.get(sid)
        if known is None:
            return
        state, ts = known
        if state.active_turn is None:
            self._quiet[sid] = summarize(state, now_ms=now_ms, last_activity_ms=ts)
            del self._busy[sid]
