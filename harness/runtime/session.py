"""A durable session: the owner's loop that turns inputs into turns.

One driver task per session asks the pure planner (``harness.replay``) what to
do next and does it: call the model, log its response, run a batch of tool
calls concurrently, finish the turn. A first run and a run after a crash take
the same path: the planner only looks at the folded log.

Every write goes through ``_commit``: secrets are redacted, the owner's writer
appends atomically, and the committed entries are folded into the live state
before anyone is told (so a parked ``step.ask`` wakes as its answer commits).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol

from harness import ids
from harness.clock import Clock
from harness.context import check_app_records
from harness.definition import Harness, ToolCallEvent, ToolOutcome
from harness.errors import AskExpired, FencedError, InvalidAnswer, SessionBusy
from harness.jsonvalues import check_text, json_copy
from harness.log.base import SessionLog, SessionWriter
from harness.models.base import ModelResponse
from harness.records import (
    AppRecord,
    AskAnswered,
    InputAnswer,
    InputMessage,
    InputRecords,
    InputSettled,
    LogEntry,
    ModelResponseRecord,
    Record,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnResumed,
    TurnStarted,
)
from harness.replay import (
    CallDecision,
    CallModel,
    CompleteTurn,
    FailTurn,
    RunBatch,
    SessionState,
    conversation,
    is_parked,
    plan_turn,
)
from harness.replay.state import InputState
from harness.runtime.answers import judge_answer, settle_input
from harness.runtime.execute import apply_after_hook, error_outcome, run_tool_call
from harness.runtime.results import OpenAsk, TurnResult, settled_result, waiting_in_log, waiting_live
from harness.secrets import SecretScrubber, redact_record
from harness.step import CallScope, DurableStep

__all__ = ["OpenAsk", "Session", "SessionHost", "TurnResult"]


class SessionHost(Protocol):
    """What a session needs from the host that opened it (``HarnessHost``, a worker's host)."""

    log: SessionLog
    clock: Clock
    lease: timedelta
    owner_id: str
    poll_interval: float


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


class Session:
    """A handle on one durable session (made by ``HarnessHost.open``)."""

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
        self._host = host
        # follow=True: the handle reads the log itself (polling while it owns the
        # session). follow=False: a worker pushes every committed record with ingest().
        self._follow = follow
        self._log = host.log
        self._clock = host.clock
        self.harness = harness
        self.session_id = session_id
        self.secrets = secrets
        self.log_id = ids.log_id(self._log.namespace, session_id)
        self._scrubber = SecretScrubber(secrets)
        self._state = state
        self._writer: SessionWriter | None = None
        self._changed = asyncio.Event()  # replaced by a fresh one at every change
        self._driver: asyncio.Task[None] | None = None
        self._background: asyncio.Task[None] | None = None
        self._fatal: BaseException | None = None
        self._running: set[str] = set()
        self._parked: set[str] = set()
        self._own_turns: set[int] = set()  # turns this handle started or took over
        self._input_lock = asyncio.Lock()
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- public API ---------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        """The folded state (read-only by convention)."""
        return self._state

    async def send(self, text: str, input_id: str | None = None) -> TurnResult:
        """Send a user message and run its turn; resending an ``input_id`` has no second effect."""
        check_text(text, what="the message text")
        input_id = input_id or f"in-{uuid.uuid4().hex}"
        await self._refresh()
        if input_id not in self._state.inputs:
            message = InputMessage(self.session_id, self._now_ms(), input_id, text, self.harness.name)
            if await self._try_own():
                await self._commit([message])
            else:
                await self._log.submit(self._redact(message))  # the live owner will take it (SPEC 7.2)
        return await self._wait_result(input_id)

    async def recover(self) -> list[TurnResult]:
        """Take over (once the old owner's lease expired) and finish what the log left open."""
        await self._ensure_writer(wait=True)
        todo = [i.input_id for i in self._state.pending_inputs()]
        active = self._state.active_turn
        if active is not None:
            todo.insert(0, active.input_id)
        if not todo:
            return []
        self._kick()
        return [await self._wait_result(i) for i in todo]

    async def answer(
        self, tool_call_id: str, name: str, value: Any, input_id: str | None = None
    ) -> TurnResult | None:
        """Answer a ``step.ask``; returns how the resumed turn went (or None if another owner has it).

        Raises:
            InvalidAnswer: no such open ask, it expired, or the value fails its schema;
                the tool keeps waiting.
        """
        input_id = input_id or f"answer:{tool_call_id}:{name}"
        await self._refresh()
        value = json_copy(value, what="answer")
        if input_id not in self._state.inputs:
            verdict = judge_answer(self._state, tool_call_id, name, value, self._now_ms())
            if not verdict.ok:
                raise InvalidAnswer(
                    verdict.reason or "answer refused",
                    reason=verdict.code or "invalid_answer",
                    session_id=self.session_id,
                    tool_call_id=tool_call_id,
                    name=name,
                )
            answer = InputAnswer(self.session_id, self._now_ms(), input_id, tool_call_id, name, value)
            if not await self._try_own():
                await self._log.submit(self._redact(answer))  # the live owner will take it
                return None
            now = self._now_ms()
            await self._commit(
                [
                    answer,
                    AskAnswered(self.session_id, now, tool_call_id, name, value, input_id),
                    InputSettled(self.session_id, now, input_id, "completed"),
                ]
            )
        call = self._state.calls.get(tool_call_id)
        if call is None:
            return None
        turn = self._state.turns[call.turn - 1]
        self._kick()
        return await self._wait_result(turn.input_id)

    async def append_records(self, records: list[dict[str, Any]], input_id: str | None = None) -> None:
        """Append app records outside a tool; resending an ``input_id`` appends once (SPEC 4.3)."""
        checked = [self._scrubber.redact(r) for r in check_app_records(records)]
        input_id = input_id or f"rec-{uuid.uuid4().hex}"
        await self._refresh()
        if input_id in self._state.inputs:
            return
        record = InputRecords(self.session_id, self._now_ms(), input_id, checked)
        if not await self._try_own():
            await self._log.submit(record)
            return
        await self._commit([record, InputSettled(self.session_id, self._now_ms(), input_id, "completed")])

    async def records(self, type: str | None = None) -> list[dict[str, Any]]:  # noqa: A002 - SPEC name
        """App records in log order (only those of ``type`` if given)."""
        await self._refresh()
        return [json_copy(e.body) for e in self._state.app_records if type is None or e.type == type]

    async def events(self, after: int | None = None) -> AsyncIterator[LogEntry]:
        """Committed records of the session, from position ``after`` on, live until close."""
        position = -1 if after is None else after
        while not self._closed:
            entries = await self._log.read(self.session_id, after=position)
            for entry in entries:
                position = entry.seq
                yield entry
            if not entries:
                await self._next_change(asyncio.ensure_future(asyncio.sleep(self._host.poll_interval)))

    async def ingest(self, entries: Sequence[LogEntry]) -> None:
        """Fold records a worker read from the log, then act on new inputs (follow=False)."""
        if entries:
            for entry in entries:
                self._state.apply_entry(entry)  # our own appends come back: skipped
            self._state.mark_read(max(e.seq for e in entries))
            self._notify()
        if self.busy and any(i.kind != "message" for i in self._state.pending_inputs()):
            # The driver is inside a turn (e.g. a tool parked on an ask): take the
            # answer / records now, beside it.
            task = asyncio.create_task(self._take_inputs_guarded(), name=f"inputs:{self.session_id}")
            self._side_tasks.add(task)
            task.add_done_callback(self._side_tasks.discard)
        self.resume()

    async def _take_inputs_guarded(self) -> None:
        try:
            await self._take_inputs()
        except FencedError as exc:
            self._fail(exc)
        except Exception as exc:  # noqa: BLE001 - the waiters raise it
            self._fatal = exc
            self._notify()

    def resume(self) -> None:
        """Drive the session if the log shows work: inputs to take or an unfinished turn."""
        if self._state.pending_inputs() or self._state.active_turn is not None:
            self._kick()

    @property
    def failed(self) -> BaseException | None:
        """Why this handle stopped for good (fenced, busy elsewhere, an I/O failure), if it did."""
        return self._fatal

    @property
    def busy(self) -> bool:
        """A driver task is running (a turn, or inputs being taken)."""
        return self._driver is not None and not self._driver.done()

    async def close(self) -> None:
        """Stop driving (recoverably: nothing is written) and give up ownership."""
        self._closed = True
        for task in (self._driver, self._background, *self._side_tasks):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._driver = self._background = None
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer.release()
            self._writer = None
        self._notify()

    # -- ownership, refresh, commit ---------------------------------------------------------

    def _now_ms(self) -> int:
        return _ms(self._clock.now())

    async def _refresh(self) -> None:
        """Fold what others committed since we last looked."""
        if not self._follow:
            return  # the worker feeds us (ingest)
        entries = await self._log.read(self.session_id, after=self._state.read_upto)
        if entries:
            for entry in entries:
                self._state.apply_entry(entry)  # our own appends are skipped: already folded
            self._state.mark_read(entries[-1].seq)
            self._notify()

    async def _try_own(self) -> bool:
        try:
            await self._ensure_writer()
        except SessionBusy:
            return False
        return True

    async def _ensure_writer(self, *, wait: bool = False) -> SessionWriter:
        if self._writer is not None:
            return self._writer
        if self._fatal is not None:  # fenced (or broken): this handle writes nothing more
            raise self._fatal
        lease = self._host.lease
        while True:
            try:
                self._writer = await self._log.claim(self.session_id, owner=self._host.owner_id, lease=lease)
                break
            except SessionBusy as busy:
                if not wait:
                    raise
                until = busy.lease_until if busy.lease_until is not None else self._clock.now() + 0.05
                await self._clock.sleep_until(min(until, self._clock.now() + lease.total_seconds()) + 0.01)
        await self._refresh()  # the previous owner may have written after we folded
        needs_keep_alive = self._follow or getattr(self._log, "has_leases", True)
        if needs_keep_alive and (self._background is None or self._background.done()):
            self._background = asyncio.create_task(self._keep_alive(), name=f"keep-alive:{self.session_id}")
        return self._writer

    async def _keep_alive(self) -> None:
        """Renew the lease and take inputs other processes put in the log."""
        renew_every = self._host.lease.total_seconds() / 3
        poll = self._host.poll_interval
        next_renew = self._clock.now() + renew_every
        # A worker-fed handle (follow=False) only renews: it wakes once per renewal, so
        # thousands of parked sessions cost nothing between renewals.
        pause = poll if self._follow else renew_every
        while not self._closed and self._writer is not None:
            await asyncio.sleep(pause)
            try:
                if self._clock.now() >= next_renew:
                    await self._writer.renew()
                    next_renew = self._clock.now() + renew_every
                if not self._follow:
                    continue
                await self._refresh()
                await self._take_inputs()
                idle = self._driver is None or self._driver.done()
                if idle and (self._state.pending_inputs() or self._state.active_turn is not None):
                    self._kick()
            except FencedError as exc:
                self._fail(exc)
                return

    def _redact(self, record: Record) -> Record:
        return redact_record(record, self._scrubber)

    async def _commit(self, records: list[Record]) -> None:
        writer = await self._ensure_writer()
        entries = await writer.append([self._redact(r) for r in records])
        for entry in entries:
            self._state.apply_entry(entry)
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _next_change(self, *others: asyncio.Future[Any]) -> None:
        """Wait for the next state change (or for one of ``others`` to finish)."""
        if not others:  # the common case: no task + asyncio.wait per commit (~15 µs a step)
            await self._changed.wait()
            return
        waiter = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({waiter, *others}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    def _fail(self, exc: BaseException) -> None:
        self._fatal = exc
        self._writer = None
        for task in (self._driver,):
            if task is not None and not task.done() and task is not asyncio.current_task():
                task.cancel()
        self._notify()

    # -- waiting for results -------------------------------------------------------------

    def _result_of(self, input_id: str) -> TurnResult | None:
        if input_id not in self._state.inputs:
            return None
        settled = settled_result(self._state, input_id)
        if settled is not None:
            return settled
        if self._writer is None:
            return waiting_in_log(self._state, input_id)
        return waiting_live(self._state, input_id, self._running, self._parked)

    async def _wait_result(self, input_id: str) -> TurnResult:
        while True:
            if self._fatal is not None:
                raise self._fatal
            result = self._result_of(input_id)
            if result is not None:
                return result
            if self._writer is None and not self._closed and not await self._try_own():
                # Another live owner drives the session: watch the log until it settles
                # the input, or until its lease runs out and this handle takes over (SPEC 7.3).
                tick = asyncio.ensure_future(asyncio.sleep(self._host.poll_interval))
                try:
                    await self._next_change(tick)
                finally:
                    tick.cancel()
                await self._refresh()
                continue
            if self._driver is None or self._driver.done():
                if self._closed:
                    raise asyncio.CancelledError("session closed")
                self._kick()
            await self._next_change()

    # -- the driver ------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._closed or self._fatal is not None:
            return
        if self._driver is None or self._driver.done():
            self._driver = asyncio.create_task(self._drive(), name=f"drive:{self.session_id}")

    async def _drive(self) -> None:
        try:
            while True:
                await self._take_inputs()
                turn = self._state.active_turn
                if turn is None:
                    nxt = next((i for i in self._state.pending_inputs() if i.kind == "message"), None)
                    if nxt is None:
                        return
                    n = len(self._state.turns) + 1
                    self._own_turns.add(n)
                    await self._commit([TurnStarted(self.session_id, self._now_ms(), nxt.input_id, n)])
                    continue
                if turn.turn not in self._own_turns:
                    # Taking over a turn another owner left unfinished: it uses an attempt
                    # only if work may have been running (SPEC 7.5).
                    self._own_turns.add(turn.turn)
                    now = self._now_ms()
                    counted = not is_parked(self._state, now)
                    attempt = turn.attempts + 1 if counted else turn.attempts
                    await self._commit(
                        [TurnResumed(self.session_id, now, turn.input_id, turn.turn, attempt, counted)]
                    )
                    continue
                action = plan_turn(
                    self._state,
                    self.harness.policies,
                    max_attempts=self.harness.durability.max_attempts,
                    now_ms=self._now_ms(),
                )
                if action is None:
                    continue
                await self._do(action)
        except FencedError as exc:
            self._fail(exc)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug or an I/O failure: the waiters raise it
            self._fatal = exc
            if not isinstance(exc, Exception):
                raise  # SystemExit, KeyboardInterrupt: not ours to keep
        finally:
            self._notify()

    async def _do(self, action: CallModel | RunBatch | CompleteTurn | FailTurn) -> None:
        turn = self._state.active_turn
        assert turn is not None
        now = self._now_ms()
        if isinstance(action, CompleteTurn):
            await self._finish(turn.turn, turn.input_id, "completed", text=action.text)
        elif isinstance(action, FailTurn):
            await self._finish(turn.turn, turn.input_id, "failed", code=action.code, error=action.error)
        elif isinstance(action, CallModel):
            if action.index >= self.harness.durability.max_model_calls:
                await self._finish(
                    turn.turn, turn.input_id, "failed", code="too_many_model_calls",
                    error=f"the turn called the model {action.index} times",
                )
                return
            await self._call_model(action, now)
        else:
            await self._run_batch(action)

    async def _finish(self, turn: int, input_id: str, outcome: str, *, text: str | None = None,
                      code: str | None = None, error: str | None = None) -> None:
        now = self._now_ms()
        await self._commit(
            [
                TurnFinished(self.session_id, now, input_id, turn, outcome, text, code, error),
                InputSettled(self.session_id, now, input_id, outcome, code, error),
            ]
        )

    async def _call_model(self, action: CallModel, now: int) -> None:
        messages: list[dict[str, Any]] = []
        if self.harness.system_prompt:
            messages.append({"role": "system", "content": self.harness.system_prompt})
        messages.extend(conversation(self._state))
        specs = [t.definition.spec() for t in self.harness.tools.values()]
        try:
            response = await self.harness.model.complete(messages, specs)
            if not isinstance(response, ModelResponse):
                raise TypeError(f"the model returned {type(response).__name__}, not ModelResponse")
            if response.text is not None:
                check_text(response.text, what="the model's text")
            calls = self._call_records(response, action)
        except Exception as exc:  # noqa: BLE001 - a model failure fails the turn, not the owner
            turn = self._state.active_turn
            assert turn is not None
            await self._finish(turn.turn, turn.input_id, "failed", code="model_error", error=f"{type(exc).__name__}: {exc}")
            return
        await self._commit(
            [ModelResponseRecord(self.session_id, self._now_ms(), action.turn, action.index, response.text, calls)]
        )

    def _call_records(self, response: ModelResponse, action: CallModel) -> tuple[dict[str, Any], ...]:
        seen = set(self._state.calls)
        out = []
        for pos, call in enumerate(response.tool_calls):
            call_id = check_text(call.id, what="a tool call id") if call.id else f"call-{action.turn}.{action.index}.{pos}"
            check_text(call.name, what="a tool call's name")
            if call_id in seen:  # ids must be unique in a session: make a repeated one so
                call_id = f"{call_id}~{action.turn}.{action.index}.{pos}"
            seen.add(call_id)
            out.append({"id": call_id, "name": call.name, "arguments": json_copy(call.arguments, what="tool arguments")})
        return tuple(out)

    async def _run_batch(self, action: RunBatch) -> None:
        now = self._now_ms()
        head: list[Record] = []
        for decision in action.calls:
            if decision.action == "cut":
                head.append(await self._cut_result(decision, now))
        head.extend(
            ToolStarted(self.session_id, now, d.tool_call_id, d.name, d.attempt)
            for d in action.to_start
            if not d.parked  # back to its wait: its last progress stays the wait (SPEC 7.5)
        )
        if head:
            await self._commit(head)
        if action.to_start:
            try:
                async with asyncio.TaskGroup() as group:
                    for decision in action.to_start:
                        group.create_task(self._run_call(decision))
            except BaseExceptionGroup as failed:
                # Only the log (or a bug) fails a call this way: surface the error as itself,
                # a lost ownership first, so callers can catch FencedError.
                fenced = failed.subgroup(FencedError)
                raise (fenced or failed).exceptions[0] from None

    def _event(self, decision: CallDecision) -> ToolCallEvent:
        call = self._state.calls[decision.tool_call_id]
        return ToolCallEvent(self.session_id, call.tool_call_id, call.name, call.arguments, decision.attempt)

    async def _cut_result(self, decision: CallDecision, now: int) -> ToolResult:
        outcome = error_outcome("cut", self.harness.durability.cut_call_error)
        outcome, replaced = await apply_after_hook(self.harness.hooks, self._event(decision), outcome)
        return self._tool_result(decision, outcome, replaced, now)

    def _tool_result(self, decision: CallDecision, outcome: ToolOutcome, replaced: bool, now: int) -> ToolResult:
        return ToolResult(
            self.session_id, now, decision.tool_call_id, decision.name,
            outcome.content, outcome.is_error, replaced, outcome.code,
        )

    async def _run_call(self, decision: CallDecision) -> None:
        call = self._state.calls[decision.tool_call_id]
        self._running.add(call.tool_call_id)
        try:
            scope = CallScope(
                session_id=self.session_id,
                tool_call_id=call.tool_call_id,
                log_id=self.log_id,
                attempt=decision.attempt,
                call=call,
                clock=self._clock,
                scrubber=self._scrubber,
                value_limit=self.harness.durability.step_value_limit,
                commit=self._commit,
                wait_answer=lambda name, deadline: self._wait_answer(call.tool_call_id, name, deadline),
            )
            run = await run_tool_call(
                tools=self.harness.tools,
                hooks=self.harness.hooks,
                event=self._event(decision),
                make_step=lambda: DurableStep(scope),
                secrets=self.secrets,
                scrubber=self._scrubber,
                log_id=self.log_id,
                durable=True,
            )
            now = self._now_ms()
            records: list[Record] = [
                AppRecord(self.session_id, now, str(body["type"]), body, call.tool_call_id)
                for body in (run.records if not run.outcome.is_error or run.replaced_by_hook else [])
            ]
            records.append(self._tool_result(decision, run.outcome, run.replaced_by_hook, now))
            await self._commit(records)
        finally:
            self._running.discard(call.tool_call_id)

    async def _wait_answer(self, tool_call_id: str, name: str, deadline: float | None) -> None:
        call = self._state.calls[tool_call_id]
        self._parked.add(tool_call_id)
        self._notify()
        expiry = asyncio.ensure_future(self._clock.sleep_until(deadline)) if deadline is not None else None
        try:
            while call.asks[name].answered is None:
                if expiry is not None and expiry.done():
                    raise AskExpired(
                        f"ask {name!r} expired before it was answered",
                        session_id=self.session_id, tool_call_id=tool_call_id, name=name,
                    )
                await self._next_change(*([expiry] if expiry is not None else []))
        finally:
            if expiry is not None:
                expiry.cancel()
            self._parked.discard(tool_call_id)
            self._notify()

    # -- inputs from the log -------------------------------------------------------------------

    async def _take_inputs(self) -> None:
        """Settle answers and app records that others put in the log (SPEC 7.2)."""
        pending = [i for i in self._state.pending_inputs() if i.kind != "message"]
        if not pending:
            return
        async with self._input_lock:
            for inp in pending:
                if self._state.inputs[inp.input_id].settled is None:
                    await self._settle(inp)

    async def _settle(self, inp: InputState) -> None:
        records = settle_input(self._state, inp, self._now_ms())
        if records:
            await self._commit(records)
