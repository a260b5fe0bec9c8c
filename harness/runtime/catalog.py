"""Every session of a log at a glance, and one session's records, read-only.

:func:`list_sessions` works on any log and never writes, claims or fences: it folds
every session once (:mod:`harness.runtime.session_index`; a long-running reader keeps a
``SessionIndex`` / ``KafkaSessionIndex``, whose next listing reads only what was
appended since). On Kafka a partition is read from its latest checkpoint plus the tail
after it; ``history=True`` reads every partition from its start.

Records that cannot be decoded are skipped (and logged), never dead-lettered: a
reader writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from harness.log.base import SessionLog
from harness.records import LogEntry
from harness.runtime.session_index import KafkaSessionIndex, SessionIndex, split_readable
from harness.views import SessionSummary

__all__ = [
    "KafkaSessionIndex",
    "SessionIndex",
    "follow_session",
    "list_sessions",
    "read_session",
    "scan_session",
    "sort_summaries",
]

POLL_S = 0.1
"""How often ``follow_session`` reads a log that cannot be tailed (SQLite)."""

log_ = logging.getLogger("harness.catalog")


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
    index = KafkaSessionIndex(log, history=history) if hasattr(log, "scan_partition") else SessionIndex(log)
    return sort_summaries(await index.summaries(now_ms=now_ms))


def sort_summaries(summaries: list[SessionSummary]) -> list[SessionSummary]:
    """Most recent activity first (then by id); sessions known by id only last."""
    summaries.sort(key=lambda s: (s.last_activity is None, -(s.last_activity or 0), s.session_id))
    return summaries


async def scan_session(
    log: SessionLog, session_id: str, *, after: int | None = None
) -> tuple[list[LogEntry], int]:
    """A session's committed records (those with seq > ``after``; all if None), read-only:
    (entries, how many were unreadable)."""
    scan = getattr(log, "scan", None)
    if scan is None:
        return list(await log.read(session_id, after=after)), 0
    return split_readable(await scan(session_id, after=after))


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
    good, unreadable = split_readable(items)
    return good, unreadable, position
