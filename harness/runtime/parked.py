"""A partition's PARKED sessions: their log has an unreadable record (a changed byte, a
body that does not decode), so they are never driven (nobody can know what that record
said: a lost step result would run its charge again), and their inputs' verdicts are
written so that no sender waits for good (``replay.parked_settlements`` decides them).

:class:`ParkedSessions` holds, for the :class:`~harness.runtime.partition.PartitionRuntime`
that owns the partition, the unreadable record of each parked session, the records held
for its inputs, the verdicts written here, and the sessions whose verdicts are not known
to be all written (a checkpoint names them in ``reread``: the next owner reads them whole,
parks them again and writes what is left). A verdict write that fails is tried again with
a backoff on the host's clock (:func:`parked_retry_at`), the session read again from the
log first, so no verdict is written twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta

from harness.errors import CodecError, CorruptRecord, FencedError, HarnessError, LogError, SessionBusy
from harness.records import InputSettled, LogEntry
from harness.replay import UNREADABLE_CODE, fold, parked_settlements
from harness.runtime.core import SessionHost

__all__ = [
    "PARKED_RETRY_FIRST_S",
    "PARKED_RETRY_LOG_S",
    "PARKED_RETRY_MAX_S",
    "ParkedSessions",
    "decodable",
    "parked_retry_at",
]

log = logging.getLogger("harness.worker")

PARKED_RETRY_FIRST_S = 0.5
"""The wait before a parked session's verdicts are tried again after a failed write
(another process holds its lease, a short outage); each failure doubles it ..."""
PARKED_RETRY_MAX_S = 30.0
"""... up to this (and no sooner than the end of a holder's lease)."""
PARKED_RETRY_LOG_S = 300.0
"""A failure like the last one logged is logged again only this long after it."""


class ParkedSessions:
    """The parked sessions of one partition and their verdicts.

    Args:
        host: the partition's host (its log, clock and owner id).
        closing: the owner's handles being closed (a parked session's handle closes
            before its verdicts are written: it writes nothing).
        may_write: whether verdicts may be written now (the owner is live, neither
            stopped nor draining); when not, they wait (``go_live`` starts them).
        is_stopped: whether the owner stopped for good (a retry loop ends then).
    """

    def __init__(
        self,
        host: SessionHost,
        *,
        closing: set[asyncio.Task[None]],
        may_write: Callable[[], bool],
        is_stopped: Callable[[], bool],
    ) -> None:
        self.host = host
        self._closing = closing
        self._may_write = may_write
        self._is_stopped = is_stopped
        self.corrupt: dict[str, CorruptRecord] = {}  # parked session -> its unreadable record
        self._entries: dict[str, list[LogEntry]] = {}  # their records held (for their inputs)
        self._settled: set[tuple[str, int]] = set()  # (session, input position) settled here
        self._settling: dict[str, asyncio.Task[None]] = {}  # a parked session's verdicts being written
        # Parked sessions whose verdicts are not known to be all written: id -> how many
        # times new work was seen for it (a write that saw fewer leaves it pending). A
        # checkpoint names them in ``reread``: its next owner reads them whole.
        self._unsettled: dict[str, int] = {}
        self._partial: set[str] = set()  # parked sessions whose held records may miss some

    def __contains__(self, sid: object) -> bool:
        return sid in self.corrupt

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.corrupt))

    def add(self, sid: str, corrupt: CorruptRecord, entries: list[LogEntry]) -> list[LogEntry] | None:
        """Park ``sid`` with the records held of it; None if it was parked already."""
        if sid in self.corrupt:
            return None
        self.corrupt[sid] = corrupt
        self._entries[sid] = entries
        return entries

    def hold(self, sid: str, entries: Sequence[LogEntry], *, pending: bool = False) -> None:
        """More records of parked ``sid`` (its inputs get verdicts); ``pending``: read while
        rebuilding, its verdicts are written once the owner goes live."""
        self._entries.setdefault(sid, []).extend(entries)
        if pending:
            self._unsettled[sid] = self._unsettled.get(sid, 0) + 1

    def partial(self, sid: str) -> None:
        """The records held of ``sid`` may miss some (a read that parked it did not keep them):
        it is read again, under the lease, before its verdicts are worked out."""
        self._partial.add(sid)

    def reread(self) -> tuple[str, ...]:
        """The parked sessions whose verdicts are not known to be all written."""
        return tuple(sid for sid in self._unsettled if sid in self.corrupt)

    async def stop(self) -> None:
        """Cancel the verdict writes in progress (the next owner writes what is left)."""
        settling, self._settling = list(self._settling.values()), {}
        for task in settling:
            task.cancel()
        await asyncio.gather(*settling, return_exceptions=True)

    def settle_soon(self, sid: str) -> None:
        """Refuse the waiting inputs of parked ``sid`` (in a task; live runtimes only)."""
        self._unsettled[sid] = self._unsettled.get(sid, 0) + 1  # pending until a write shows otherwise
        if not self._may_write():
            return
        running = self._settling.get(sid)
        if running is not None and not running.done():
            running.add_done_callback(lambda _: self.settle_soon(sid))  # new inputs meanwhile
            return
        task = asyncio.ensure_future(self._settle(sid))
        self._settling[sid] = task
        task.add_done_callback(lambda done: self._settling.pop(sid, None) if self._settling.get(sid) is done else None)

    async def _settle(self, sid: str) -> None:
        """Write the verdicts of parked ``sid``'s inputs that have none it can read
        (``parked_settlements``: the running turn's input ``failed``, a finished turn's
        input its turn's verdict again, the others ``rejected``; all but the finished
        turns' with ``session_unreadable``), once each here: nothing of the session runs,
        so its senders are told so.

        A write that fails (another process holds the session's lease for a while, a
        short outage; with leases also ``FencedError``: another process took it) is tried
        again after ``parked_retry_at`` on the host's clock, the session's records read
        again from the log first (another owner's verdicts count: none is written twice),
        until the verdicts land, the runtime stops, or (Kafka: ``FencedError``) the
        partition is lost; meanwhile a checkpoint names the session in ``reread``, so
        its next owner writes them. Said once per kind of failure (and again every
        ``PARKED_RETRY_LOG_S`` while it lasts), and once more when they land."""
        if self._closing:  # its handle, if it was driven, closes first (it writes nothing)
            await asyncio.gather(*list(self._closing), return_exceptions=True)
        failures = 0
        told: tuple[str, float] | None = None  # (what the last failure logged was, when)
        first_failed = 0.0
        while True:
            corrupt = self.corrupt.get(sid)
            if corrupt is None or self._is_stopped():
                return
            seen = self._unsettled.get(sid, 0)
            error: LogError | HarnessError | None = None
            reread = sid in self._partial or failures > 0
            todo = self._todo(sid, corrupt)
            try:
                if todo or reread:
                    writer = await self.host.log.claim(sid, owner=self.host.owner_id, lease=timedelta(seconds=5))
                    try:
                        if reread:  # as the log has it now, read under the lease: none written twice
                            await self._reread(sid)
                            todo = self._todo(sid, corrupt)
                        if todo:
                            await writer.append([r for _, r in todo])
                    finally:
                        with contextlib.suppress(LogError):
                            await writer.release()
            except FencedError as exc:
                if not getattr(self.host.log, "has_leases", False):
                    log.warning("the verdicts of parked session %s were not written: this worker lost its "
                                "partition (%s); its next owner writes them", sid, exc)
                    return  # Kafka: the partition was lost; its revocation stops the rest
                error = exc  # with leases: another process took the session over for a while
            except (LogError, HarnessError) as exc:
                error = exc
            if error is None:
                break
            failures += 1
            now = self.host.clock.now()
            if failures == 1:
                first_failed = now
            when = parked_retry_at(failures, now, getattr(error, "lease_until", None))
            what = _failure_kind(error)
            if told is None or told[0] != what or now - told[1] >= PARKED_RETRY_LOG_S:
                told = (what, now)
                log.warning(
                    "the verdicts of parked session %s's inputs could not be written (%s: %s); %s: trying again "
                    "in %.1f s, then with a backoff up to %g s, until they land or this worker gives the "
                    "partition up (said again if the failure changes, or every %g s)",
                    sid, type(error).__name__, error,
                    "first failure" if failures == 1 else f"{failures} failures over {now - first_failed:.0f} s",
                    max(0.0, when - now), PARKED_RETRY_MAX_S, PARKED_RETRY_LOG_S,
                )
            await self.host.clock.sleep_until(when)
        if self._unsettled.get(sid) == seen:
            del self._unsettled[sid]  # nothing came meanwhile (else its own run follows)
        if failures:
            log.warning("the verdicts of parked session %s's inputs were written after %d failed attempt(s)",
                        sid, failures)
        self._settled.update((sid, at) for at, _ in todo)
        refused = 0
        for _, r in todo:
            if r.outcome == "rejected" and r.code == UNREADABLE_CODE:
                refused += 1
            elif r.code == UNREADABLE_CODE:
                log.warning("input %s of parked session %s, whose turn was running, settled failed "
                            "(session_unreadable)", r.input_id, sid)
            else:
                log.warning("input %s of parked session %s, whose turn had finished but whose settlement is "
                            "unreadable, settled %s again (its turn's verdict)", r.input_id, sid, r.outcome)
        if refused:
            log.warning("refused %d input(s) of parked session %s (session_unreadable)", refused, sid)

    def _todo(self, sid: str, corrupt: CorruptRecord) -> list[tuple[int, InputSettled]]:
        """The verdicts parked ``sid`` still needs (of its held records), none written here before."""
        state = fold(sid, [e for e in self._entries.get(sid, ()) if decodable(e)])
        fix = (
            "repair or remove that record and restart the worker, or continue in a new session"
            if getattr(self.host.log, "has_leases", False)
            else "continue in a new session (one Kafka record cannot be removed)"
        )
        reason = (
            f"session {sid!r} is not driven: its log has an unreadable record at position {corrupt.seq}; "
            f"{fix} (runbook: HarnessDeadLetters)"
        )
        now = int(self.host.clock.now() * 1000)
        return [(at, r) for at, r in parked_settlements(state, now, reason) if (sid, at) not in self._settled]

    async def _reread(self, sid: str) -> None:
        """Hold parked ``sid``'s records as the log has them now (past its unreadable ones):
        what another owner wrote meanwhile, and what a read that parked it did not keep."""
        scan = getattr(self.host.log, "scan", None)
        if scan is None:  # (every log of this package has it)
            return
        items = await scan(sid)
        read = [item for item in items if isinstance(item, LogEntry)]
        last = max((e.seq for e in read), default=0)
        held = self._entries.get(sid, [])
        self._entries[sid] = read + [e for e in held if e.seq > last]  # (routed here since the read)
        self._partial.discard(sid)


def parked_retry_at(failures: int, now: float, lease_until: float | None = None) -> float:
    """When to try a parked session's verdicts again after its ``failures``-th failed
    write at ``now`` (pure): ``PARKED_RETRY_FIRST_S`` doubled at each failure, at most
    ``PARKED_RETRY_MAX_S``; not before the holder's lease ends (``lease_until``, from
    ``SessionBusy``) if that is sooner than the cap."""
    wait = min(PARKED_RETRY_FIRST_S * float(1 << max(0, min(failures - 1, 16))), PARKED_RETRY_MAX_S)
    when = now + wait
    if lease_until is not None:
        when = min(max(when, lease_until + 0.001), now + PARKED_RETRY_MAX_S)
    return when


def _failure_kind(error: BaseException) -> str:
    """What a failed verdict write is, for its log line's throttle (a new holder is news)."""
    if isinstance(error, SessionBusy):
        return f"busy:{error.owner}/{error.holder_pid}"
    return type(error).__name__


def decodable(entry: LogEntry) -> bool:
    """Whether a (lazily read) entry's record decodes."""
    try:
        entry.record  # noqa: B018 - decodes a lazily read entry
    except CodecError:
        return False
    return True
