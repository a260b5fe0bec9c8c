"""Every session of a log at a glance, read-only.

:func:`list_sessions` works on any log and never writes, claims or fences:

* SQLite / memory: the whole log is read (in chunks) and each session folded, by a
  :class:`~harness.runtime.session_index.SessionIndex` (a long-running reader keeps one:
  its next listing reads only what was appended since).
* Kafka: per partition (side by side), the latest checkpoint (``<prefix>.snapshots``:
  the live sessions' records and the ids and first positions of the ended ones) plus
  the tail after it. The sessions that ended before the checkpoint are read too when
  their records span at most ``HISTORY_BUDGET`` offsets; beyond that they are listed
  by id only (``partial``) unless ``history=True``, which reads every partition from
  its start. A session that ended before the checkpoint and came back in the tail is
  read whole.

Records that cannot be decoded are skipped (and logged), never dead-lettered: a
reader writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from harness.errors import CorruptRecord
from harness.log.base import SessionLog
from harness.records import LogEntry
from harness.replay import fold
from harness.runtime.session_index import SessionIndex
from harness.views import SessionSummary, summarize

__all__ = ["SessionIndex", "follow_session", "list_sessions", "read_session", "scan_session", "sort_summaries"]

POLL_S = 0.1
"""How often ``follow_session`` reads a log that cannot be tailed (SQLite)."""

log_ = logging.getLogger("harness.catalog")

HISTORY_BUDGET = 50_000
"""On Kafka, the ended sessions of a checkpoint are read when their records span at most
this many offsets of the partition (a quick listing stays quick on a long history)."""


@dataclass(slots=True)
class _Skipped:
    unreadable: int = 0


def _summaries(by_session: dict[str, list[LogEntry]], now_ms: int) -> list[SessionSummary]:
    out = []
    for sid, entries in by_session.items():
        if not entries:
            continue
        state = fold(sid, entries)
        out.append(summarize(state, now_ms=now_ms, last_activity_ms=max(e.record.ts for e in entries)))
    return out


def _keep(items: Iterable[Any], catalog: _Skipped) -> list[LogEntry]:
    good = []
    for item in items:
        if isinstance(item, CorruptRecord):
            catalog.unreadable += 1
        else:
            good.append(item)
    return good


async def list_sessions(
    log: SessionLog, *, now_ms: int | None = None, history: bool = False
) -> list[SessionSummary]:
    """One :class:`SessionSummary` per session of ``log``, most recent activity first.

    Args:
        log: any session log (``open_log(url)``); on Kafka open it as a client
            (``create_topics=False``), the topics must exist.
        now_ms: the time to judge sleeps by (default: now).
        history: on Kafka, read every partition from its start instead of its latest
            checkpoint, so sessions that ended long ago get full summaries too.
    """
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    if not hasattr(log, "scan_partition"):
        return sort_summaries(await SessionIndex(log).summaries(now_ms=now))
    catalog = _Skipped()
    by_session = await _kafka_sessions(log, catalog, history=history)
    summaries = _summaries({s: e for s, e in by_session.items() if e is not None}, now)
    summaries.extend(
        SessionSummary(session_id=sid, harness=None, state="idle", partial=True)
        for sid, entries in by_session.items()
        if entries is None
    )
    if catalog.unreadable:
        log_.warning("%d records could not be decoded and were left out", catalog.unreadable)
    return sort_summaries(summaries)


def sort_summaries(summaries: list[SessionSummary]) -> list[SessionSummary]:
    """Most recent activity first (then by id); sessions known by id only last."""
    summaries.sort(key=lambda s: (s.last_activity is None, -(s.last_activity or 0), s.session_id))
    return summaries


async def _kafka_sessions(log: Any, catalog: _Skipped, *, history: bool) -> dict[str, list[LogEntry] | None]:
    await log.start()  # learns the partition count; a client log checks the topic exists
    parts = await asyncio.gather(
        *(_kafka_partition(log, p, catalog, history=history) for p in range(log.settings.partitions))
    )
    by_session: dict[str, list[LogEntry] | None] = {}
    for part in parts:
        by_session.update(part)
    return by_session


async def _kafka_partition(
    log: Any, partition: int, catalog: _Skipped, *, history: bool
) -> dict[str, list[LogEntry] | None]:
    checkpoint = None if history else await log.snapshots.read(partition, create=False)
    start = 0
    known: dict[str, list[LogEntry]] = defaultdict(list)
    ended: dict[str, int] = {}
    if checkpoint is not None:
        start = checkpoint.covers
        for sid, entries in checkpoint.sessions.items():
            known[sid].extend(entries)
        ended = {sid: first for sid, first in checkpoint.ended.items() if sid not in checkpoint.sessions}
    tail = _keep(await log.scan_partition(partition, start), catalog)
    came_back: set[str] = set()
    for entry in tail:
        if entry.session_id in ended:
            came_back.add(entry.session_id)
        else:
            known[entry.session_id].append(entry)
    for sid in came_back:  # ended before the checkpoint, active again: read it whole
        known[sid] = _keep(await log.scan(sid), catalog)
        del ended[sid]
    if ended and checkpoint is not None:
        first = min(ended.values())  # a seq: the offset + 1
        if checkpoint.covers - first < HISTORY_BUDGET:
            for entry in _keep(await log.scan_partition(partition, max(first - 1, 0), checkpoint.covers), catalog):
                if entry.session_id in ended:
                    known[entry.session_id].append(entry)
            for sid in [s for s in ended if s in known]:
                del ended[sid]
    out: dict[str, list[LogEntry] | None] = dict(known)
    out.update((sid, None) for sid in ended)
    return out


async def scan_session(
    log: SessionLog, session_id: str, *, after: int | None = None
) -> tuple[list[LogEntry], int]:
    """A session's committed records (those with seq > ``after``; all if None), read-only:
    (entries, how many were unreadable)."""
    scan = getattr(log, "scan", None)
    if scan is None:
        return list(await log.read(session_id, after=after)), 0
    skipped = _Skipped()
    return _keep(await scan(session_id, after=after), skipped), skipped.unreadable


async def read_session(log: SessionLog, session_id: str, *, after: int | None = None) -> list[LogEntry]:
    """A session's readable records (see :func:`scan_session`)."""
    entries, _ = await scan_session(log, session_id, after=after)
    return entries


async def follow_session(log: SessionLog, session_id: str, *, after: int = 0) -> AsyncIterator[LogEntry]:
    """The session's committed records after position ``after``, live, until the caller
    stops. Read-only: an unreadable record is skipped (logged), never dead-lettered.

    On Kafka one tailing consumer of the session's partition; elsewhere the log is
    read every ``POLL_S``.
    """
    tail = getattr(log, "tail_partition", None)
    if tail is not None:
        await log.start()  # type: ignore[attr-defined]
        partition = log.partition_for(session_id)  # type: ignore[attr-defined]
        async for entry in tail(partition, after, dead_letter=False):
            if entry.session_id == session_id:
                yield entry
        return
    position = after
    while True:
        entries, unreadable, position = await _scan_after(log, session_id, position)
        if unreadable:
            log_.warning("%d records of session %s could not be decoded and were skipped", unreadable, session_id)
        for entry in entries:
            yield entry
        if not entries:
            await asyncio.sleep(POLL_S)


async def _scan_after(log: Any, session_id: str, after: int) -> tuple[list[LogEntry], int, int]:
    """(readable entries, unreadable count, the position read up to) after ``after``."""
    scan = getattr(log, "scan", None)
    items = await (scan(session_id, after=after) if scan is not None else log.read(session_id, after=after))
    position = max([after, *(item.seq or 0 for item in items)])
    skipped = _Skipped()
    return _keep(items, skipped), skipped.unreadable, position
