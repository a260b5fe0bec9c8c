"""Every session of a log at a glance, kept up to date as the log grows.

A listing reads the log and folds every session (``list_sessions``): on a file of 100k
records that is seconds, on every request of a long-running reader. An index reads the
log once, then only what was appended since its previous listing, and folds each new
record into its session:

* a session with a turn in progress keeps its folded state (its summary depends on the
  time: a sleep ends);
* a session with no turn in progress keeps only its summary, which no clock changes; a
  new record of it reads that session again (by its id) and folds it whole.

So the memory is one small summary per session plus the state of the busy ones (a
summary's repeated words, its harness and outcome, are shared, and so is an empty
usage: ~230 bytes a quiet summary where its own copies took ~470). Records
that cannot be decoded are skipped (and counted), never dead-lettered: a reader writes
nothing. A listing runs to its end even if its caller goes away (a gateway's request
times out), so the index is never left half updated; listings run one at a time.

:class:`SessionIndex` reads a SQLite or memory log, whose commits land in position
order: a position read past is never filled in later. On SQLite its first listing reads
only a few record types of every session and each one's last record
(:mod:`harness.runtime.session_digest`; a session with a turn in progress, or with a
damaged record among those, is read whole), and none of a session whose stored summary
is of its last record (:mod:`harness.log.sqlite_summaries`), then on from where that
read ended. :class:`KafkaSessionIndex` reads
each partition from where it stopped; the first time from the partition's latest
checkpoint (``<prefix>.snapshots``: the live sessions' records and the ids and first
positions of the ended ones) plus the tail after it. The sessions that ended before the
checkpoint are read too when their records span at most ``HISTORY_BUDGET`` offsets;
beyond that they are listed by id only (``partial``) until a new record of theirs comes,
unless ``history=True``, which reads every partition from its start. A read_committed
read stops at the partition's last stable offset, so nothing below where it stopped is
decided later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from harness.errors import CorruptRecord
from harness.log.base import SessionLog
from harness.records import LogEntry
from harness.replay import SessionState, fold
from harness.runtime.session_digest import SUMMARY_TYPES, digest
from harness.views import SessionSummary, Usage, summarize

__all__ = ["HISTORY_BUDGET", "KafkaSessionIndex", "SessionIndex", "split_readable"]

CHUNK = 5000
"""Records per read while catching up (SQLite / memory)."""

BUSY_KEPT = 2000
"""Sessions kept folded whole while catching up before the quiet ones among them are
summarized, chunk by chunk (SQLite / memory). A first listing of a big log touches every
session: folded all at once and summarized only at the end, 14,600 sessions (211,000
records) peaked at ~126 MB of states for ~9 MB of summaries (a soak's gateway start:
~8.6 KB a session, so a million sessions would not start in a pod; now ~71 MB of RSS against
176 MB for that listing, in 6.4 s against 5.3 s). A session summarized
and touched again in a later chunk is read whole once more (by its id)."""

HISTORY_BUDGET = 50_000
"""On Kafka, the ended sessions of a checkpoint are read when their records span at most
this many offsets of the partition (a quick listing stays quick on a long history)."""

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
        self._now = 0  # the time of the listing under way
        self.unreadable = 0
        """Records skipped so far because they could not be decoded."""
        self._damaged: dict[str, set[int | None]] = {}  # session -> positions of its unreadable records

    async def summaries(self, *, now_ms: int | None = None) -> list[SessionSummary]:
        """One summary per session (no particular order), as of ``now_ms`` (default: now)."""
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        # Its own task: a caller that goes away leaves it to finish (never half folded).
        listing = asyncio.ensure_future(self._listing(now))
        listing.add_done_callback(_retrieved)
        return await asyncio.shield(listing)

    async def _listing(self, now: int) -> list[SessionSummary]:
        async with self._lock:  # one catch-up at a time; the next one reads only what came since
            before = self.unreadable
            self._now = now
            touched = await self._catch_up()
            if self.unreadable > before:
                log_.warning("%d records could not be decoded and were left out", self.unreadable - before)
            for sid in touched:
                self._settle(sid, now)
            busy = [summarize(state, now_ms=now, last_activity_ms=ts, unreadable=self._unreadable_of(sid))
                    for sid, (state, ts) in self._busy.items()]
            return [*self._quiet.values(), *busy]

    async def _catch_up(self) -> set[str]:
        """Fold every record appended since the last call; the sessions it touched."""
        if self._position == 0 and hasattr(self._log, "scan_listing"):
            return await self._first_listing()
        touched: set[str] = set()
        while True:
            items = await self._log.scan(None, after=self._position, limit=CHUNK)
            if not items:
                return touched
            await self._fold_all(items, touched)
            for item in items:
                self._position = max(self._position, item.seq or self._position)
            if len(self._busy) > BUSY_KEPT:  # (module doc of BUSY_KEPT: a bounded peak)
                for sid in touched:
                    self._settle(sid, self._now)

    async def _first_listing(self) -> set[str]:
        """SQLite's first listing: the quiet sessions from a few record types of theirs
        (:mod:`harness.runtime.session_digest`), the others read whole, one by one."""
        read = await self._log.scan_listing(SUMMARY_TYPES)
        self._quiet.update(read.stored)  # (quiet as of their last record, no clock in them; words shared)
        found = digest(read.entries, read.lasts, now_ms=self._now)
        self.unreadable += found.unreadable + read.damaged
        for sid, summary in found.summaries.items():
            self._quiet[sid] = _compact(summary)
        touched: set[str] = set()
        for sid in sorted(found.whole):
            whole = self._readable(await self._log.scan(sid))
            if whole:  # (none: a session id garbled on disk, its records are under the real one)
                self._take(sid, whole)
                self._settle(sid, self._now)  # one with no turn in progress keeps only its summary
                touched.add(sid)
        self._position = read.end
        return touched

    async def _fold_all(self, items: Iterable[Any], touched: set[str]) -> None:
        for item in items:
            if isinstance(item, CorruptRecord):
                self.unreadable += 1
                self._note_damaged(item)
            else:
                await self._fold(item)
                touched.add(item.session_id)

    async def _fold(self, entry: LogEntry) -> None:
        sid = entry.session_id
        known = self._busy.get(sid)
        if known is None:
            entries: list[LogEntry] = [entry]
            if sid in self._quiet:  # quiet until now: read it whole
                entries = self._readable(await self._log.scan(sid))
                del self._quiet[sid]
            self._take(sid, entries or [entry])
            return
        state, ts = known
        state.apply(entry.seq, entry.record)  # (already folded by a whole read: ignored)
        state.mark_read(entry.seq)
        self._busy[sid] = (state, max(ts, entry.record.ts))

    def _take(self, sid: str, entries: list[LogEntry]) -> None:
        """A session folded from (all) its records."""
        self._busy[sid] = (fold(sid, entries), max(e.record.ts for e in entries))

    def _readable(self, items: Iterable[Any]) -> list[LogEntry]:
        items = list(items)
        good, unreadable = split_readable(items)
        if unreadable:
            self.unreadable += unreadable
            for item in items:
                if isinstance(item, CorruptRecord):
                    self._note_damaged(item)
        return good

    def _note_damaged(self, item: CorruptRecord) -> None:
        """A session's unreadable record: its summary says ``unreadable`` (a record that names
        no session cannot be told apart: counted in ``unreadable`` only)."""
        if item.session_id is not None:
            self._damaged.setdefault(item.session_id, set()).add(item.seq)
            quiet = self._quiet.get(item.session_id)
            if quiet is not None and quiet.state != "unreadable":  # summarized before: no longer true
                self._quiet[item.session_id] = dataclasses.replace(
                    quiet, state="unreadable", sleeping_until=None, open_asks=()
                )

    def _unreadable_of(self, sid: str) -> int:
        return len(self._damaged.get(sid, ()))

    def _settle(self, sid: str, now_ms: int) -> None:
        """A session with no turn in progress keeps only its summary."""
        known = self._busy.get(sid)
        if known is None:
            return
        state, ts = known
        if state.active_turn is None:
            self._quiet[sid] = _compact(
                summarize(state, now_ms=now_ms, last_activity_ms=ts, unreadable=self._unreadable_of(sid))
            )
            del self._busy[sid]


class KafkaSessionIndex(SessionIndex):
    """The sessions of a Kafka log, each partition read on from where it stopped.

    Args:
        log: a ``KafkaLog`` (a client: ``create_topics=False`` is enough); read-only.
        history: read every partition from its start the first time, not from its
            latest checkpoint: sessions that ended long ago get full summaries too.
    """

    def __init__(self, log: SessionLog, *, history: bool = False) -> None:
        super().__init__(log)
        self._history = history
        self._positions: dict[int, int] = {}  # partition -> the offset to read on from

    async def _catch_up(self) -> set[str]:
        await self._log.start()  # learns the partition count; a client log checks the topic exists
        partitions = range(self._log.settings.partitions)
        reads = await asyncio.gather(*(self._read_partition(p) for p in partitions))
        touched: set[str] = set()
        for partition, (known, by_id_only, items, position) in zip(partitions, reads, strict=True):
            for sid, entries in known.items():
                self._take(sid, entries)
                touched.add(sid)
            for sid in by_id_only:
                if sid not in self._busy:
                    self._quiet[sid] = SessionSummary(session_id=sid, harness=None, state="idle", partial=True)
            await self._fold_all(items, touched)
            self._positions[partition] = position
        return touched

    async def _read_partition(
        self, partition: int
    ) -> tuple[dict[str, list[LogEntry]], set[str], list[Any], int]:
        """``(sessions read whole, sessions known by id only, new records to fold, the
        offset read up to)``: the first time from the checkpoint, then what came since."""
        start = self._positions.get(partition)
        if start is not None:
            items = await self._log.scan_partition(partition, start)
            return {}, set(), items, _after(items, start)
        return await self._first_read(partition)

    async def _first_read(
        self, partition: int
    ) -> tuple[dict[str, list[LogEntry]], set[str], list[Any], int]:
        log = self._log
        checkpoint = None if self._history else await log.snapshots.read(partition, create=False)
        start = 0
        known: dict[str, list[LogEntry]] = defaultdict(list)
        ended: dict[str, int] = {}
        if checkpoint is not None:
            start = checkpoint.covers
            for sid, entries in checkpoint.sessions.items():
                known[sid].extend(entries)
            ended = {sid: first for sid, first in checkpoint.ended.items() if sid not in checkpoint.sessions}
        tail = await log.scan_partition(partition, start)
        position = _after(tail, start)
        came_back: set[str] = set()
        for entry in self._readable(tail):
            if entry.session_id in ended:
                came_back.add(entry.session_id)
            else:
                known[entry.session_id].append(entry)
        for sid in came_back:  # ended before the checkpoint, active again: read it whole
            known[sid] = self._readable(await log.scan(sid))
            del ended[sid]
        if ended and checkpoint is not None:
            first = min(ended.values())  # a seq: the offset + 1
            if checkpoint.covers - first < HISTORY_BUDGET:
                for entry in self._readable(await log.scan_partition(partition, max(first - 1, 0), checkpoint.covers)):
                    if entry.session_id in ended:
                        known[entry.session_id].append(entry)
                for sid in [s for s in ended if s in known]:
                    del ended[sid]
        return {sid: entries for sid, entries in known.items() if entries}, set(ended), [], position


_NO_USAGE = Usage()


def _shared(word: str | None) -> str | None:
    return None if word is None else sys.intern(word)


def _compact(summary: SessionSummary) -> SessionSummary:
    """The summary with its repeated words and an empty usage shared with every other one
    (each decoded record brings its own copies)."""
    return dataclasses.replace(
        summary,
        harness=_shared(summary.harness),
        last_outcome=_shared(summary.last_outcome),
        last_code=_shared(summary.last_code),
        usage=_NO_USAGE if summary.usage == _NO_USAGE else summary.usage,
    )


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Mark the outcome of a listing seen: its caller may have gone (it failed for it)."""
    if not task.cancelled():
        task.exception()


def split_readable(items: Iterable[Any]) -> tuple[list[LogEntry], int]:
    """``(the readable records, how many could not be decoded)`` of a read-only read."""
    good: list[LogEntry] = []
    unreadable = 0
    for item in items:
        if isinstance(item, CorruptRecord):
            unreadable += 1
        else:
            good.append(item)
    return good, unreadable


def _after(items: list[Any], start: int) -> int:
    """The offset after the last record read (a seq is its offset + 1), else ``start``."""
    seqs = [int(item.seq) for item in items if item.seq is not None]
    return max(start, *seqs) if seqs else start
