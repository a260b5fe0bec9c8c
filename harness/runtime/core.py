"""The core of one durable session in one host: its state, its ownership, its inputs.

Every handle a host gives out for a session (``Session``) shares its core, so two
``send`` calls on one handle, or on two handles of one session in one host, go
through one state and one claim, and are taken in log order (issue 13).

Inputs (messages, answers, app records, cancels) are always appended first, the same
way by the owner and by anyone else (``log.submit``), and taken from the log in log
order: the fold sees each input where the log has it, so the first record of an
``input_id`` is the same for every reader, and a later one with another payload is
a conflict the owner settles ``rejected`` / ``input_conflict`` (``input_seq`` names it).

Ownership is claimed by the driver when it has something to write. On a log with
leases (SQLite, memory) the session is given up again as soon as it is idle (no
active turn, no input waiting): an idle session holds no lease and no task. When
another live owner holds it, the core stands by until that lease runs out, and the
host's poller tells it about new records meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol

from pydantic import BaseModel

from harness import ids, logs
from harness.clock import Clock
from harness.definition import Harness
from harness.errors import (
    CorruptRecord,
    FencedError,
    LogError,
    RecordTooLarge,
    SessionBusy,
    SessionClosed,
)
from harness.live import LiveEvent, LiveHub, LivePublisher
from harness.log.base import SessionLog
from harness.observability import metrics
from harness.records import (
    InputCancel,
    InputSettled,
    LogEntry,
    Record,
    StepResult,
)
from harness.replay import SessionState
from harness.runtime.answers import secret_refusal, settle_conflict, settle_input
from harness.runtime.driver import TurnDriver
from harness.runtime.ownership import Ownership
from harness.runtime.results import TurnResult, settled_result, waiting_in_log, waiting_live
from harness.secrets import SecretScrubber, redact_record

__all__ = ["SessionCore", "SessionHost"]

log = logging.getLogger("harness.session")


class SessionHost(Protocol):
    """What a session needs from the host that opened it (``HarnessHost``)."""

    log: SessionLog
    clock: Clock
    lease: timedelta
    owner_id: str
    poll_interval: float
    live: LivePublisher | None
    """Where text deltas of streamed model answers go for other processes (or None)."""

    def hold(self, ownership: Ownership) -> None:
        """Renew this held lease until dropped."""
        ...

    def drop(self, ownership: Ownership) -> None: ...

    def watch(self, core: SessionCore) -> None:
        """Hint ``core`` about new records of its session until unwatched."""
        ...

    def unwatch(self, core: SessionCore) -> None: ...

    async def run_sync(self, fn: Any, *, quick: bool = False) -> Any:
        """Run a blocking callable on the host's bounded thread pool (``quick``: see
        ``harness.step.RunSync``)."""
        ...


def _weakly(core: SessionCore) -> Callable[[BaseException], None]:
    """``core.fail`` without keeping ``core`` alive (see ``SessionCore.__init__``)."""
    ref = weakref.ref(core)

    def on_lost(exc: BaseException) -> None:
        alive = ref()
        if alive is not None:
            alive.fail(exc)

    return on_lost


STALLED_HOLDER_RETRY_S = 1.0
"""How often a core claims again while a holder alive on this machine keeps a session past
its lease (each claim is a write: not at every LEASE_POLL_S)."""

LEASE_POLL_S = 0.25
"""While another owner holds a session, how often a waiting core looks whether it was given
up before its lease ran out (a closed host releases at once; the log tells no one)."""


class SessionCore:
    """One session's state, ownership, inputs and driver in one host."""

    def __init__(
        self,
        *,
        host: SessionHost,
        harness: Harness,
        session_id: str,
        secrets: Mapping[str, str],
        state: SessionState,
        follow: bool = True,
    ) -> None:
        self.host = host
        # follow=True: the host's poller hints the core about new records and it reads
        # them itself. follow=False: a worker pushes every committed record (ingest).
        self.follow = follow
        self.log = host.log
        self.clock = host.clock
        self.harness = harness
        self.session_id = session_id
        self.secrets = secrets
        self.log_id = ids.log_id(self.log.namespace, session_id)
        self.scrubber = SecretScrubber(secrets)
        self.state = state
        self.ownership = Ownership(
            log=self.log,
            session_id=session_id,
            owner_id=host.owner_id,
            lease=host.lease,
            clock=self.clock,
            renewals=host,
            on_lost=_weakly(self),
        )
        self.ask_models: dict[tuple[str, str], type[BaseModel]] = {}  # registered by running asks
        # The driver and the ownership point back at the core weakly: a core no longer
        # referenced (a worker forgets ended sessions all the time) is freed at once by
        # reference counting. With strong links each one was a cycle of ~34 objects left
        # to the cyclic collector, whose middle-generation passes then took 0.3-0.5 s of
        # the loop every ~25 s in bench/e2e.py (docs/architecture.md, "Garbage").
        self.driver = TurnDriver(weakref.proxy(self))
        # Set and dropped at every change; made again by the next waiter (none: no cost).
        self._changed: asyncio.Event | None = None
        self._verdicts: asyncio.Event | None = None  # the same, for changes that may decide a result
        self._task: asyncio.Task[None] | None = None  # the driver's task
        self._side_tasks: set[asyncio.Task[Any]] = set()
        self._standby: asyncio.Task[None] | None = None
        self._busy_until = 0.0
        self._input_lock = asyncio.Lock()
        self._refreshing: asyncio.Task[None] | None = None
        self.fatal: BaseException | None = None
        self.closed = False
        self.live = LiveHub()  # text deltas of streamed model answers, for events(live=True)
        self._told_busy: tuple[str | None, bool] | None = None  # the holder a lease wait was last logged for
        if follow:
            host.watch(self)

    # -- what others read ------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        return self.state.last_seq

    @property
    def failed(self) -> BaseException | None:
        """Why this core stopped for good (fenced, an I/O failure), if it did."""
        return self.fatal

    @property
    def busy(self) -> bool:
        """A driver task is running (a turn, or inputs being taken)."""
        return self._task is not None and not self._task.done()

    def now_ms(self) -> int:
        return round(self.clock.now() * 1000)

    def check_open(self) -> None:
        """Raise ``SessionClosed`` after close, and the failure of a failed core (fenced: it
        writes nothing more, not even an input)."""
        if self.closed:
            raise SessionClosed(self.session_id)
        if self.fatal is not None:
            raise self.fatal

    # -- public operations (through ``Session``) ---------------------------------------------

    def check_name(self, kind: str, name: str) -> None:
        self.scrubber.check_name(kind, name, session_id=self.session_id)

    # -- reading the log -------------------------------------------------------------------

    async def refresh(self) -> None:
        """Fold what others committed since we last looked (follow=True only).

        Raises:
            CorruptRecord: a record of the session cannot be read (a changed byte): the
                session is not driven from here; nobody can know what that record said.
        """
        if not self.follow or self.closed:
            return
        await self._catch_up()

    async def _catch_up(self) -> None:
        entries = await self._read_new()
        if entries:
            for entry in entries:
                self.state.apply_entry(entry)  # our own appends are skipped: already folded
            self.state.mark_read(entries[-1].seq)
            self.notify()

    async def _read_new(self) -> list[LogEntry]:
        scan = getattr(self.log, "scan", None)
        if not callable(scan):
            return list(await self.log.read(self.session_id, after=self.state.read_upto))
        items = await scan(self.session_id, after=self.state.read_upto)
        for item in items:
            if isinstance(item, CorruptRecord):  # never skipped: a lost step result would run again
                dead_letter = getattr(self.log, "dead_letter", None)
                if callable(dead_letter):
                    await asyncio.to_thread(dead_letter, item)
                raise item
        return list(items)

    def hint(self, seqs: Sequence[int]) -> None:
        """The poller saw new records of this session at ``seqs``."""
        if self.closed:
            return
        state = self.state
        if seqs and all(s <= state.read_upto or s in state._ahead for s in seqs):
            return  # our own appends: already folded
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._on_hint())

    async def _on_hint(self) -> None:
        try:
            await self.refresh()
        except Exception:  # noqa: BLE001 - the next hint or call reads again
            return
        self.after_new_records()

    async def ingest(self, entries: Sequence[LogEntry]) -> None:
        """Fold records a worker read from the log, then act on new inputs (follow=False)."""
        state = self.state
        new = new_input = False
        for entry in entries:
            if state.folded(entry.seq):
                continue  # our own appends come back: folded at commit, not even decoded
            state.apply_entry(entry)
            new = True
            new_input = new_input or entry.record.IS_INPUT
        if entries:
            state.mark_read(max(e.seq for e in entries))
        if entries and not new:
            return  # only our own appends: nothing changed, nobody to tell
        if new_input and self._busy_until:
            # Another owner held the session at our last try; it may have let go since
            # (its host closed it): a new input is worth a claim now, not only when
            # that lease would have run out.
            self._busy_until = 0.0
        if new:
            self.notify()
        self.after_new_records()

    def after_new_records(self) -> None:
        if self.closed or self.fatal is not None or self.driver.draining:
            return  # (draining: inputs that come in are the next owner's to take)
        if self.busy and (self.state.pending_conflicts() or any(
            i.kind != "message" for i in self.state.pending_inputs()
        )):
            # The driver is inside a turn (e.g. a tool parked on an ask): take the
            # answer / records / cancel now, beside it.
            self._spawn(self._take_inputs_guarded(), f"inputs:{self.session_id}")
        self.resume()

    def resume(self) -> None:
        """Drive the session if the log shows work: inputs to take or an unfinished turn."""
        state = self.state
        if self.clock.now() < self._busy_until:
            return  # another live owner has it: the stand-by timer tries again
        if state.pending_inputs() or state.pending_conflicts() or state.active_turn is not None:
            self.kick()

    # -- writing ------------------------------------------------------------------------------

    def redact(self, record: Record) -> Record:
        return redact_record(record, self.scrubber)

    async def ensure_owner(self) -> None:
        """Claim the session if this core does not hold it, then read what the previous
        owner wrote after we last looked, so what is decided next is decided on all of it.

        Raises:
            SessionBusy: another owner's lease is live.
        """
        own = self.ownership
        if own.held:
            return
        await own.acquire()
        if self.follow or own.has_leases:  # (a Kafka worker read its partition after fencing it)
            await self._catch_up()

    async def commit(self, records: list[Record]) -> None:
        """Append as the owner (claiming first if needed) and fold the entries at once."""
        if self.fatal is not None:
            raise self.fatal
        own = self.ownership
        writer = own.writer or await own.acquire()
        scrubber = self.scrubber
        if scrubber.active:
            records = [redact_record(r, scrubber) for r in records]
        own.inflight += 1
        try:
            # A writer that can commit a lone write at once (SQLite's) does it with no
            # coroutine in between (``append_now`` gives the positions, or what to await
            # for them). (Asked of its class: a wrapper that passes other attributes on to
            # the writer it wraps, and catches ``append``, is never gone around.)
            append_now = getattr(type(writer), "append_now", None)
            if append_now is None:
                landed: Iterable[tuple[int, Record]] = [(e.seq, e.record) for e in await writer.append(records)]
            else:
                seqs = append_now(writer, records)
                if not isinstance(seqs, list):
                    seqs = await seqs
                landed = zip(seqs, records, strict=True)
        finally:
            own.inflight -= 1
        apply = self.state.apply
        for seq, record in landed:
            apply(seq, record)
        # This owner's own step results decide no input's result (settled, waiting):
        # the waiters of results sleep on (a step costs no wake-up of ``send``).
        self.notify(verdicts=type(records[0]) is not StepResult if len(records) == 1 else not all(
            type(r) is StepResult for r in records
        ))

    def publish_live(self, event: LiveEvent) -> None:
        """A text delta of a streamed model answer: to this host's subscribers and, on
        workers, to other processes (the Kafka live topic). Never in the log."""
        self.live.publish(event)
        publisher = self.host.live
        if publisher is not None:
            publisher.publish(event)

    # -- change notification ---------------------------------------------------------------------

    def notify(self, *, verdicts: bool = True) -> None:
        """Wake whoever waits for a change. ``verdicts=False``: a change that cannot
        decide any input's result (see ``commit``); only ``next_change()`` waiters wake."""
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()
        if verdicts:
            decided, self._verdicts = self._verdicts, None
            if decided is not None:
                decided.set()
        if self.state.cancels:
            self.driver.check_interrupt()

    async def next_change(self, *others: asyncio.Future[Any], verdicts: bool = False) -> None:
        """Wait for the next state change (or for one of ``others`` to finish);
        ``verdicts``: only for a change that may decide an input's result."""
        if verdicts:
            event = self._verdicts = self._verdicts or asyncio.Event()
        else:
            event = self._changed = self._changed or asyncio.Event()
        if not others:  # the common case: no task + asyncio.wait per commit (~15 µs a step)
            await event.wait()
            return
        waiter = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({waiter, *others}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    def fail(self, exc: BaseException) -> None:
        """This handle lost its ownership for good (fenced) or broke: it writes nothing more."""
        if isinstance(exc, FencedError):
            metrics.fenced_writer()
            log.info("session %s was fenced (another owner took it over); this owner stops driving it", self.session_id)
        self.fatal = exc
        self.ownership.lost()
        task = self._task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        self.notify()

    # -- waiting for results -------------------------------------------------------------------

    def result_of(self, input_id: str, seq: int | None = None) -> TurnResult | None:
        state = self.state
        inp = state.inputs.get(input_id)
        if inp is None:
            return None
        if inp.kind != "message" and (seq is None or seq == inp.seq):
            return settled_result(state, input_id)  # answers, records, cancels: only their verdict
        if seq is not None and seq != inp.seq:
            conflict = state.conflicts.get(seq)
            if conflict is None or conflict.settled is None:
                return None
            s = conflict.settled
            return TurnResult(input_id=input_id, outcome=s.outcome, code=s.code, error=s.reason)
        settled = settled_result(state, input_id)
        if settled is not None:
            return settled
        if self.busy:  # we drive it: waiting once every running call is parked on an ask
            return waiting_live(state, input_id, self.driver.running, self.driver.parked)
        if self.clock.now() < self._busy_until:  # another live owner drives it: as the log shows
            return waiting_in_log(state, input_id)
        return None  # nobody drives it here yet: the waiter kicks the driver

    async def wait_result(self, input_id: str, seq: int | None = None) -> TurnResult:
        while True:
            if self.fatal is not None:
                raise self.fatal
            result = self.result_of(input_id, seq)
            if result is not None:
                return result
            if self.closed:
                raise SessionClosed(self.session_id)
            if not self.busy and self.clock.now() >= self._busy_until:
                self.kick()
            await self.next_change(verdicts=True)

    # -- the driver's task ----------------------------------------------------------------------

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    def kick(self) -> None:
        if self.closed or self.fatal is not None or self.driver.draining:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run_driver())
            self._task.set_name(f"drive:{self.session_id}")
            # A BaseException it lets through (SystemExit ...) is also in self.fatal,
            # which the waiters raise: nobody needs the task's own copy.
            self._task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _run_driver(self) -> None:
        logs.bind(session_id=self.session_id)  # this task's own context: every line of the turn
        try:
            while True:
                await self.driver.drive()
                if self.driver.draining:
                    return  # handing over: the close that follows gives ownership up
                if not await self._released_when_idle():
                    continue  # new work came in while it was being given up
                return
        except SessionBusy as busy:
            self._stand_by(busy)
        except FencedError as exc:
            self.fail(exc)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug or an I/O failure: the waiters raise it
            self.fatal = exc
            if not isinstance(exc, Exception):
                raise  # SystemExit, KeyboardInterrupt: not ours to keep
        finally:
            self.notify()

    def _stand_by(self, busy: SessionBusy) -> None:
        """Another live owner holds the session: try again once it gives the session up or
        its lease runs out. In a host a wait of a second or more is a warning: a script that
        configured no logging shows it (it would otherwise sit silent for a lease). In a
        worker (``follow=False``) another worker holding the session is how workers on one
        file share it: INFO, unless its holder outlives its lease (a stalled process)."""
        now = self.clock.now()
        stalled = busy.holder_pid is not None  # its lease ran out, its process lives on
        if stalled:
            until = min(now + STALLED_HOLDER_RETRY_S, busy.keep_until or now)
        else:
            until = busy.lease_until if busy.lease_until is not None else now + 0.05
        told = (busy.owner, stalled)
        if told != self._told_busy:  # once per holder, not at every retry
            self._told_busy = told
            warn = stalled or (self.follow and until - now >= 1)
            log.log(logging.WARNING if warn else logging.INFO,
                    logs.lease_wait_message(self.session_id, busy.owner, busy.lease_until, now,
                                            holder_pid=busy.holder_pid, keep_until=busy.keep_until))
        self._busy_until = until
        if self._standby is None or self._standby.done():
            self._standby = asyncio.ensure_future(self._retry_at(until, lapsed_ok=stalled))

    async def _retry_at(self, when: float, *, lapsed_ok: bool = False) -> None:
        """Claim again at ``when``, or sooner once the holder gives the session up (or, unless
        ``lapsed_ok``: the holder is known to live on past its lease, its lease runs out)."""
        while not self.closed:
            try:
                await asyncio.wait_for(self.clock.sleep_until(when + 0.001), LEASE_POLL_S)
                break  # the lease ran out
            except TimeoutError:
                pass
            try:
                info = await self.log.lease_info(self.session_id)
            except LogError:
                continue  # (the claim that follows the lease's end says what is wrong)
            if info.owner is None or (
                not lapsed_ok and info.lease_until is not None and info.lease_until <= self.clock.now()
            ):
                break  # given up before its lease ran out (its host closed the session)
        self._busy_until = 0.0
        if not self.closed:
            await self.refresh()
            self.resume()
            self.notify()

    async def _released_when_idle(self) -> bool:
        """Called by the driver once it has nothing to do: on a log with leases, give the
        session up (an idle session holds no lease). False: new work came in meanwhile."""
        own = self.ownership
        if not own.has_leases or not own.held or self.closed:
            return True
        if self._side_tasks:  # inputs being taken beside the driver: let them land first
            await asyncio.wait(list(self._side_tasks))
        await self.refresh()
        if not self._idle():
            return False
        await own.release()
        # An input that came in just before the release: take it back up. (One that comes
        # in after it is seen by its sender's own claim, or by the next hint.)
        await self.refresh()
        return self._idle()

    def _idle(self) -> bool:
        return not self._side_tasks and self.ownership.inflight == 0 and self.state.ended

    # -- inputs from the log -----------------------------------------------------------------------

    async def take_inputs(self) -> None:
        """Settle answers, app records, cancels and conflicting resends found in the log, and
        refuse any input whose id (or session id) holds a session secret (``secret_in_name``)."""
        now = self.now_ms()
        waiting = self.state.pending_inputs()  # (one pass over the session's inputs)
        refused = {
            i.input_id: refusal
            for i in waiting
            if (refusal := secret_refusal(self.session_id, i, self.scrubber, now)) is not None
        }
        starting = self.driver.starting  # (a cancel of it is the driver's: see TurnDriver.starting)
        pending = [
            i for i in waiting
            if i.input_id in refused or (
                i.kind != "message"
                and not (starting is not None and isinstance(i.record, InputCancel)
                         and i.record.target_input_id == starting)
            )
        ]
        conflicts = self.state.pending_conflicts()
        if not pending and not conflicts:
            return
        await self.ensure_owner()
        async with self._input_lock:
            for conflict in conflicts:
                if conflict.settled is None:
                    await self.commit([settle_conflict(self.state, conflict, self.now_ms())])
            for inp in pending:
                if self.state.inputs[inp.input_id].settled is None:
                    refusal = refused.get(inp.input_id)
                    records: list[Record] = [refusal] if refusal is not None else settle_input(
                        self.state, inp, self.now_ms(), self.ask_models
                    )
                    if records:
                        records = await self._settle(inp.input_id, records)
                        self._log_settled(records)

    async def _settle(self, input_id: str, records: list[Record]) -> list[Record]:
        """Append the records that settle an input; one the log refuses as too large (an
        answer this owner's log takes no copy of) settles ``rejected`` / ``record_too_large``."""
        try:
            await self.commit(records)
        except RecordTooLarge as exc:
            reason = exc.explained("the answer", "answer with less")
            records = [InputSettled(self.session_id, self.now_ms(), input_id, "rejected", "record_too_large", reason)]
            await self.commit(records)
        return records

    def _log_settled(self, records: Sequence[Record]) -> None:
        for r in records:
            if isinstance(r, InputSettled):
                log.info(
                    "input %s of session %s settled %s%s", r.input_id, self.session_id, r.outcome,
                    self.scrubber.redact_text(f" ({r.code}: {r.reason})") if r.code else "",
                )

    async def _take_inputs_guarded(self) -> None:
        logs.bind(session_id=self.session_id)
        try:
            await self.take_inputs()
        except SessionBusy as busy:
            self._stand_by(busy)
        except FencedError as exc:
            self.fail(exc)
        except Exception as exc:  # noqa: BLE001 - the waiters raise it
            self.fatal = exc
            self.notify()

    # -- closing ---------------------------------------------------------------------------------

    def drain(self) -> None:
        """Hand-over (a partition revoked, a worker stopping): start nothing new, let what
        runs reach its next durable boundary; ``drained`` says when. ``close`` follows."""
        self.driver.drain()

    @property
    def drained(self) -> bool:
        """Nothing is running that a close would cut: no driver task (or one whose every
        running call is in a durable wait), no append in flight, no input being taken."""
        if self._side_tasks or self.ownership.inflight:
            return False
        return not self.busy or self.driver.quiet

    async def close(self) -> None:
        """Stop driving (recoverably: nothing is written) and give up ownership at once."""
        if self.closed:
            return
        self.closed = True
        if self.follow:
            self.host.unwatch(self)
        for task in (self._task, self._standby, self._refreshing, *self._side_tasks):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._task = self._standby = None
        await self.ownership.release()
        self.notify()
