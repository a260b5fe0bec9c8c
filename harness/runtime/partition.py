"""The sessions of one partition of the log, driven by the partition's owner.

A worker makes one ``PartitionRuntime`` per partition it owns (on SQLite: one
for the whole file). First ``rebuild`` folds the partition's committed records
(nothing is driven while history is read), then ``go_live`` drives every session
with work left, then ``ingest`` routes each new committed record to its session,
creating sessions as their first inputs arrive. ``stop`` cancels every session
the recoverable way: nothing is written, the next owner carries on.

Sessions that ended are not kept in memory: when a new input arrives for one,
its history is read back from the log.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta

from harness.definition import Harness
from harness.errors import FencedError, HarnessError, LogError, SessionBusy
from harness.records import InputMessage, InputSettled, LogEntry
from harness.replay import SessionState, fold
from harness.runtime.host import HarnessHost
from harness.runtime.session import Session
from harness.secrets import secret_values

__all__ = ["PartitionRuntime", "SecretsFor"]

log = logging.getLogger("harness.worker")

SecretsFor = Callable[[str, str], Mapping[str, str]]
"""(session id, harness name) -> the session's secrets."""


class PartitionRuntime:
    def __init__(
        self,
        *,
        host: HarnessHost,
        harnesses: Mapping[str, Harness],
        partition: int | None = None,
        secrets_for: SecretsFor | None = None,
    ) -> None:
        self.host = host
        self.partition = partition
        self._harnesses = dict(harnesses)
        self._secrets_for = secrets_for
        self._states: dict[str, SessionState] = {}  # folded during rebuild
        self._sessions: dict[str, Session] = {}  # live, driven
        self._rejected: set[str] = set()  # input ids this owner already rejected
        self._retry: set[str] = set()  # sessions to restart at the next sweep
        self.live = False
        self.position = -1  # the highest log position folded

    # -- lifecycle -----------------------------------------------------------------------

    def rebuild(self, entries: Iterable[LogEntry]) -> None:
        """Fold history (no driving yet)."""
        for entry in entries:
            state = self._states.get(entry.session_id)
            if state is None:
                state = self._states[entry.session_id] = SessionState(session_id=entry.session_id)
            state.apply_entry(entry)
            self.position = max(self.position, entry.seq)

    async def go_live(self) -> None:
        """Drive every rebuilt session that has work left; forget the ended ones."""
        states, self._states = self._states, {}
        for session_id, state in states.items():
            state.mark_read(state.last_seq)
            if state.ended:
                continue
            await self._start(session_id, state)
        self.live = True

    async def ingest(self, entries: Sequence[LogEntry]) -> None:
        """Route newly committed records to their sessions."""
        if not self.live:
            self.rebuild(entries)
            return
        by_session: dict[str, list[LogEntry]] = defaultdict(list)
        for entry in entries:
            by_session[entry.session_id].append(entry)
            self.position = max(self.position, entry.seq)
        for session_id, batch in by_session.items():
            session = self._sessions.get(session_id)
            if session is not None:
                await session.ingest(batch)
                continue
            if not any(e.record.IS_INPUT for e in batch):
                continue  # records of a session another owner drives (or did): nothing to do
            state = fold(session_id, await self.host.log.read(session_id))
            if not state.ended:
                await self._start(session_id, state)

    async def stop(self) -> None:
        """Stop every session without writing anything (revocation, shutdown)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            with contextlib.suppress(Exception):
                await session.close()
        self.live = False

    async def sweep(self) -> None:
        """Restart sessions whose handle failed (busy elsewhere, an I/O failure) from the log.

        A fenced session means this owner lost the partition: it is dropped and the
        revocation that follows stops the rest.
        """
        for session_id, session in list(self._sessions.items()):
            error = session.failed
            if error is None:
                continue
            del self._sessions[session_id]
            with contextlib.suppress(Exception):
                await session.close()
            if isinstance(error, FencedError):
                continue
            log.warning("session %s stopped (%s: %s); restarting it from the log",
                        session_id, type(error).__name__, error)
            try:
                state = fold(session_id, await self.host.log.read(session_id))
            except LogError as exc:
                log.warning("cannot read session %s yet: %s", session_id, exc)
                self._retry.add(session_id)
                continue
            if not state.ended:
                await self._start(session_id, state)
        for session_id in list(self._retry):
            self._retry.discard(session_id)
            if session_id not in self._sessions:
                try:
                    state = fold(session_id, await self.host.log.read(session_id))
                except LogError:
                    self._retry.add(session_id)
                    continue
                if not state.ended:
                    await self._start(session_id, state)

    def forget_idle(self) -> int:
        """Drop sessions that ended and have no driver running; returns how many."""
        idle = [sid for sid, s in self._sessions.items() if s.state.ended and not s.busy]
        for sid in idle:
            del self._sessions[sid]
        return len(idle)

    @property
    def sessions(self) -> Mapping[str, Session]:
        return self._sessions

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

    async def _start(self, session_id: str, state: SessionState) -> None:
        harness = self._harness_for(state)
        if harness is None:
            await self._reject_all(session_id, state)
            return
        secrets = secret_values(self._secrets_for(session_id, harness.name) if self._secrets_for else None)
        session = Session(
            host=self.host, harness=harness, session_id=session_id, secrets=secrets, state=state, follow=False
        )
        self._sessions[session_id] = session
        session.resume()

    async def _reject_all(self, session_id: str, state: SessionState) -> None:
        """No loaded harness can run this session: settle its inputs ``rejected``."""
        pending = [i for i in state.pending_inputs() if i.input_id not in self._rejected]
        if not pending:
            return
        name = state.harness or "(none)"
        try:
            writer = await self.host.log.claim(session_id, owner=self.host.owner_id, lease=timedelta(seconds=5))
            now = int(self.host.clock.now() * 1000)
            await writer.append(
                [
                    InputSettled(session_id, now, i.input_id, "rejected", "unknown_harness",
                                 f"no harness named {name!r} runs here")
                    for i in pending
                ]
            )
            await writer.release()
        except (SessionBusy, FencedError):
            return  # another owner has it
        except (LogError, HarnessError) as exc:
            log.warning("could not reject inputs of session %s: %s", session_id, exc)
            return
        self._rejected.update(i.input_id for i in pending)
