"""The recovery planner: a session's state -> what the owner does next.

PURE: no I/O. The runtime asks ``plan_turn`` after every step of a turn, live or
after a crash, and carries out the single action it gets back; so a first run
and a run after a crash take the same path, and the cut-batch rules of SPEC
section 5 live here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from harness.records import InputSettled, ModelResponseRecord
from harness.replay.state import FINAL_OUTCOMES, CallState, SessionState, TurnState

__all__ = [
    "CLOSED_CODE",
    "UNREADABLE_CODE",
    "AbortTurn",
    "CallDecision",
    "CallModel",
    "CloseSettledTurn",
    "CompleteTurn",
    "FailTurn",
    "RunBatch",
    "ToolPolicy",
    "TurnAction",
    "decide_call",
    "first_runs",
    "is_parked",
    "parked_settlements",
    "plan_turn",
]

CLOSED_CODE = "input_already_settled"
"""The ``harness.turn.finished`` code of a turn closed because its input had its verdict
already (``CloseSettledTurn``)."""
UNREADABLE_CODE = "session_unreadable"
"""The settlement code of the inputs of a session parked on an unreadable record."""


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """What recovery may do with a cut call of one tool."""

    replay: Literal["safe", "never"] = "never"
    agent: bool = False  # a tool that runs another harness (SPEC 5.4)


@dataclass(frozen=True, slots=True)
class CallDecision:
    """One call of a batch.

    ``action``:
      * ``keep``  - it has its result (SPEC 5.1);
      * ``run``   - it never started: run it as a first run;
      * ``rerun`` - run it again; finished steps return stored values (SPEC 5.2, 5.4);
      * ``cut``   - do not run; the model gets the cut-call tool error (SPEC 5.3, 5.4);
      * ``truncated`` - never run: its response was cut at the model's output limit
        (``finish_reason="length"``), so its arguments may be cut too; the model gets
        a tool error saying so and is called again, whatever the tool's replay policy.
    """

    tool_call_id: str
    name: str
    action: Literal["keep", "run", "rerun", "cut", "truncated"]
    attempt: int  # the attempt number a run would get (1 for a first run)
    parked: bool = False
    """A rerun of a call parked at an open ask or a sleep not yet due: it goes back to
    its wait without a new ``harness.tool.started``, so its last progress stays the
    wait and a later takeover still sees it parked (SPEC 7.5)."""


@dataclass(frozen=True, slots=True)
class CallModel:
    turn: int
    index: int  # the index the next model response will have in the turn
    retries: int = 0  # transient failures of this call so far (its harness.model.retry records)
    not_before: int | None = None  # ms since the epoch: the logged backoff runs until then


@dataclass(frozen=True, slots=True)
class RunBatch:
    turn: int
    response_index: int
    calls: tuple[CallDecision, ...]

    @property
    def to_start(self) -> tuple[CallDecision, ...]:
        return tuple(c for c in self.calls if c.action in ("run", "rerun"))


@dataclass(frozen=True, slots=True)
class CompleteTurn:
    """The last model response had no tool calls: the turn is done."""

    turn: int
    text: str | None


@dataclass(frozen=True, slots=True)
class FailTurn:
    turn: int
    code: str
    error: str


@dataclass(frozen=True, slots=True)
class AbortTurn:
    """A cancel input asks for the turn's input: it ends ``aborted``; the cancels settle."""

    turn: int
    cancel_input_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CloseSettledTurn:
    """The turn's input already has a final settlement, yet the turn never finished: it
    ends ``aborted`` / ``input_already_settled`` and nothing more of it runs (no model
    call, no tool). Its input keeps the verdict it has: no second settlement.

    Logs of older versions hold such turns (a cancel that came while the turn was being
    started was settled, and the turn ran on to an ask nobody could answer); so does a
    parked session's log once repaired (its running turn's input was settled ``failed``
    / ``session_unreadable``).
    """

    turn: int
    input_id: str
    outcome: str  # the input's settlement
    code: str | None

    @property
    def error(self) -> str:
        why = f" ({self.code})" if self.code else ""
        return (
            f"input {self.input_id!r} had already settled {self.outcome}{why} while its turn was still open: "
            "the rest of the turn does not run"
        )


TurnAction = CallModel | RunBatch | CompleteTurn | FailTurn | AbortTurn | CloseSettledTurn


def decide_call(
    call: CallState, policy: ToolPolicy | None, now_ms: int | None = None, *, truncated: bool = False
) -> CallDecision:
    """SPEC 5.1-5.4 for one call of a batch (``now_ms``: to tell a parked rerun;
    ``truncated``: its response was cut at the output limit, so it never runs)."""
    attempt = call.attempts + 1
    if call.result is not None:
        action: Literal["keep", "run", "rerun", "cut", "truncated"] = "keep"
    elif truncated:
        action = "truncated"  # never run, not even a first run of a replay="safe" tool
    elif call.attempts == 0:
        # Its harness.tool.started never committed, so it never ran: a first run
        # is safe whatever its policy.
        action = "run"
    elif policy is None:
        action = "cut"  # a tool this harness no longer has: nobody can rerun it
    elif policy.agent:
        action = "rerun" if call.waiting_for_person() else "cut"
    elif policy.replay == "safe":
        action = "rerun"
    else:
        action = "cut"
    parked = action == "rerun" and now_ms is not None and _call_parked(call, now_ms)
    return CallDecision(call.tool_call_id, call.name, action, attempt, parked)


def first_runs(response: ModelResponseRecord, finished: Collection[str] = ()) -> tuple[CallDecision, ...]:
    """The calls of a model response not logged yet that start in the SAME append as it.

    Exactly what ``plan_turn`` would start once the response is folded (its
    ``RunBatch.to_start``: first runs, attempt 1, since no ``harness.tool.started`` of
    theirs can be in the log): every call but those with a result in that append
    (``finished``: refused at once) and none of a truncated response. So the runtime
    logs ``[model.response, tool.started x n]`` as one append, still before any call
    runs (SPEC 5.7), and a first run and a recovery still agree (tested).
    """
    if response.truncated:
        return ()
    return tuple(
        CallDecision(call["id"], call["name"], "run", 1) for call in response.tool_calls if call["id"] not in finished
    )


def is_parked(state: SessionState, now_ms: int) -> bool:
    """Whether nothing of the active turn can have been running at ``now_ms`` (SPEC 7.5).

    Parked: no model call may be in flight (the last response is logged and has
    unfinished calls, or is the final answer), and every unfinished call of its batch
    stopped, as its last progress, at an ask still open (unanswered, not expired) or
    a sleep whose wake time is still ahead. Taking over a parked turn uses no attempt.
    Anything else may have been running (a model call, a step's ``fn``, a tool woken
    by its answer or its alarm), and its takeover counts.
    """
    turn = state.active_turn
    last = turn.last_response if turn is not None else None
    if last is None:
        return False  # the first model call may be in flight
    if not last.tool_calls:
        return True  # the final answer is logged: only its turn.finished is left
    unfinished = [c for c in state.batch(last) if c.result is None]
    return bool(unfinished) and all(_call_parked(c, now_ms) for c in unfinished)


def _call_parked(call: CallState, now_ms: int) -> bool:
    kind, name = call.progress
    if kind == "ask":
        ask = call.asks[name]
        expires = ask.opened.expires_at
        return ask.answered is None and (expires is None or now_ms < expires)
    if kind == "sleep":
        return call.sleeps[name] > now_ms
    return False


def plan_turn(
    state: SessionState,
    policies: Mapping[str, ToolPolicy],
    *,
    max_attempts: int,
    now_ms: int | None = None,
    timeout_ms: int | None = None,
) -> TurnAction | None:
    """The next action of the session's active turn, or None when there is none.

    A turn whose input already has a final settlement is closed first, whatever else
    holds (its sender has its verdict; nothing more of it runs). Then a final answer
    already logged completes the turn; then a cancel input for the turn's input aborts it; then a turn over ``max_attempts``
    fails ``attempts_exhausted``, and one that started ``timeout_ms`` or more before
    ``now_ms`` fails ``timeout``.
    """
    turn = state.active_turn
    if turn is None:
        return None
    settled = state.final_settlement(turn)
    if settled is not None:
        return CloseSettledTurn(turn.turn, turn.input_id, settled.outcome, settled.code)
    last = turn.last_response
    if last is not None and not last.tool_calls:
        return CompleteTurn(turn.turn, last.text)  # a final answer wins (SPEC 7.5)
    cancels = state.cancels.get(turn.input_id)
    if cancels:
        return AbortTurn(turn.turn, tuple(cancels))
    if turn.attempts > max_attempts:
        return FailTurn(
            turn.turn,
            "attempts_exhausted",
            f"the turn was taken over {turn.attempts - 1} times without finishing "
            f"(limit durability.max_attempts={max_attempts})",
        )
    if timeout_ms is not None and now_ms is not None and now_ms - turn.started_ts >= timeout_ms:
        return FailTurn(
            turn.turn,
            "timeout",
            f"the turn ran for {(now_ms - turn.started_ts) / 1000:.3f} s, over durability.timeout "
            f"({timeout_ms / 1000:.3f} s)",
        )
    return _plan_active(state, turn, policies, now_ms)


def _plan_active(
    state: SessionState, turn: TurnState, policies: Mapping[str, ToolPolicy], now_ms: int | None
) -> TurnAction:
    last = turn.last_response
    if last is None:
        return _call_model(turn, 0)
    if not last.tool_calls:
        return CompleteTurn(turn.turn, last.text)
    batch = state.batch(last)
    if all(c.result is not None for c in batch):
        return _call_model(turn, last.index + 1)
    return RunBatch(
        turn.turn,
        last.index,
        tuple(decide_call(c, policies.get(c.name), now_ms, truncated=last.truncated) for c in batch),
    )


def _call_model(turn: TurnState, index: int) -> CallModel:
    retry = turn.retries.get(index)
    if retry is None:
        return CallModel(turn.turn, index)
    return CallModel(turn.turn, index, retries=retry.retry, not_before=retry.wait_until)


def parked_settlements(state: SessionState, now_ms: int, reason: str) -> list[tuple[int, InputSettled]]:
    """The verdicts the owner of a PARKED session writes (its log has an unreadable record,
    ``state`` is the fold of the records it can read; ``reason`` says where and what to
    do): ``(position of the input record, its settlement)`` for every input without a
    readable settlement, so that no sender waits for good and nothing of the session runs.

    * the input of the running turn: ``failed`` / ``session_unreadable`` (the turn never
      goes on here; repaired, its next owner closes it: ``CloseSettledTurn``);
    * the input of a FINISHED turn: its settlement is the unreadable record (the driver
      writes a turn's ``turn.finished`` and its input's settlement in one append, with the
      same outcome, code and error), so it is settled again with that same verdict, read
      from the ``turn.finished``: the sender gets the answer it was given, and a reader
      that reads the repaired record later sees two settlements that agree (the first in
      log order wins: ``SessionState``). A turn closed ``input_already_settled`` carried
      no verdict of its own (the unreadable one came before): ``failed`` /
      ``session_unreadable``;
    * every input that no turn took, and every conflicting reuse of an input id:
      ``rejected`` / ``session_unreadable``.
    """
    sid = state.session_id
    out: list[tuple[int, InputSettled]] = []
    for turn in state.turns:
        inp = state.inputs.get(turn.input_id)
        if inp is None or inp.settled is not None:
            continue
        fin = turn.finished
        if fin is None or fin.code == CLOSED_CODE or fin.outcome not in FINAL_OUTCOMES:
            out.append((inp.seq, InputSettled(sid, now_ms, inp.input_id, "failed", UNREADABLE_CODE, reason)))
        else:
            out.append((inp.seq, InputSettled(sid, now_ms, inp.input_id, fin.outcome, fin.code, fin.error)))
    out += [
        (i.seq, InputSettled(sid, now_ms, i.input_id, "rejected", UNREADABLE_CODE, reason))
        for i in state.pending_inputs()
    ]
    out += [
        (c.seq, InputSettled(sid, now_ms, c.input_id, "rejected", UNREADABLE_CODE, reason, c.seq))
        for c in state.pending_conflicts()
    ]
    return out
