"""The sessions of one partition of the log, driven by the partition's owner.

A worker makes one ``PartitionRuntime`` per partition it owns (on SQLite: one
for the whole file). First the partition's history is folded (``load_checkpoint``
then ``rebuild``; nothing is driven while history is read), then ``go_live``
drives every session with work left, then ``ingest`` routes each new committed
record to its session, creating sessions as their first inputs arrive. A hand-over
calls ``drain`` (nothing new starts; what runs reaches its next durable boundary,
bounded) then ``stop``, which cancels every session the recoverable way: nothing more is
written, the next owner carries on (docs/architecture.md, "Hand-over drain").

A session whose log has an unreadable record (a changed byte, a body that does not
decode) is PARKED: it is never driven, since nobody can know what that record said
(a lost step result would run its charge again). The worker says so at ERROR, reports
the record on its dead-letter path, and keeps driving the others. Every input of a
parked session that no turn took yet (and every one that comes later) is settled
``rejected`` / ``session_unreadable`` with where the record is, so its sender gets an
answer instead of waiting for good; the input of the turn that was running, if any, is
settled ``failed`` / ``session_unreadable`` the same way. An operator repairs the record
(SQLite) and restarts the worker, or continues in a new session (Kafka). Driven again
after a repair, the session's left-over turn is closed (its input has its verdict:
``CloseSettledTurn``, nothing more of it runs) and its later inputs go on. The parked
sessions and their verdicts (written, tried again, named in checkpoints) are
:mod:`harness.runtime.parked`'s.

A session whose secrets cannot be had (the worker's ``secrets_for`` hook raised, or
returned something that is not a mapping of names to text) is HELD: not driven, nothing
written, said once at WARNING (types and the hook's error, never a value); each sweep
asks the hook again and the session goes on once it answers. The others go on meanwhile.

Bounded memory and rebuild: ended sessions are forgotten but for their ids and
first positions (a new input for one reads its history back from there, and a
new session never needs a read); the last ``RECENT_ENDED`` ended sessions keep
their records, so a chat's next message needs no read either. Live sessions
keep their records, which is what a ``Checkpoint`` holds.
A checkpoint covers every record up to ``covers``: a new owner starts from the
latest one and reads only the tail after it. A parked session is in a checkpoint as ended
(``ended``, no records): a new owner reads it whole when a record of it comes, meets the
unreadable record again and parks it; while its verdicts are not all written it is in
``reread`` too, and a new owner reads it whole before going live (a failed verdict write
is tried again with a backoff: ``harness.runtime.parked``). Checkpoints are an optimisation
only: without one the same state comes from reading the whole partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from harness.definition import Harness
from harness.errors import (
    CodecError,
    CorruptRecord,
    DefinitionError,
    FencedError,
    HarnessError,
    LogError,
    SessionBusy,
)
from harness.gcpause import collector_paused
from harness.log.base import Checkpoint, CheckpointWritten
from harness.logs import SECRETS, lease_wait_message
from harness.observability import metrics
from harness.records import InputMessage, InputSettled, LogEntry
from harness.replay import (
    CONTROL_TYPES,
    SessionState,
    control_fields,
    ended_from_control,
    fold,
)
from harness.runtime.core import SessionCore, SessionHost
from harness.runtime.gate import Active, SessionGate
from harness.runtime.parked import ParkedSessions
from harness.secrets import secret_values, secrets_for_result
from harness.views import classify

__all__ = [
    "CHECKPOINT_EVERY_RECORDS",
    "CHECKPOINT_EVERY_S",
    "Checkpoint",
    "PartitionRuntime",
    "SecretsFor",
    "drain_all",
]

log = logging.getLogger("harness.worker")

RECENT_ENDED = 1000
"""Ended sessions whose records stay in memory (LRU): a returning chat needs no read."""
CHECKPOINT_EVERY_RECORDS = 2000
"""A partition checkpoint is written once this many records were folded since the last
(by a Kafka worker for each partition it owns, by a SQLite worker for its file)."""
CHECKPOINT_EVERY_S = 30.0
"""... or this long after the last one, if anything was folded since."""
DRAIN_CHECK_S = 0.02
"""How often a drain looks whether its sessions reached a boundary."""
SecretsFor = Callable[[str, str], Mapping[str, Any] | None]
"""(session id, harness name) -> the session's secrets: names to str or ``SecretStr`` values."""


class PartitionRuntime:
    def __init__(
        self,
        *,
        host: SessionHost,
        harnesses: Mapping[str, Harness],
        partition: int | None = None,
        secrets_for: SecretsFor | None = None,
        gate: SessionGate | None = None,
    ) -> None:
        self.host = host
        self.partition = partition
        self._harnesses = dict(harnesses)
        self._secrets_for = secrets_for
        self._gate = gate if gate is not None else SessionGate(None)
        self._lease_told: dict[str, str | None] = {}  # sessions whose lease wait was logged: holder
        self._entries: dict[str, list[LogEntry]] = {}  # records of sessions not known to be ended
        # Sessions that ended at some point: id -> position of their first record (which
        # never changes; a session that came back stays here, its records in _entries).
        self._ended: dict[str, int] = {}
        # What of _ended the partition's checkpoints hold: sealed directory parts, and the
        # entries in none yet (None until a checkpoint is loaded or made: no journal kept).
        self._directory: tuple[tuple[str, int], ...] = ()
        self._unsealed: list[tuple[str, int]] | None = None
        self._recent: OrderedDict[str, list[LogEntry]] = OrderedDict()  # records of recently ended ones
        # Ended sessions that got records while rebuilding: those records (read whole later).
        self._needs_history: dict[str, list[LogEntry]] = {}
        self._sessions: dict[str, SessionCore] = {}  # live, driven
        self._rejected: set[str] = set()  # input ids this owner already rejected
        self._retry: set[str] = set()  # sessions to restart at the next sweep
        self._held: dict[str, str] = {}  # sessions whose secrets_for failed: why (as logged)
        self._closing: set[asyncio.Task[None]] = set()
        self._parked = ParkedSessions(  # sessions with an unreadable record: never driven
            host,
            closing=self._closing,
            may_write=lambda: self.live and not self.stopped and not self.draining,
            is_stopped=lambda: self.stopped,
        )
        self.live = False
        self.stopped = False  # stop() was called: this runtime never drives anything again
        self.draining = False  # drain() was called: nothing new starts here (stop() follows)
        self.on_corrupt: Callable[[CorruptRecord], object] | None = None
        self.position = 0  # every record <= position was folded
        self.records_since_checkpoint = 0

    # -- history -------------------------------------------------------------------------

    def load_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Start from a checkpoint instead of the beginning of the partition."""
        if self.live or self._entries or self.position:
            raise RuntimeError("load a checkpoint before anything else")
        self._entries = {sid: list(entries) for sid, entries in checkpoint.sessions.items()}
        self._ended = dict(checkpoint.ended)
        self._directory = checkpoint.directory
        self._unsealed = list(checkpoint.ended.items() if checkpoint.unsealed is None else checkpoint.unsealed)
        self.position = checkpoint.covers
        for sid in checkpoint.reread:  # parked, verdicts not all written: read whole (parks it again)
            if sid not in self._entries:
                self._needs_history.setdefault(sid, [])

    def rebuild(self, entries: Iterable[LogEntry]) -> None:
        """Fold history (no driving yet)."""
        for entry in entries:
            if entry.seq <= self.position:
                continue
            sid = entry.session_id
            if sid in self._parked:
                self._parked.hold(sid, [entry], pending=True)  # (settled at go_live)
                self.position = entry.seq
                continue
            known = self._entries.get(sid)
            if known is not None:
                known.append(entry)
            elif sid in self._ended:
                self._needs_history.setdefault(sid, []).append(entry)  # it came back: read it whole later
            else:
                self._entries[sid] = [entry]
            self.position = entry.seq
            self.records_since_checkpoint += 1

    async def forget_ended(self) -> dict[str, SessionState]:
        """Fold every known session; keep the ids of the ended ones; return the live states."""
        for sid, tail in list(self._needs_history.items()):
            try:
                self._entries[sid] = await self._history(sid)
            except CorruptRecord:  # parked (a parked session is in a checkpoint as ended)
                self._parked.hold(sid, tail)  # its inputs are refused
        self._needs_history.clear()
        live: dict[str, SessionState] = {}
        for sid, entries in list(self._entries.items()):
            if sid in self._parked:
                continue
            # First the few records that decide it, read as plain fields (with lazily
            # read entries nothing else of an ended session is decoded), then the
            # whole fold of a live one.
            if self._ended_by_control(sid, entries):
                self._remember_ended(sid, self._entries.pop(sid))
                continue
            state = self._fold(sid, entries)
            if sid in self._parked:
                continue
            if state.ended:
                self._remember_ended(sid, self._entries.pop(sid))
            else:
                live[sid] = state
        return live

    def _ended_by_control(self, sid: str, entries: list[LogEntry]) -> bool:
        try:
            return ended_from_control(
                (e.seq, e.record_type, _fields(e)) for e in entries if e.record_type in CONTROL_TYPES
            )
        except CodecError:
            return False  # the whole fold decides, and reports what it cannot read

    def _fold(self, sid: str, entries: list[LogEntry]) -> SessionState:
        """``fold``; a record whose body cannot be decoded parks the session (reported)."""
        try:
            return fold(sid, entries)
        except CodecError:
            pass
        good: list[LogEntry] = []
        for entry in entries:
            try:
                entry.record  # noqa: B018 - decodes a lazily read entry
            except CodecError as exc:
                self.report_corrupt(
                    CorruptRecord(str(exc), session_id=sid, seq=entry.seq, raw=exc.raw, partition=self.partition)
                )
                continue
            good.append(entry)
        if len(good) < len(entries):
            kept = self._entries.get(sid)
            if kept is entries:
                entries[:] = good
        return fold(sid, good)

    def report_corrupt(self, corrupt: CorruptRecord) -> None:
        """An unreadable record: its session is parked (a worker also copies the record
        to its dead-letter path)."""
        if self.on_corrupt is not None:
            self.on_corrupt(corrupt)
        if corrupt.session_id is None:
            log.error("an unreadable record of no known session: %s", corrupt)
            return
        self.park(corrupt.session_id, corrupt)

    def park(self, sid: str, corrupt: CorruptRecord) -> None:
        """Never drive ``sid`` again here: its log has an unreadable record."""
        held = self._parked.add(sid, corrupt, self._entries.get(sid) or [])
        if held is None:
            return  # (parked already)
        if sid not in self._ended:
            # So a checkpoint names it: a new owner that starts from one takes it for ended,
            # reads it whole when a record of it comes, finds the record again and parks it.
            # (Left out, its later records would read as a new session's first ones.)
            self._remember_ended(sid, held)
        log.error(
            "session %s is parked, not driven: its log has an unreadable record at position %s "
            "(%s); on Kafka it stays parked (one record cannot be removed: continue in a new session), "
            "on SQLite repair or remove that record, then restart the worker (runbook: HarnessDeadLetters)",
            sid, corrupt.seq, corrupt,
        )
        session = self._sessions.pop(sid, None)
        if session is not None:  # stop it the recoverable way: nothing is written
            task = asyncio.ensure_future(session.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        self._entries.pop(sid, None)
        self._recent.pop(sid, None)
        self._retry.discard(sid)
        self._held.pop(sid, None)
        self._parked.settle_soon(sid)

    @property
    def parked(self) -> Mapping[str, CorruptRecord]:
        """Sessions not driven because their log has an unreadable record."""
        return self._parked.corrupt

    def _remember_ended(self, sid: str, entries: list[LogEntry]) -> None:
        first = entries[0].seq if entries else 0
        # (0: no record of it held here, so a first position known already stays)
        if (first or sid not in self._ended) and self._ended.get(sid) != first:
            self._ended[sid] = first
            if self._unsealed is not None:
                self._unsealed.append((sid, first))
        self._recent[sid] = entries
        self._recent.move_to_end(sid)
        while len(self._recent) > RECENT_ENDED:
            self._recent.popitem(last=False)

    async def _history(self, sid: str, new: Sequence[LogEntry] = ()) -> list[LogEntry]:
        """All committed records of an ended session that came back (no longer ended then).

        ``new``: its records just routed here, the ones after what was remembered.
        """
        first = self._ended.get(sid, 0)
        recent = self._recent.pop(sid, None)
        if recent is not None:
            return recent + list(new)  # every record between came through here: no read
        return await self._read_session(sid, after=first - 1 if first > 1 else None)

    async def _read_session(self, sid: str, *, after: int | None = None) -> list[LogEntry]:
        """The session's records from the log; an unreadable one parks it (and raises).

        Read with ``scan``, which hands an unreadable record back on every log: Kafka's
        ``read`` skips one (dead-lettered), so a parked session read whole after a
        takeover (``reread``, or a new input for it) was folded without its unreadable
        record and DRIVEN, its logged charge run again. Each one is reported here (on
        Kafka the worker's ``on_corrupt`` dead-letters it)."""
        scan = getattr(self.host.log, "scan", None)
        try:
            if scan is None:  # (every log of this package has it)
                return list(await self.host.log.read(sid, after=after))
            items = await scan(sid, after=after)
            corrupt = [item for item in items if not isinstance(item, LogEntry)]
            for item in corrupt[1:]:
                self.report_corrupt(item)
            if corrupt:
                raise corrupt[0]
            return list(items)
        except CorruptRecord as corrupt:
            self.report_corrupt(corrupt)
            self._parked.partial(sid)  # its records before the unreadable one were not kept
            raise

    async def go_live(self) -> None:
        """Drive every rebuilt session that has work left; remember the ended ones."""
        with collector_paused():
            live = await self.forget_ended()
        for sid, state in live.items():
            await self._start(sid, state)
        self.live = True
        for sid in self._parked:
            self._parked.settle_soon(sid)

    def checkpoint(self) -> Checkpoint:
        """What a new owner needs to start from ``self.position``: the live sessions'
        records, and of the ended ones what the last checkpoint written did not hold
        (``unsealed``); ``ended`` is this runtime's own map, not a copy. A parked session
        is in ``ended``, and in ``reread`` too while its verdicts are not all written."""
        covers = self.position
        if self._unsealed is None:  # the first checkpoint of a runtime that loaded none
            self._unsealed = list(self._ended.items())
        return Checkpoint(
            covers=covers,
            sessions={sid: [e for e in entries if e.seq <= covers] for sid, entries in self._entries.items()},
            ended=self._ended,
            directory=self._directory,
            unsealed=tuple(self._unsealed),
            reread=self._parked.reread(),
        )

    def checkpoint_written(self, written: CheckpointWritten) -> None:
        """The last ``checkpoint()`` is in the log: the next one builds on what it sealed."""
        self._directory = written.directory
        if self._unsealed is not None:
            del self._unsealed[: written.sealed]  # (entries added since are after them)

    # -- live ----------------------------------------------------------------------------

    async def ingest(self, entries: Sequence[LogEntry]) -> None:
        """Route newly committed records to their sessions."""
        if self.stopped:
            return
        if not self.live:
            self.rebuild(entries)
            return
        by_session: dict[str, list[LogEntry]] = defaultdict(list)
        for entry in entries:
            if entry.seq <= self.position:
                continue
            by_session[entry.session_id].append(entry)
            self.position = entry.seq
            self.records_since_checkpoint += 1
        for sid, batch in by_session.items():
            if sid in self._parked:
                self._parked.hold(sid, batch)
                self._parked.settle_soon(sid)
                continue
            known = self._entries.get(sid)
            if known is not None:
                known.extend(batch)
                session = self._sessions.get(sid)
                if session is not None and self._must_queue(sid, session, batch):
                    # An idle session with new work while every slot is taken: it waits
                    # its turn (its handle is closed, writing nothing; it starts again later).
                    del self._sessions[sid]
                    with contextlib.suppress(Exception):
                        await session.close()
                    self._queue(sid)
                elif session is not None:
                    await session.ingest(batch)
                elif any(e.record.IS_INPUT for e in batch) and sid not in self._retry:
                    state = self._fold(sid, known)  # not driven (stopped, rejected): new work
                    if not state.ended:
                        await self._start(sid, state)
                continue
            if sid in self._ended:
                if not any(e.record.IS_INPUT for e in batch):
                    self._recent.pop(sid, None)  # stray records: its next return reads the log
                    continue
                try:
                    history = await self._history(sid, batch)  # an ended session comes back
                except CorruptRecord:  # parked: its new inputs are refused
                    self._parked.hold(sid, batch)
                    self._parked.settle_soon(sid)
                    continue
                self._entries[sid] = history
                state = fold(sid, history)
            else:
                self._entries[sid] = list(batch)  # a new session: its first records
                state = fold(sid, batch)
            if not state.ended:
                await self._start(sid, state)

    async def drain(self, timeout: float, hurry: asyncio.Event | None = None) -> list[str]:
        """Hand-over, before ``stop``: start nothing new (no session, no turn, no model or
        tool call) and give what runs up to ``timeout`` seconds to reach its next durable
        boundary (a ``never`` tool call to its result, a ``safe`` one to the end of its
        running step, a model call to its logged answer; a call in an ask or a sleep is
        stopped at once: its wait resumes at the next owner). Returns the sessions still
        running at the deadline or once ``hurry`` is set (``stop`` cuts them: recovered
        by the next owner as after a crash)."""
        self.draining = True
        for session in self._sessions.values():
            session.drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            busy = [sid for sid, session in self._sessions.items() if not session.drained]
            if not busy or loop.time() >= deadline or (hurry is not None and hurry.is_set()):
                return busy
            await asyncio.sleep(min(DRAIN_CHECK_S, max(0.0, deadline - loop.time())))

    async def stop(self) -> None:
        """Stop every session without writing anything (revocation, shutdown); for good:
        a stopped runtime starts no session again (a new owner makes a new runtime)."""
        self.stopped = True
        self._retry.clear()
        self._held.clear()
        await self._parked.stop()  # a verdict not written yet: the next owner writes it
        sessions, self._sessions = list(self._sessions.values()), {}
        self._gate.drop(self)
        for session in sessions:
            self._gate.release(session.session_id)
        # All at once: each close gives up its lease (on SQLite a write), and closes that
        # wait together share one group commit. One after the other, a worker holding 345
        # sessions parked on asks took 3.8 s to stop, one fsync each (a soak run's).
        await asyncio.gather(*(session.close() for session in sessions), return_exceptions=True)
        self.live = False

    async def sweep(self) -> None:
        """Restart sessions whose handle failed (busy elsewhere, an I/O failure) from the log.

        On Kafka a fenced session means this owner lost the partition: it is dropped and
        the revocation that follows stops the rest. With leases (SQLite) it means another
        process took the session over for a while: it is retried.
        """
        if self.stopped or self.draining:
            return
        for sid, session in list(self._sessions.items()):
            error = session.failed
            if error is None:
                continue
            del self._sessions[sid]
            with contextlib.suppress(Exception):
                await session.close()
            if isinstance(error, FencedError) and not getattr(self.host.log, "has_leases", False):
                continue  # Kafka: the partition was lost; its revocation stops the rest
            if isinstance(error, SessionBusy):
                # SQLite / memory: another process holds the session's lease (it may also
                # release it early): say so once per holder, and keep trying each sweep.
                told = f"{error.owner}/{error.holder_pid}"
                if self._lease_told.get(sid, "") != told:
                    self._lease_told[sid] = told
                    log.info(lease_wait_message(sid, error.owner, error.lease_until, self.host.clock.now(),
                                                holder_pid=error.holder_pid, keep_until=error.keep_until))
            else:
                log.warning(
                    "session %s stopped (%s: %s); restarting it from the log", sid, type(error).__name__, error
                )
            self._retry.add(sid)
        for sid in list(self._held):
            entries = self._entries.get(sid)
            if sid in self._sessions or sid in self._parked or sid in self._retry or entries is None:
                self._held.pop(sid, None)  # driven, parked, read again below, or forgotten
                continue
            state = self._fold(sid, entries)
            if state.ended:
                self._held.pop(sid, None)
            else:
                await self._start(sid, state)
        for sid in list(self._retry):
            self._retry.discard(sid)
            if sid in self._sessions or sid in self._parked:
                continue
            try:
                entries = await self._read_session(sid)
            except CorruptRecord:
                continue  # parked
            except LogError as exc:
                log.warning("cannot read session %s yet: %s", sid, exc)
                self._retry.add(sid)
                continue
            self._entries[sid] = list(entries)
            state = fold(sid, entries)
            if not state.ended:
                await self._start(sid, state)

    def forget_idle(self) -> int:
        """Forget sessions that ended and have no driver running; returns how many."""
        idle = [sid for sid, s in self._sessions.items() if s.state.ended and not s.busy]
        for sid in idle:
            del self._sessions[sid]
            self._lease_told.pop(sid, None)
            self._remember_ended(sid, self._entries.pop(sid, []))
        return len(idle)

    @property
    def sessions(self) -> Mapping[str, SessionCore]:
        return self._sessions

    def not_ended(self) -> set[str]:
        """The sessions not known to be ended (driven, waiting, held) and the parked ones."""
        return {*self._entries, *self._sessions, *self._parked.corrupt}

    # -- sessions ------------------------------------------------------------------------

    def _harness_for(self, state: SessionState) -> Harness | None:
        name = state.harness
        if name is None:
            for inp in state.inputs.values():
                if isinstance(inp.record, InputMessage) and inp.record.harness:
                    name = inp.record.harness
                    break
        if name is not None:
            return self._harnesses.get(name)
        if len(self._harnesses) == 1:
            return next(iter(self._harnesses.values()))
        return None

    async def _start(self, sid: str, state: SessionState) -> None:
        if sid in self._parked or self.stopped or self.draining:
            return
        harness = self._harness_for(state)
        if harness is None:
            await self._reject_all(sid, state)
            return
        if not self._gate.try_take(sid, self._active_check(sid)):
            self._queue(sid)
            return
        if not self._launch(sid, state, harness):
            self._gate.release(sid)

    def _launch(self, sid: str, state: SessionState, harness: Harness) -> bool:
        """Drive ``sid``; False if it is held instead (its secrets cannot be had)."""
        secrets = self._session_secrets(sid, harness)
        if secrets is None:
            return False
        SECRETS.add(secrets)  # log lines never show them
        session = SessionCore(
            host=self.host, harness=harness, session_id=sid, secrets=secrets, state=state, follow=False
        )
        self._sessions[sid] = session
        session.resume()
        return True

    def _session_secrets(self, sid: str, harness: Harness) -> Mapping[str, str] | None:
        """The session's secrets from ``secrets_for``; None when the hook raised or gave
        something else than names to text: the session is held (said once per reason,
        asked again at each sweep), and the partition goes on."""
        if self._secrets_for is None:
            return secret_values(None)
        try:
            secrets = secrets_for_result(self._secrets_for(sid, harness.name))
        except Exception as exc:  # noqa: BLE001 - a user's hook: its failure holds one session, no more
            # (the check's own messages name types, never a value; the hook's own error is
            # the operator's best clue, its text scrubbed of known secrets by the log filter)
            why = str(exc) if isinstance(exc, DefinitionError) else f"secrets_for raised {type(exc).__name__}: {exc}"
            if self._held.get(sid) != why:
                log.warning("session %s is held, not driven: %s; nothing was written; secrets_for is asked "
                            "again each second and the session goes on once it answers", sid, why)
            self._held[sid] = why
            return None
        if self._held.pop(sid, None) is not None:
            log.info("session %s got its secrets: driving it", sid)
        return secrets

    @property
    def held(self) -> Mapping[str, str]:
        """Sessions not driven because ``secrets_for`` failed for them: why."""
        return self._held

    # -- max_sessions (the gate) --------------------------------------------------------

    def _active_check(self, sid: str) -> Active:
        def active() -> bool:
            """Still holds its slot: driven, and its turn is not parked on a person or a sleep."""
            session = self._sessions.get(sid)
            if session is None or session.failed is not None or not session.busy:
                return False
            return classify(session.state, now_ms=int(self.host.clock.now() * 1000))[0] == "running"

        return active

    def _must_queue(self, sid: str, session: SessionCore, batch: Sequence[LogEntry]) -> bool:
        if not self._gate.limited or session.busy or self._gate.holds(sid):
            return False
        if not any(isinstance(e.record, InputMessage) for e in batch):
            return False
        return not self._gate.try_take(sid, self._active_check(sid))

    def _queue(self, sid: str) -> None:
        if sid in self._gate.waiting:
            return  # keeps its place
        log.info(
            "session %s waits for a slot: %d sessions running (max_sessions %s), %d waiting",
            sid, self._gate.running, self._gate.limit, len(self._gate.waiting) + 1,
        )
        self._gate.enqueue(sid, self, lambda: self._start_queued(sid))

    async def _start_queued(self, sid: str) -> Active | None:
        """The gate's turn for ``sid``: start it from its records, if it still has work."""
        if sid in self._sessions or self.stopped or self.draining:
            return None
        entries = self._entries.get(sid)
        if entries is None:
            return None
        state = self._fold(sid, entries)
        harness = self._harness_for(state)
        if state.ended or harness is None:
            return None
        if not self._launch(sid, state, harness):
            return None
        return self._active_check(sid)

    async def _reject_all(self, sid: str, state: SessionState) -> None:
        """No loaded harness can run this session: settle its inputs ``rejected``."""
        pending = [i for i in state.pending_inputs() if i.input_id not in self._rejected]
        if not pending:
            return
        name = state.harness or "(none)"
        try:
            writer = await self.host.log.claim(sid, owner=self.host.owner_id, lease=timedelta(seconds=5))
            now = int(self.host.clock.now() * 1000)
            await writer.append(
                [
                    InputSettled(sid, now, i.input_id, "rejected", "unknown_harness",
                                 f"no harness named {name!r} runs here; known: {', '.join(sorted(self._harnesses))}")
                    for i in pending
                ]
            )
            await writer.release()
        except (SessionBusy, FencedError):
            return  # another owner has it
        except (LogError, HarnessError) as exc:
            log.warning("could not reject inputs of session %s: %s", sid, exc)
            return
        self._rejected.update(i.input_id for i in pending)
        # A warning: on a shared topic prefix it means the group's workers run different apps, and
        # sessions land on whichever worker their partition was given to.
        log.warning("rejected %d input(s) of session %s: no harness named %r runs here (this worker runs %s); "
                    "every worker on one topic prefix must run the same --app list", len(pending), sid, name,
                    ", ".join(sorted(self._harnesses)) or "none")
        if not state.active_turn:
            self._remember_ended(sid, self._entries.pop(sid, []))


async def drain_all(
    runtimes: Sequence[PartitionRuntime], timeout: float, why: str, hurry: asyncio.Event | None = None
) -> list[str]:
    """``drain`` these runtimes side by side, saying so in the worker's log; returns the
    sessions cut at the deadline (counted in ``harness_drain_cut_sessions_total``)."""
    runtimes = [rt for rt in runtimes if not rt.stopped]
    if timeout <= 0 or not runtimes:
        return []
    # (a session whose every running call is in an ask or a sleep is stopped at once: not counted)
    running = sum(1 for rt in runtimes for session in rt.sessions.values() if session.busy and not session.drained)
    if running:
        log.info("%s: draining %d running session(s): nothing new starts, what runs gets up to %g s to "
                 "finish", why, running, timeout)
    started = time.monotonic()
    left = await asyncio.gather(*(rt.drain(timeout, hurry) for rt in runtimes))
    cut = [sid for sids in left for sid in sids]
    if cut and hurry is not None and hurry.is_set():
        log.warning("drain cut short after %.1f s (a second stop signal): %d session(s) still running are cut "
                    "(%s); their next owner recovers them from the log", time.monotonic() - started, len(cut),
                    ", ".join(cut[:10]))
        metrics.drain_cut(len(cut))
    elif cut:
        log.warning("drain timed out after %g s: %d session(s) still running are cut (%s); their next owner "
                    "recovers them from the log", timeout, len(cut), ", ".join(cut[:10]))
        metrics.drain_cut(len(cut))
    elif running:
        log.info("drained in %.2f s", time.monotonic() - started)
    return cut


def _fields(entry: LogEntry) -> Mapping[str, Any]:
    """A record's plain fields; a lazily read entry gives them without being decoded."""
    fields = getattr(entry, "fields", None)
    return fields() if callable(fields) else control_fields(entry.record)
