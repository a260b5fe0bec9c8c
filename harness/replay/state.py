"""The replay fold: a session's records -> its state.

PURE: no I/O, no clock, no asyncio. ``SessionState.apply`` takes one committed
record at a time, so the runtime keeps a live session's state current by
applying what it appends, and a new owner rebuilds it by folding the log
(``fold``). Both paths go through the same code.

Duplicates that a racing or fenced writer might have left (a second result for
one call, a second value for one step) never override the first: the first
committed record wins, and the anomaly is counted in ``anomalies``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.records import (
    AppRecord,
    AskAnswered,
    AskOpened,
    InputAnswer,
    InputCancel,
    InputMessage,
    InputRecords,
    InputSettled,
    LogEntry,
    ModelResponseRecord,
    ModelRetry,
    ModelUsage,
    Record,
    SleepScheduled,
    StepResult,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnResumed,
    TurnStarted,
)
from harness.replay.payload import record_payload

__all__ = [
    "FINAL_OUTCOMES",
    "AppEntry",
    "AskState",
    "CallState",
    "InputState",
    "SessionState",
    "TurnState",
    "UsageTotals",
    "fold",
]


FINAL_OUTCOMES = frozenset({"completed", "failed", "aborted", "rejected"})
"""Settlement outcomes that are an input's verdict for good (``SettledOutcome``). Every
outcome written today is one; a ``waiting`` exists only in views (``TurnResult``, the
gateway), never in a ``harness.input.settled`` record. An outcome outside this set (a
later version's) is not taken as final: the turn of such an input goes on."""


@dataclass(slots=True)
class InputState:
    input_id: str
    seq: int
    record: InputMessage | InputAnswer | InputRecords | InputCancel
    settled: InputSettled | None = None
    turn: int | None = None  # set when a message input started a turn

    @property
    def kind(self) -> str:
        return self.record.TYPE.rsplit(".", 1)[-1]  # message | answer | records | cancel


@dataclass(frozen=True, slots=True)
class AppEntry:
    """An app record that landed: its body, where it came from, its position."""

    seq: int
    body: dict[str, Any]
    tool_call_id: str | None = None
    input_id: str | None = None

    @property
    def type(self) -> str:
        return str(self.body.get("type"))


@dataclass(slots=True)
class AskState:
    opened: AskOpened
    answered: AskAnswered | None = None
    answered_seq: int = -1


@dataclass(slots=True)
class CallState:
    tool_call_id: str
    name: str
    arguments: Any
    turn: int
    response_index: int
    position: int  # index in its model response's batch
    attempts: int = 0  # how many harness.tool.started records
    steps: dict[str, Any] = field(default_factory=dict)
    sleeps: dict[str, int] = field(default_factory=dict)
    asks: dict[str, AskState] = field(default_factory=dict)
    result: ToolResult | None = None
    progress_seq: int = -1  # last tool.started / step / sleep / ask.opened of the call
    progress: tuple[str, str] = ("", "")  # what that was: ("started" | "step" | "sleep" | "ask", name)
    staged: list[AppEntry] = field(default_factory=list)  # app records waiting for the result

    @property
    def finished(self) -> bool:
        return self.result is not None

    def progressed(self, seq: int, kind: str, name: str = "") -> None:
        """Record a progress record of the call (folded in any order: the last one wins)."""
        if seq >= self.progress_seq:
            self.progress_seq = seq
            self.progress = (kind, name)

    def waiting_for_person(self) -> bool:
        """The call stopped at an ask: it is open, or its answer came after the call's
        last progress (answered while no one ran the call, not yet taken up)."""
        return any(a.answered is None or a.answered_seq > self.progress_seq for a in self.asks.values())


@dataclass(slots=True)
class UsageTotals:
    """What a session's completed model calls used (the sum of its harness.model.usage)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None  # the sum of the known costs; None if no call reported one

    def add(self, r: ModelUsage) -> None:
        self.calls += 1
        self.input_tokens += r.input_tokens
        self.output_tokens += r.output_tokens
        if r.cost is not None:
            self.cost = (self.cost or 0.0) + r.cost


@dataclass(slots=True)
class TurnState:
    input_id: str
    turn: int
    attempts: int = 1  # 1 + the harness.turn.resumed records that counted (SPEC 7.5)
    started_ts: int = 0  # when the turn first started (ms), for Durability.timeout
    responses: list[ModelResponseRecord] = field(default_factory=list)
    finished: TurnFinished | None = None
    retries: dict[int, ModelRetry] = field(default_factory=dict)  # model call index -> its latest retry

    @property
    def last_response(self) -> ModelResponseRecord | None:
        return self.responses[-1] if self.responses else None


@dataclass(slots=True)
class SessionState:
    """Everything the log says about one session."""

    session_id: str
    harness: str | None = None
    last_seq: int = -1
    inputs: dict[str, InputState] = field(default_factory=dict)
    turns: list[TurnState] = field(default_factory=list)
    calls: dict[str, CallState] = field(default_factory=dict)
    app_records: list[AppEntry] = field(default_factory=list)
    usage: UsageTotals = field(default_factory=UsageTotals)
    conflicts: dict[int, InputState] = field(default_factory=dict)
    """Later records reusing an input id with another payload, by position; the owner
    settles each ``rejected`` / ``input_conflict`` (its ``input_seq`` names it)."""
    cancels: dict[str, list[str]] = field(default_factory=dict)
    """Target input id -> ids of the cancel inputs asking for it, not yet settled."""
    anomalies: int = 0
    read_upto: int = field(default=-1, compare=False)
    _ahead: set[int] = field(default_factory=set, repr=False, compare=False)

    # -- queries --------------------------------------------------------------------

    @property
    def active_turn(self) -> TurnState | None:
        """The unfinished turn, if any (there is at most one)."""
        if self.turns and self.turns[-1].finished is None:
            return self.turns[-1]
        return None

    def turn_of(self, input_id: str) -> TurnState | None:
        inp = self.inputs.get(input_id)
        if inp is None or inp.turn is None:
            return None
        return self.turns[inp.turn - 1]

    def final_settlement(self, turn: TurnState) -> InputSettled | None:
        """The final verdict already logged for ``turn``'s input, if any. An unfinished
        turn with one is left over, never legitimately open: an older version settled a
        cancel of an input whose turn was being started and let the turn run on, and the
        owner of a parked session settles its running turn's input ``failed`` (its turn
        ends, running nothing more, once the session is driven again: ``plan_turn``)."""
        inp = self.inputs.get(turn.input_id)
        settled = inp.settled if inp is not None else None
        return settled if settled is not None and settled.outcome in FINAL_OUTCOMES else None

    def batch(self, response: ModelResponseRecord) -> list[CallState]:
        """The calls of one model response, in call order."""
        return [self.calls[c["id"]] for c in response.tool_calls if c["id"] in self.calls]

    def pending_inputs(self) -> list[InputState]:
        """Inputs not yet settled (and, for messages, not yet started), in log order."""
        pending = [i for i in self.inputs.values() if i.settled is None and i.turn is None]
        return sorted(pending, key=lambda i: i.seq)  # folded out of order, taken in log order

    def pending_conflicts(self) -> list[InputState]:
        """Conflicting reuses of input ids not yet settled, in log order."""
        return sorted((c for c in self.conflicts.values() if c.settled is None), key=lambda c: c.seq)

    @property
    def ended(self) -> bool:
        """Nothing left to do: no active turn and no input waiting."""
        return self.active_turn is None and not self.pending_inputs() and not self.pending_conflicts()

    # -- the fold -------------------------------------------------------------------

    def apply(self, seq: int, record: Record) -> None:
        """Fold one committed record into the state; a record already folded is ignored.

        Records may arrive out of log order: an owner folds its own appends at
        once, then reads back the log, where another writer's input may sit
        before them. Positions up to ``read_upto`` (the log was read that far)
        and the positions in ``_ahead`` (folded beyond it) are known.
        """
        if seq <= self.read_upto or seq in self._ahead:  # (folded(seq), inline: a hot path)
            return
        self._ahead.add(seq)
        self.last_seq = max(self.last_seq, seq)
        handler = _HANDLERS.get(type(record))
        if handler is not None:
            handler(self, seq, record)

    def apply_entry(self, entry: LogEntry) -> None:
        self.apply(entry.seq, entry.record)

    def folded(self, seq: int) -> bool:
        """Whether the record at ``seq`` is folded already (``apply`` would skip it): an
        owner's own appends, read back, need not even be decoded again."""
        return seq <= self.read_upto or seq in self._ahead

    def mark_read(self, upto: int) -> None:
        """The log was read up to position ``upto``: every record at or below it is folded."""
        if upto > self.read_upto:
            self.read_upto = upto
            self._ahead = {s for s in self._ahead if s > upto}


def fold(session_id: str, entries: Iterable[LogEntry]) -> SessionState:
    """Rebuild a session's state from its committed records, in log order."""
    state = SessionState(session_id=session_id)
    for entry in entries:
        state.apply(entry.seq, entry.record)
    state.mark_read(state.last_seq)
    return state


# -- handlers, one per record type -------------------------------------------------------


def _input(state: SessionState, seq: int, r: Any) -> None:
    first = state.inputs.get(r.input_id)
    if first is not None:
        if record_payload(first.record) == record_payload(r):
            state.anomalies += 1  # a resent input: the first one counts (SPEC 7.2)
        else:  # the same id with another payload: refused (settled by the owner)
            state.conflicts[seq] = InputState(input_id=r.input_id, seq=seq, record=r)
        return
    state.inputs[r.input_id] = InputState(input_id=r.input_id, seq=seq, record=r)
    if isinstance(r, InputMessage) and r.harness and state.harness is None:
        state.harness = r.harness
    if isinstance(r, InputCancel):
        state.cancels.setdefault(r.target_input_id, []).append(r.input_id)


def _settled(state: SessionState, seq: int, r: InputSettled) -> None:
    inp = state.inputs.get(r.input_id)
    if r.input_seq is not None and inp is not None and r.input_seq != inp.seq:
        conflict = state.conflicts.get(r.input_seq)
        if conflict is None or conflict.input_id != r.input_id or conflict.settled is not None:
            state.anomalies += 1
        else:
            conflict.settled = r
        return
    if inp is None or inp.settled is not None:
        state.anomalies += 1
        return
    inp.settled = r
    if isinstance(inp.record, InputCancel):
        waiting = state.cancels.get(inp.record.target_input_id, [])
        if r.input_id in waiting:
            waiting.remove(r.input_id)
        if not waiting:
            state.cancels.pop(inp.record.target_input_id, None)
    # App records sent from outside land when their input settles completed.
    if r.outcome == "completed" and isinstance(inp.record, InputRecords):
        for body in inp.record.records or ():
            state.app_records.append(AppEntry(seq, body, input_id=r.input_id))


def _turn_started(state: SessionState, seq: int, r: TurnStarted) -> None:
    inp = state.inputs.get(r.input_id)
    if inp is None or inp.turn is not None or r.turn != len(state.turns) + 1:
        state.anomalies += 1
        return
    inp.turn = r.turn
    state.turns.append(TurnState(input_id=r.input_id, turn=r.turn, started_ts=r.ts))


def _turn(state: SessionState, n: int) -> TurnState | None:
    return state.turns[n - 1] if 0 < n <= len(state.turns) else None


def _turn_resumed(state: SessionState, seq: int, r: TurnResumed) -> None:
    turn = _turn(state, r.turn)
    if turn is None or turn.finished is not None:
        state.anomalies += 1
        return
    if r.counted:  # a parked turn's takeover uses no attempt (SPEC 7.5)
        turn.attempts = max(turn.attempts, r.attempt)


def _turn_finished(state: SessionState, seq: int, r: TurnFinished) -> None:
    turn = _turn(state, r.turn)
    if turn is None or turn.finished is not None:
        state.anomalies += 1
        return
    turn.finished = r


def _model_response(state: SessionState, seq: int, r: ModelResponseRecord) -> None:
    turn = _turn(state, r.turn)
    if turn is None or turn.finished is not None or r.index != len(turn.responses):
        state.anomalies += 1
        return
    turn.responses.append(r)
    for position, call in enumerate(r.tool_calls):
        if call["id"] in state.calls:
            state.anomalies += 1
            continue
        state.calls[call["id"]] = CallState(
            tool_call_id=call["id"],
            name=call["name"],
            arguments=call.get("arguments"),
            turn=r.turn,
            response_index=r.index,
            position=position,
        )


def _model_usage(state: SessionState, seq: int, r: ModelUsage) -> None:
    state.usage.add(r)  # every completed call cost what it cost, in whichever turn


def _model_retry(state: SessionState, seq: int, r: ModelRetry) -> None:
    turn = _turn(state, r.turn)
    if turn is None or turn.finished is not None or r.index != len(turn.responses):
        state.anomalies += 1  # a retry of a call that already has its response
        return
    last = turn.retries.get(r.index)
    if last is None or r.retry > last.retry:
        turn.retries[r.index] = r


def _call(state: SessionState, tool_call_id: str) -> CallState | None:
    call = state.calls.get(tool_call_id)
    if call is None:
        state.anomalies += 1
    return call


def _tool_started(state: SessionState, seq: int, r: ToolStarted) -> None:
    call = _call(state, r.tool_call_id)
    if call is not None:
        call.attempts = max(call.attempts + 1, r.attempt)
        call.progressed(seq, "started")


def _step_result(state: SessionState, seq: int, r: StepResult) -> None:
    call = _call(state, r.tool_call_id)
    if call is None:
        return
    if r.name in call.steps:
        state.anomalies += 1  # first committed value wins
        return
    call.steps[r.name] = r.value
    call.progressed(seq, "step", r.name)


def _sleep(state: SessionState, seq: int, r: SleepScheduled) -> None:
    call = _call(state, r.tool_call_id)
    if call is not None:
        call.sleeps.setdefault(r.name, r.wake_at)
        call.progressed(seq, "sleep", r.name)


def _ask_opened(state: SessionState, seq: int, r: AskOpened) -> None:
    call = _call(state, r.tool_call_id)
    if call is not None and r.name not in call.asks:
        call.asks[r.name] = AskState(opened=r)
        call.progressed(seq, "ask", r.name)


def _ask_answered(state: SessionState, seq: int, r: AskAnswered) -> None:
    call = _call(state, r.tool_call_id)
    if call is None:
        return
    ask = call.asks.get(r.name)
    if ask is None or ask.answered is not None:
        state.anomalies += 1
        return
    ask.answered = r
    ask.answered_seq = seq


def _tool_result(state: SessionState, seq: int, r: ToolResult) -> None:
    call = _call(state, r.tool_call_id)
    if call is None:
        return
    if call.result is not None:
        state.anomalies += 1  # never two results for one call: the first stands
        call.staged.clear()
        return
    call.result = r
    # A tool's app records land with its (first) result: they were appended in the
    # same atomic batch, right before it (SPEC 4.1).
    state.app_records.extend(call.staged)
    call.staged.clear()


def _app_record(state: SessionState, seq: int, r: AppRecord) -> None:
    entry = AppEntry(seq, r.body, tool_call_id=r.tool_call_id, input_id=r.input_id)
    if r.tool_call_id is None:
        state.app_records.append(entry)
        return
    call = _call(state, r.tool_call_id)
    if call is None:
        return
    if call.result is not None:
        state.anomalies += 1  # staged by a second run of a finished call: never lands
        return
    call.staged.append(entry)


_HANDLERS: dict[type, Any] = {
    InputMessage: _input,
    InputAnswer: _input,
    InputRecords: _input,
    InputCancel: _input,
    InputSettled: _settled,
    TurnStarted: _turn_started,
    TurnResumed: _turn_resumed,
    TurnFinished: _turn_finished,
    ModelResponseRecord: _model_response,
    ModelUsage: _model_usage,
    ModelRetry: _model_retry,
    ToolStarted: _tool_started,
    StepResult: _step_result,
    SleepScheduled: _sleep,
    AskOpened: _ask_opened,
    AskAnswered: _ask_answered,
    ToolResult: _tool_result,
    AppRecord: _app_record,
}
