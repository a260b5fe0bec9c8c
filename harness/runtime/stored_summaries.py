"""A SQLite worker's stored summaries: quiet sessions' summaries written into the file,
so that a listing need not read their records (:mod:`harness.log.sqlite_summaries`).

In the sweep after each checkpoint it writes (sessions went quiet since the last one),
and in each sweep while some are left (a file made before stored summaries: every
session), never before the worker is ready, the worker takes up to ``BATCH`` sessions whose stored summary is missing or stale, the
most recently changed first, its live ones left out; reads them as a listing reads them
(the records of ``SUMMARY_TYPES`` and the last record, checked, from one snapshot, on the
log's reader thread); summarizes them with the listing's own code
(:func:`~harness.runtime.session_digest.digest`); and writes the summaries of the quiet
ones, on a connection and in a transaction of their own (never with a step's commit). A
session that cannot be summarized so (a turn in progress, a record that does not
check) is left out until its head moves. Before its first batch it drops the rows that do
not check (a changed byte; the log's ``drop_damaged_summaries``), so they are written
again like missing ones. None of it is needed: a failed write is said at WARNING and
tried again after the next checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from harness.errors import CorruptRecord, LogError
from harness.runtime.session_digest import SUMMARY_TYPES, digest
from harness.views import SessionSummary

__all__ = ["BATCH", "SummaryWriter"]

BATCH = 256
"""Sessions summarized and written at a time (one read and one small write transaction:
~30 ms on a soak's file, so a sweep stays short)."""

SKIPPED_KEPT = 50_000
"""Sessions remembered as not to be summarized (until their head moves); beyond, forgotten."""

log = logging.getLogger("harness.worker")


class SummaryWriter:
    """Writes a log's stored summaries, a batch at a time (the log has ``summary_sources``)."""

    def __init__(self, log_: Any) -> None:
        self._log = log_
        self.more = True  # sessions may be left to summarize (a new worker: not known yet)
        self.written = 0
        self._skip: dict[str, int | None] = {}  # not summarizable: session -> its head then
        self._checked = False  # the damaged rows dropped (once, before the first batch)

    async def batch(self, live: Collection[str]) -> int:
        """Summarize and write one batch, ``live`` (the driven and parked sessions) left
        out; how many rows were written."""
        skip: dict[str, int | None] = {**self._skip, **dict.fromkeys(live)}
        try:
            if not self._checked:
                await self._drop_damaged()
            read, self.more = await self._log.summary_sources(SUMMARY_TYPES, skip, BATCH)
            rows = self._rows(read)
            written = int(await self._log.write_summaries(rows))
        except LogError as exc:
            log.warning("stored summaries not written: %s", exc)
            self.more = False
            return 0
        self.written += written
        return written

    async def _drop_damaged(self) -> None:
        drop = getattr(self._log, "drop_damaged_summaries", None)
        dropped = int(await drop()) if drop is not None else 0
        self._checked = True
        if dropped:
            log.warning(
                "stored summaries: %d row(s) did not check (a changed byte in the log file) and were dropped; "
                "they are written again from the sessions' records", dropped,
            )

    def _rows(self, read: Any) -> list[tuple[str, int, SessionSummary]]:
        found = digest(read.entries, read.lasts, now_ms=0)  # (a quiet session's summary reads no clock)
        rows: list[tuple[str, int, SessionSummary]] = []
        for sid, last in read.lasts.items():
            summary = found.summaries.get(sid)
            if summary is not None and not isinstance(last, CorruptRecord) and _quiet(summary):
                rows.append((sid, last.seq, summary))
                continue
            if len(self._skip) >= SKIPPED_KEPT:
                self._skip.clear()
            self._skip[sid] = last.seq
        return rows


def _quiet(summary: SessionSummary) -> bool:
    return (
        summary.active_input is None
        and summary.sleeping_until is None
        and not summary.open_asks
        and not summary.partial
    )
