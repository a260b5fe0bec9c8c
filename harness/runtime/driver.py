"""The turn driver: asks the pure planner what to do next and does it.

One driver per session core. After every step it asks ``plan_turn`` (``harness.replay``)
for the single next action of the active turn and carries it out: call the model, log
its response, run a batch of tool calls concurrently, finish the turn. A first run and
a run after a crash take the same path: the planner only looks at the folded log.

A model call or a batch runs as a task that two things may stop at its next boundary
(nothing more is started; running tools are cancelled the recoverable way, writing
nothing): a cancel input for the turn's input (the turn settles ``aborted``), and
``Durability.timeout`` measured from the turn's first start (``failed``, ``timeout``).

A hand-over drains the driver first (``drain``): nothing new starts, a model answer that
comes in is logged without starting its calls, a ``replay="safe"`` call stops before its
next step and a call in an ask or a sleep counts as stopped (``quiet``); see
docs/architecture.md, "Hand-over drain".

Fewer sequential commits per turn (docs/architecture.md, "Fewer commits per turn"):
the first model call of a turn runs beside its ``harness.turn.started``, which rides in
the answer's append when the answer comes within ``turn_start.RIDE_S``; a model
response with tool calls is logged with their ``harness.tool.started`` records in one
append (``first_runs``) and the batch runs right after it; a final answer is logged
with ``harness.turn.finished`` and its input's ``harness.input.settled``.

A turn whose input already has its verdict (a log of an older version, a repaired parked
session) is closed with its ``harness.turn.finished`` alone (``CloseSettledTurn``):
not taken over, nothing of it run, its input not settled twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

from pydantic import BaseModel

from harness import logs
from harness.clock import Clock
from harness.definition import Harness, ToolCallEvent, ToolOutcome
from harness.errors import AskExpired, FencedError, RecordTooLarge
from harness.live import LiveEvent
from harness.observability import metrics
from harness.records import (
    AppRecord,
    InputSettled,
    ModelResponseRecord,
    ModelUsage,
    Record,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnResumed,
    TurnStarted,
)
from harness.replay import (
    CLOSED_CODE,
    AbortTurn,
    CallDecision,
    CallModel,
    CloseSettledTurn,
    CompleteTurn,
    FailTurn,
    RunBatch,
    SessionState,
    first_runs,
    is_parked,
    plan_turn,
)
from harness.runtime.execute import apply_after_hook, error_outcome, run_tool_call
from harness.runtime.model_call import call_model
from harness.runtime.turn_lines import TurnLines
from harness.runtime.turn_start import TurnStart
from harness.secrets import SecretScrubber
from harness.step import CallScope, DurableStep

__all__ = ["DriverCore", "TurnDriver"]

log = logging.getLogger("harness.session")
TURN_LINES = TurnLines(log)
"""This process's per-turn lines, sampled past ``turn_lines.RATE`` a second."""


class DriverCore(Protocol):
    """What the driver needs from its session core (``SessionCore``)."""

    session_id: str
    harness: Harness
    log_id: str
    secrets: Mapping[str, str]
    scrubber: SecretScrubber
    clock: Clock
    state: SessionState
    ask_models: dict[tuple[str, str], type[BaseModel]]

    def now_ms(self) -> int: ...

    async def commit(self, records: list[Record]) -> None: ...

    async def take_inputs(self) -> None: ...

    async def ensure_owner(self) -> None: ...

    def notify(self) -> None: ...

    async def next_change(self, *others: asyncio.Future[Any]) -> None: ...

    def check_name(self, kind: str, name: str) -> None: ...

    def publish_live(self, event: LiveEvent) -> None: ...

    @property
    def host(self) -> Any: ...


class TurnDriver:
    def __init__(self, core: DriverCore) -> None:
        self.core = core
        self.running: set[str] = set()
        self.parked: set[str] = set()  # running calls waiting for an answer
        self.waiting: set[str] = set()  # running calls in a durable wait (an ask or a sleep)
        self.draining = False  # start nothing new: see ``drain``
        self._own_turns: set[int] = set()  # turns this core started or took over
        # The input whose turn is being started: its harness.turn.started rides with the
        # first model call, so the log (and the state) show no turn for it yet. A cancel of
        # it that comes meanwhile is the turn's to stop (core.take_inputs leaves it), not a
        # queued input's: settled "aborted" as queued, the turn then started anyway and ran
        # on, its input settled and its tools running (a soak found such turns parked on
        # an ask for good, taking each later message of their session behind them).
        self.starting: str | None = None
        self._work: asyncio.Task[None] | None = None
        self._stop: str | None = None  # why the work in progress was stopped

    # -- the loop ------------------------------------------------------------------------

    def drain(self) -> None:
        """Start nothing new from now on: no turn, no model call, no tool call (a model
        answer that comes in is logged without starting its calls); what runs goes on
        to its end. ``quiet`` says when only durable waits are left."""
        self.draining = True

    @property
    def quiet(self) -> bool:
        """Draining, every running call is in a durable wait (an ask, a sleep): stopping
        now loses nothing (its next owner resumes the wait, no attempt used)."""
        return bool(self.running) and self.running <= self.waiting

    async def drive(self) -> None:
        core = self.core
        while True:
            if self.draining:
                return
            await core.ensure_owner()  # decisions below are made on everything in the log
            state = core.state
            turn = state.active_turn
            if turn is not None and turn.turn not in self._own_turns and state.final_settlement(turn) is None:
                # (a turn whose input has its verdict already is closed below, not resumed)
                # Taking over a turn another owner left unfinished, judged on the log as
                # found (before this owner takes new inputs): it uses an attempt only if
                # work may have been running (SPEC 7.5).
                now = core.now_ms()
                counted = not is_parked(state, now)
                attempt = turn.attempts + 1 if counted else turn.attempts
                await core.commit([TurnResumed(core.session_id, now, turn.input_id, turn.turn, attempt, counted)])
                self._own_turns.add(turn.turn)
                if counted:
                    metrics.turn_attempt(core.harness.name)
                logs.bind(input_id=turn.input_id)
                # A counted takeover (work may have been cut) is always told; a parked one is
                # routine (every session waiting on an ask or a sleep, at every restart or
                # partition move): a turn line, sampled, or a restart with thousands of
                # waiting sessions floods the log with one line each.
                TURN_LINES.line(
                    "took over turn %d of session %s (attempt %d%s)", turn.turn, core.session_id, attempt,
                    "" if counted else ", parked: no attempt used", always=counted,
                )
                continue
            await core.take_inputs()
            turn = state.active_turn
            if turn is None:
                nxt = next((i for i in state.pending_inputs() if i.kind == "message"), None)
                if nxt is None:
                    return
                await self._start_turn(nxt.input_id, len(state.turns) + 1)
                continue
            action = plan_turn(
                state,
                core.harness.policies,
                max_attempts=core.harness.durability.max_attempts,
                now_ms=core.now_ms(),
                timeout_ms=self._timeout_ms(),
            )
            if action is None:
                continue
            if isinstance(action, (CallModel, RunBatch)):
                await self._stoppable(turn.started_ts, self._do(action))
            else:
                await self._do(action)

    async def _start_turn(self, input_id: str, n: int) -> None:
        """Start turn ``n`` for the message ``input_id``: its first model call runs beside
        its ``harness.turn.started`` (what the planner answers for a turn just started is
        that call: ``CallModel(n, 0)``). An answer within ``RIDE_S`` is appended with the
        start; a later one waits for the start's own append. So the log never holds a
        response of a turn it does not hold; a crash during the call once the start
        committed is a takeover that counts (SPEC 7.5)."""
        core = self.core
        now = core.now_ms()
        self._own_turns.add(n)
        logs.bind(input_id=input_id)
        start = TurnStart([TurnStarted(core.session_id, now, input_id, n)], core.commit)
        started = start.done
        started.add_done_callback(lambda done: self._turn_started(done, n, input_id))
        self.starting = input_id
        try:
            await self._stoppable(now, self._call_model(CallModel(n, 0), starting=(input_id, start)))
        finally:
            if not started.done():  # stopped early: go on only once the start is settled
                start.alone()  # (in the log), so a turn is never started twice
                await asyncio.wait([started])
            self.starting = None
        started.result()  # its failure, if the call did not raise it already

    def _turn_started(self, done: asyncio.Future[None], n: int, input_id: str) -> None:
        if done.cancelled() or done.exception() is not None:
            # (a claim refused with SessionBusy starts nothing: a later try takes the
            # turn as the log then shows it, maybe started by another owner)
            self._own_turns.discard(n)
            return
        TURN_LINES.line("turn %d of session %s started (input %s)", n, self.core.session_id, input_id)

    def _timeout_ms(self) -> int | None:
        timeout = self.core.harness.durability.timeout
        return None if timeout is None else round(timeout.total_seconds() * 1000)

    # -- stopping at the next boundary -----------------------------------------------------

    def check_interrupt(self) -> None:
        """Stop the work in progress if a cancel input now asks for the active turn."""
        work = self._work
        turn = self.core.state.active_turn
        if work is not None and not work.done() and turn is not None and self.core.state.cancels.get(turn.input_id):
            self._stop = "cancelled"
            work.cancel()

    async def _stoppable(self, started_ts: int, action: Awaitable[None]) -> None:
        """Run ``action`` (a model call or a batch of the turn that started at ``started_ts``)
        so that a cancel input or the turn's deadline stops it at its next boundary."""
        work = asyncio.ensure_future(action)
        self._work, self._stop = work, None
        deadline: asyncio.Future[None] | None = None
        timeout = self._timeout_ms()
        if timeout is not None:
            deadline = asyncio.ensure_future(self.core.clock.sleep_until((started_ts + timeout) / 1000))
            deadline.add_done_callback(lambda d: self._on_deadline(d, work))
        self.check_interrupt()
        try:
            await asyncio.wait([work])
        except BaseException:
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
            raise
        finally:
            self._work = None
            if deadline is not None:
                deadline.cancel()
        if work.cancelled():
            if self._stop is None:
                raise asyncio.CancelledError()
            return  # the planner decides what the stop means (aborted, timeout)
        work.result()  # re-raise a failure of the work itself

    def _on_deadline(self, deadline: asyncio.Future[None], work: asyncio.Future[None]) -> None:
        if not deadline.cancelled() and not work.done():
            self._stop = "timeout"
            work.cancel()

    # -- actions -----------------------------------------------------------------------------

    async def _do(self, action: CallModel | RunBatch | CompleteTurn | FailTurn | AbortTurn | CloseSettledTurn) -> None:
        core = self.core
        turn = core.state.active_turn
        assert turn is not None
        if isinstance(action, CompleteTurn):
            await self._finish(turn.turn, turn.input_id, "completed", text=action.text)
        elif isinstance(action, FailTurn):
            await self._finish(turn.turn, turn.input_id, "failed", code=action.code, error=action.error)
        elif isinstance(action, AbortTurn):
            now = core.now_ms()
            await self._finish(
                turn.turn, turn.input_id, "aborted", code="cancelled", error="the input was cancelled",
                extra=[InputSettled(core.session_id, now, cid, "completed") for cid in action.cancel_input_ids],
            )
        elif isinstance(action, CloseSettledTurn):
            # Only the turn's end: its input keeps the verdict it has (its sender has it).
            now = core.now_ms()
            await core.commit([TurnFinished(core.session_id, now, turn.input_id, turn.turn, "aborted",
                                            None, CLOSED_CODE, action.error)])
            self._ended(turn.turn, turn.input_id, "aborted", CLOSED_CODE, action.error, settled=False)
        elif isinstance(action, CallModel):
            if action.index >= core.harness.durability.max_model_calls:
                await self._finish(
                    turn.turn, turn.input_id, "failed", code="too_many_model_calls",
                    error=f"the turn called the model {action.index} times",
                )
                return
            await self._call_model(action)
        else:
            await self._run_batch(action)

    async def _finish(self, turn: int, input_id: str, outcome: str, *, text: str | None = None,
                      code: str | None = None, error: str | None = None, extra: list[Record] | None = None) -> None:
        await self.core.commit(self._end_records(turn, input_id, outcome, text, code, error, extra))
        self._ended(turn, input_id, outcome, code, error)

    def _end_records(self, turn: int, input_id: str, outcome: str, text: str | None = None,
                     code: str | None = None, error: str | None = None, extra: list[Record] | None = None) -> list[Record]:
        core = self.core
        now = core.now_ms()
        return [
            TurnFinished(core.session_id, now, input_id, turn, outcome, text, code, error),
            InputSettled(core.session_id, now, input_id, outcome, code, error),
            *(extra or []),
        ]

    def _ended(self, turn: int, input_id: str, outcome: str, code: str | None = None, error: str | None = None,
               *, settled: bool = True) -> None:
        core = self.core
        metrics.turn(core.harness.name, outcome, code)
        TURN_LINES.line(
            "turn %d of session %s %s; input %s %s%s", turn, core.session_id, outcome, input_id,
            "settled" if settled else "was settled before",
            core.scrubber.redact_text(f" ({code}: {error})") if code else "",
            always=outcome != "completed",  # (what did not complete is always told)
        )

    async def _call_model(self, action: CallModel, starting: tuple[str, TurnStart] | None = None) -> None:
        """One try of the model call, logged (streaming, retries, usage, the argument
        rule: ``runtime/model_call.py``), with what rides along in its append: the
        batch's ``harness.tool.started`` records (then the batch runs at once), or the
        end of the turn after a final answer. ``starting``: the turn's input id and its
        ``harness.turn.started``, not in the log yet (see ``_start_turn``)."""
        core = self.core
        if starting is None:
            turn = core.state.active_turn
            assert turn is not None
            input_id = turn.input_id
        else:
            input_id = starting[0]
        batch: list[CallDecision] = []
        final: list[bool] = []
        used: list[Record] = []

        async def fail(code: str, error: str, first: list[Record] | None = None) -> None:
            # ``first``: the usage of an answer that cannot be logged, before the turn's end
            await core.commit([*(first or ()), *self._end_records(action.turn, input_id, "failed", None, code, error)])
            self._ended(action.turn, input_id, "failed", code, error)

        def along(records: list[Record]) -> list[Record]:
            response = records[0]
            assert isinstance(response, ModelResponseRecord)
            used.extend(r for r in records if isinstance(r, ModelUsage))
            if not response.tool_calls:  # the final answer wins whatever comes (SPEC 7.5): end the turn
                final.append(True)
                return self._end_records(action.turn, input_id, "completed", response.text)
            if self.draining:
                # Handing the partition over: the answer is logged, its calls start at
                # the next owner (what the planner makes of a response whose calls have
                # no harness.tool.started yet: their first runs).
                return []
            refused = {r.tool_call_id for r in records if isinstance(r, ToolResult)}
            batch.extend(first_runs(response, refused))
            return [ToolStarted(core.session_id, response.ts, d.tool_call_id, d.name, d.attempt) for d in batch]

        try:
            await call_model(
                action, harness=core.harness, state=core.state, session_id=core.session_id,
                secrets=core.secrets, scrubber=core.scrubber, clock=core.clock,
                commit=core.commit, fail=fail, publish=core.publish_live, check_name=core.check_name,
                starting=starting[0] if starting is not None else None,
                start=starting[1] if starting is not None else None,
                along=along,
            )
        except RecordTooLarge as exc:
            # The answer's append wrote nothing, and asking again would get as much: the
            # turn fails (its calls never started: their tool.started was in that append).
            # The answer's usage is logged with the failure: the provider was paid for it.
            final.clear()
            batch.clear()
            log.warning("session %s: %s", core.session_id, exc)
            await fail("record_too_large", exc.explained(
                "the model's answer", "ask for shorter answers (the model's output token limit)"
            ), used)
            return
        if final:
            self._ended(action.turn, input_id, "completed")
        elif batch:
            await self._run_calls(batch)  # logged as started in the response's append

    async def _run_batch(self, action: RunBatch) -> None:
        core = self.core
        now = core.now_ms()
        head: list[Record] = []
        for decision in action.calls:
            if decision.action in ("cut", "truncated"):
                head.append(await self._cut_result(decision, now))
        head.extend(
            ToolStarted(core.session_id, now, d.tool_call_id, d.name, d.attempt)
            for d in action.to_start
            if not d.parked  # back to its wait: its last progress stays the wait (SPEC 7.5)
        )
        if head:
            await core.commit(head)
        await self._run_calls(action.to_start)

    async def _run_calls(self, decisions: tuple[CallDecision, ...] | list[CallDecision]) -> None:
        """Run the calls concurrently (their ``harness.tool.started`` is in the log)."""
        if decisions:
            try:
                async with asyncio.TaskGroup() as group:
                    for decision in decisions:
                        group.create_task(self._run_call(decision))
            except BaseExceptionGroup as failed:
                # Only the log (or a bug) fails a call this way: surface the error as itself,
                # a lost ownership first, so callers can catch FencedError.
                fenced = failed.subgroup(FencedError)
                raise (fenced or failed).exceptions[0] from None

    def _event(self, decision: CallDecision) -> ToolCallEvent:
        call = self.core.state.calls[decision.tool_call_id]
        return ToolCallEvent(self.core.session_id, call.tool_call_id, call.name, call.arguments, decision.attempt)

    async def _cut_result(self, decision: CallDecision, now: int) -> ToolResult:
        core = self.core
        if decision.action == "truncated":  # its response was cut at the output limit: never run
            outcome = error_outcome("truncated", core.harness.durability.truncated_call_error)
        else:
            outcome = error_outcome("cut", core.harness.durability.cut_call_error)
        outcome, replaced = await apply_after_hook(core.harness.hooks, self._event(decision), outcome)
        metrics.tool_call(core.harness.name, decision.name, "cut" if decision.action == "cut" else "rejected")
        return self._tool_result(decision, outcome, replaced, now)

    def _tool_result(self, decision: CallDecision, outcome: ToolOutcome, replaced: bool, now: int) -> ToolResult:
        return ToolResult(
            self.core.session_id, now, decision.tool_call_id, decision.name,
            outcome.content, outcome.is_error, replaced, outcome.code,
        )

    async def _run_call(self, decision: CallDecision) -> None:
        core = self.core
        call = core.state.calls[decision.tool_call_id]
        logs.bind(tool_call_id=call.tool_call_id)  # this call's own task
        self.running.add(call.tool_call_id)
        try:
            scope = CallScope(
                session_id=core.session_id,
                tool_call_id=call.tool_call_id,
                log_id=core.log_id,
                attempt=decision.attempt,
                call=call,
                clock=core.clock,
                scrubber=core.scrubber,
                value_limit=core.harness.durability.step_value_limit,
                commit=core.commit,
                wait_answer=lambda name, deadline: self._wait_answer(call.tool_call_id, name, deadline),
                run_sync=core.host.run_sync,
                ask_models=core.ask_models,
                harness_name=core.harness.name,
                on_wait=lambda waiting: self._waiting(call.tool_call_id, waiting),
                at_boundary=functools.partial(self._at_boundary, call.tool_call_id)
                if self._may_stop_between_steps(call.name)
                else None,
            )
            run = await run_tool_call(
                tools=core.harness.tools,
                hooks=core.harness.hooks,
                event=self._event(decision),
                make_step=lambda: DurableStep(scope),
                secrets=core.secrets,
                scrubber=core.scrubber,
                log_id=core.log_id,
                durable=True,
                run_sync=core.host.run_sync,
            )
            now = core.now_ms()
            records: list[Record] = [
                AppRecord(core.session_id, now, str(body["type"]), body, call.tool_call_id)
                for body in (run.records if not run.outcome.is_error or run.replaced_by_hook else [])
            ]
            records.append(self._tool_result(decision, run.outcome, run.replaced_by_hook, now))
            outcome = run.outcome
            try:
                await core.commit(records)
            except RecordTooLarge as exc:
                # The result (and its app records) wrote nothing; running the call again
                # would return as much: the call ends with this error instead, once.
                log.warning("session %s: %s", core.session_id, exc)
                what = "the tool's result with its app records" if len(records) > 1 else "the tool's result"
                outcome = error_outcome("result_too_large", exc.explained(what))
                await core.commit([self._tool_result(decision, outcome, False, now)])
            metrics.tool_call(core.harness.name, decision.name, _tool_outcome(outcome))
        finally:
            self.running.discard(call.tool_call_id)

    async def _wait_answer(self, tool_call_id: str, name: str, deadline: float | None) -> None:
        core = self.core
        call = core.state.calls[tool_call_id]
        self.parked.add(tool_call_id)
        self.waiting.add(tool_call_id)
        core.notify()
        expiry = asyncio.ensure_future(core.clock.sleep_until(deadline)) if deadline is not None else None
        try:
            while call.asks[name].answered is None:
                if expiry is not None and expiry.done():
                    raise AskExpired(
                        f"ask {name!r} expired before it was answered",
                        session_id=core.session_id, tool_call_id=tool_call_id, name=name,
                    )
                await core.next_change(*([expiry] if expiry is not None else []))
        finally:
            if expiry is not None:
                expiry.cancel()
            self.parked.discard(tool_call_id)
            self.waiting.discard(tool_call_id)
            core.notify()

    def _may_stop_between_steps(self, tool_name: str) -> bool:
        """A ``replay="safe"`` call: run again from the log, it replays its finished steps,
        so a hand-over may stop it before its next step (a ``never`` call runs to its end)."""
        tool = self.core.harness.tools.get(tool_name)
        return tool is not None and tool.replay == "safe"

    def _at_boundary(self, tool_call_id: str) -> Awaitable[None] | None:
        if not self.draining:
            return None
        self.waiting.add(tool_call_id)  # quiet from here: the drain's close cancels it
        return asyncio.get_running_loop().create_future()

    def _waiting(self, tool_call_id: str, waiting: bool) -> None:
        if waiting:
            self.waiting.add(tool_call_id)
        else:
            self.waiting.discard(tool_call_id)


_REJECTED_CODES = frozenset({"unknown_tool", "invalid_arguments", "secret_in_arguments"})


def _tool_outcome(outcome: ToolOutcome) -> str:
    """The ``harness_tool_calls_total`` outcome of a call that was run (or refused at once)."""
    if not outcome.is_error:
        return "ok"
    return "rejected" if outcome.code in _REJECTED_CODES else "error"
