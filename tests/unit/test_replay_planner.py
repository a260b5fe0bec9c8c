"""harness.replay.planner: the cut-batch rules of SPEC section 5, one test per rule."""

from __future__ import annotations

from typing import Any

import pytest

from harness.records import (
    AskAnswered,
    AskOpened,
    InputAnswer,
    InputCancel,
    InputMessage,
    InputSettled,
    LogEntry,
    ModelResponseRecord,
    Record,
    StepResult,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnResumed,
    TurnStarted,
)
from harness.replay import (
    CallDecision,
    CallModel,
    CloseSettledTurn,
    CompleteTurn,
    FailTurn,
    RunBatch,
    SessionState,
    ToolPolicy,
    conversation,
    decide_call,
    first_runs,
    fold,
    plan_turn,
)

S = "s-1"
SAFE = ToolPolicy(replay="safe")
NEVER = ToolPolicy(replay="never")
AGENT = ToolPolicy(replay="never", agent=True)
POLICIES = {"safe": SAFE, "never": NEVER, "agent": AGENT}


def call(cid: str, name: str) -> dict[str, Any]:
    return {"id": cid, "name": name, "arguments": {}}


def head(*calls: dict[str, Any], text: str | None = None) -> list[Record]:
    """A turn whose first model response (logged, SPEC 5.7) carries ``calls``."""
    return [
        InputMessage(S, 0, "in-1", "go", "h"),
        TurnStarted(S, 0, "in-1", 1),
        ModelResponseRecord(S, 0, 1, 0, text, tuple(calls)),
    ]


def tool_started(cid: str, name: str, attempt: int = 1) -> ToolStarted:
    return ToolStarted(S, 0, cid, name, attempt)


def tool_result(cid: str, name: str, content: Any = "ok", **kw: Any) -> ToolResult:
    return ToolResult(S, 0, cid, name, content, **kw)


def state_of(*records: Record) -> SessionState:
    return fold(S, [LogEntry(seq, r) for seq, r in enumerate(records)])


def plan(state: SessionState, policies: dict[str, ToolPolicy] | None = None, max_attempts: int = 10) -> Any:
    return plan_turn(state, POLICIES if policies is None else policies, max_attempts=max_attempts)


def decisions(action: Any) -> dict[str, tuple[str, int]]:
    assert isinstance(action, RunBatch), action
    return {d.tool_call_id: (d.action, d.attempt) for d in action.calls}


# -- SPEC 5 -------------------------------------------------------------------------------


def test_s5_1_finished_call_keeps_result() -> None:
    for name in ("safe", "never", "agent", "gone"):
        state = state_of(
            *head(call("c1", name), call("c2", "safe")),
            tool_started("c1", name),
            tool_started("c2", "safe"),
            tool_result("c1", name),
        )
        assert decide_call(state.calls["c1"], POLICIES.get(name)) == CallDecision("c1", name, "keep", 2)
        action = plan(state)
        assert decisions(action) == {"c1": ("keep", 2), "c2": ("rerun", 2)}
        assert [d.tool_call_id for d in action.to_start] == ["c2"]


def test_s5_1_a_call_with_an_error_result_is_kept_too() -> None:
    state = state_of(
        *head(call("c1", "never")),
        tool_started("c1", "never"),
        tool_result("c1", "never", {"error": "boom"}, is_error=True, code="tool_failed"),
    )
    assert decide_call(state.calls["c1"], NEVER).action == "keep"


def test_s5_2_safe_call_reruns() -> None:
    state = state_of(
        *head(call("c1", "safe")),
        tool_started("c1", "safe"),
        StepResult(S, 0, "c1", "charge", {"id": "ch_1"}),
    )
    action = plan(state)
    assert isinstance(action, RunBatch)
    assert (action.turn, action.response_index) == (1, 0)
    assert action.calls == (CallDecision("c1", "safe", "rerun", 2),)
    assert action.to_start == action.calls
    # The rerun finds its finished step in the state it runs against.
    assert state.calls["c1"].steps == {"charge": {"id": "ch_1"}}


def test_s5_2_safe_call_reruns_after_many_starts() -> None:
    state = state_of(*head(call("c1", "safe")), *(tool_started("c1", "safe", a) for a in (1, 2, 3)))
    assert decide_call(state.calls["c1"], SAFE) == CallDecision("c1", "safe", "rerun", 4)


def test_s5_3_never_call_gets_cut_error() -> None:
    state = state_of(
        *head(call("c1", "never")),
        tool_started("c1", "never"),
        StepResult(S, 0, "c1", "charge", 1),
    )
    action = plan(state)
    assert decisions(action) == {"c1": ("cut", 2)}
    assert action.to_start == ()
    # Its first run's steps stay in the state (SPEC 5.3: they stay in the log).
    assert state.calls["c1"].steps == {"charge": 1}


def test_s5_3_default_policy_is_never() -> None:
    state = state_of(*head(call("c1", "plain")), tool_started("c1", "plain"))
    assert ToolPolicy().replay == "never"
    assert decide_call(state.calls["c1"], ToolPolicy()).action == "cut"


def test_s5_4_agent_call_waiting_for_person_keeps_place() -> None:
    state = state_of(
        *head(call("c1", "agent")),
        tool_started("c1", "agent"),
        AskOpened(S, 0, "c1", "approve", "ok?", {"type": "boolean"}),
    )
    assert decisions(plan(state)) == {"c1": ("rerun", 2)}


def test_s5_4_agent_call_not_waiting_is_cut() -> None:
    state = state_of(*head(call("c1", "agent")), tool_started("c1", "agent"))
    assert decisions(plan(state)) == {"c1": ("cut", 2)}


def test_s5_4_agent_call_whose_ask_was_answered_and_went_on_is_cut() -> None:
    state = state_of(
        *head(call("c1", "agent")),
        tool_started("c1", "agent"),
        AskOpened(S, 0, "c1", "approve", "ok?", {}),
        AskAnswered(S, 0, "c1", "approve", True),
        StepResult(S, 0, "c1", "after-approval", 1),  # it ran on after the answer
    )
    assert decisions(plan(state)) == {"c1": ("cut", 2)}


def test_s5_4_agent_call_is_cut_even_with_replay_safe() -> None:
    state = state_of(*head(call("c1", "agent")), tool_started("c1", "agent"))
    assert decide_call(state.calls["c1"], ToolPolicy(replay="safe", agent=True)).action == "cut"


def test_s5_4_agent_call_answered_after_its_owner_died_keeps_place() -> None:
    # Owner A runs the agent call, which parks on an ask; A dies. Later a person answers
    # through another server: session.answer() commits the answer, then the new owner
    # takes the turn over and plans. The call was waiting for a person when it was cut.
    state = state_of(
        *head(call("c1", "agent")),
        tool_started("c1", "agent"),
        AskOpened(S, 0, "c1", "approve", "ok?", {"type": "boolean"}),
        # -- owner A dies here, parked --
        InputAnswer(S, 0, "answer:c1:approve", "c1", "approve", True),
        AskAnswered(S, 0, "c1", "approve", True, "answer:c1:approve"),
        InputSettled(S, 0, "answer:c1:approve", "completed"),
        TurnResumed(S, 0, "in-1", 1, 2),
    )
    assert decisions(plan(state)) == {"c1": ("rerun", 2)}


def test_s5_7_logged_response_is_not_requested_again() -> None:
    # Crash right after the response with calls was logged: nothing of the batch ran.
    state = state_of(
        *head(call("c1", "safe"), call("c2", "never"), text="working"), TurnResumed(S, 0, "in-1", 1, 2)
    )
    action = plan(state)
    assert not isinstance(action, CallModel)
    assert decisions(action) == {"c1": ("run", 1), "c2": ("run", 1)}


# -- the rest of the planner ------------------------------------------------------------------


def test_a_call_that_never_started_runs_even_with_replay_never() -> None:
    state = state_of(
        *head(call("c1", "never"), call("c2", "never"), call("c3", "agent"), call("c4", "gone")),
        tool_started("c1", "never"),
    )
    assert decisions(plan(state)) == {
        "c1": ("cut", 2),
        "c2": ("run", 1),
        "c3": ("run", 1),
        "c4": ("run", 1),
    }


def test_unknown_tool_is_cut() -> None:
    state = state_of(
        *head(call("c1", "gone"), call("c2", "safe")), tool_started("c1", "gone"), tool_started("c2", "safe")
    )
    assert decide_call(state.calls["c1"], None) == CallDecision("c1", "gone", "cut", 2)
    assert decisions(plan(state)) == {"c1": ("cut", 2), "c2": ("rerun", 2)}


def test_run_batch_keeps_call_order() -> None:
    calls = [call(f"c{i}", n) for i, n in enumerate(["safe", "never", "safe", "never", "gone"])]
    state = state_of(
        *head(*calls), tool_started("c3", "never"), tool_started("c0", "safe"), tool_result("c2", "safe")
    )
    action = plan(state)
    assert [d.tool_call_id for d in action.calls] == ["c0", "c1", "c2", "c3", "c4"]
    assert [d.action for d in action.calls] == ["rerun", "run", "keep", "cut", "run"]
    assert [d.tool_call_id for d in action.to_start] == ["c0", "c1", "c4"]


def test_attempts_exhausted_once_turn_attempts_exceed_max_attempts() -> None:
    records = [*head(call("c1", "safe")), tool_started("c1", "safe")]
    for attempt in (2, 3):
        records.append(TurnResumed(S, 0, "in-1", 1, attempt))
    state = state_of(*records)
    assert state.turns[0].attempts == 3
    assert isinstance(plan(state, max_attempts=3), RunBatch)  # 3 owners are allowed
    action = plan(state, max_attempts=2)
    assert isinstance(action, FailTurn)
    assert (action.turn, action.code) == (1, "attempts_exhausted")
    assert "2 times" in action.error and "max_attempts=2" in action.error


def test_s7_5_a_final_answer_wins_over_attempts_exhausted_and_timeout() -> None:
    state = state_of(*head(text="bye"), TurnResumed(S, 0, "in-1", 1, 2))
    action = plan_turn(state, POLICIES, max_attempts=1, now_ms=10**9, timeout_ms=1)
    assert action == CompleteTurn(1, "bye")


def test_attempts_exhausted_before_running_anything() -> None:
    state = state_of(*head(call("c1", "safe")), tool_started("c1", "safe"), TurnResumed(S, 0, "in-1", 1, 2))
    assert isinstance(plan(state, max_attempts=1), FailTurn)


def test_s7_5_uncounted_takeovers_use_no_attempt() -> None:
    records = [*head(call("c1", "safe")), tool_started("c1", "safe")]
    records += [TurnResumed(S, 0, "in-1", 1, 1, counted=False) for _ in range(5)]
    state = state_of(*records)
    assert state.turns[0].attempts == 1
    assert isinstance(plan(state, max_attempts=1), RunBatch)


def _asking(*extra: Record, expires_at: int | None = None) -> SessionState:
    return state_of(
        *head(call("c1", "safe"), call("c2", "safe")),
        tool_started("c1", "safe"),
        tool_started("c2", "safe"),
        AskOpened(S, 0, "c1", "ok?", "?", {}, expires_at),
        *extra,
    )


def test_s7_5_parked_only_when_every_unfinished_call_waits_on_an_open_ask_or_a_future_sleep() -> None:
    from harness.records import SleepScheduled
    from harness.replay import is_parked

    sleeping = SleepScheduled(S, 0, "c2", "nap", 5000)
    assert is_parked(_asking(sleeping), now_ms=4999)
    assert not is_parked(_asking(sleeping), now_ms=5000)  # the sleeper may be awake and running
    assert not is_parked(_asking(), now_ms=0)  # c2 is running
    assert is_parked(_asking(tool_result("c2", "safe")), now_ms=0)  # c2 is done
    assert not is_parked(_asking(tool_result("c2", "safe"), expires_at=100), now_ms=100)  # expired: it raises
    answered = AskAnswered(S, 0, "c1", "ok?", {"ok": True}, "a-1")
    assert not is_parked(_asking(tool_result("c2", "safe"), answered), now_ms=0)  # woken by its answer
    after = StepResult(S, 0, "c1", "after", 1)
    assert not is_parked(_asking(tool_result("c2", "safe"), after), now_ms=0)  # went on past the ask
    done = _asking(tool_result("c1", "safe"), tool_result("c2", "safe"))
    assert not is_parked(done, now_ms=0)  # the next model call may be in flight
    assert not is_parked(state_of(*head()[:2]), now_ms=0)  # the first model call may be in flight
    assert is_parked(state_of(*head(text="bye")), now_ms=0)  # only its turn.finished is left


def test_s7_5_a_parked_rerun_writes_no_tool_started() -> None:
    state = _asking(tool_result("c2", "safe"))
    [c1, _] = plan_turn(state, POLICIES, max_attempts=10, now_ms=0).calls
    assert (c1.action, c1.parked) == ("rerun", True)
    [c1, _] = plan(state).calls  # no clock: never parked
    assert not c1.parked


def test_timeout_fails_the_turn_measured_from_its_first_start() -> None:
    state = state_of(
        InputMessage(S, 0, "in-1", "go", "h"),
        TurnStarted(S, 1000, "in-1", 1),
        TurnResumed(S, 5000, "in-1", 1, 2),
    )
    assert isinstance(plan_turn(state, POLICIES, max_attempts=10, now_ms=1999, timeout_ms=1000), CallModel)
    action = plan_turn(state, POLICIES, max_attempts=10, now_ms=2000, timeout_ms=1000)
    assert isinstance(action, FailTurn) and action.code == "timeout"


def test_complete_turn_when_the_last_response_has_no_tool_calls() -> None:
    state = state_of(
        *head(call("c1", "safe")),
        tool_started("c1", "safe"),
        tool_result("c1", "safe"),
        ModelResponseRecord(S, 0, 1, 1, "all done", ()),
    )
    assert plan(state) == CompleteTurn(1, "all done")


def test_complete_turn_with_no_text() -> None:
    assert plan(state_of(*head())) == CompleteTurn(1, None)


def test_call_model_first_when_the_turn_has_no_response() -> None:
    state = state_of(InputMessage(S, 0, "in-1", "go", "h"), TurnStarted(S, 0, "in-1", 1))
    assert plan(state) == CallModel(1, 0)


def test_call_model_with_the_next_index_when_the_batch_is_complete() -> None:
    state = state_of(
        *head(call("c1", "safe"), call("c2", "never")),
        tool_started("c1", "safe"),
        tool_started("c2", "never"),
        tool_result("c2", "never"),
        tool_result("c1", "safe"),
        ModelResponseRecord(S, 0, 1, 1, None, (call("c3", "never"),)),
        tool_result("c3", "never", {"error": "cut"}, is_error=True, code="cut"),
    )
    assert plan(state) == CallModel(1, 2)


def test_call_model_numbers_indexes_per_turn() -> None:
    state = state_of(
        *head(text="first"),
        TurnFinished(S, 0, "in-1", 1, "completed", "first"),
        InputMessage(S, 0, "in-2", "again", "h"),
        TurnStarted(S, 0, "in-2", 2),
    )
    assert plan(state) == CallModel(2, 0)


def test_no_action_without_an_active_turn() -> None:
    assert plan(SessionState(session_id=S)) is None
    state = state_of(*head(text="bye"), TurnFinished(S, 0, "in-1", 1, "completed", "bye"))
    assert plan(state) is None


def test_actions_are_frozen() -> None:
    action = CallModel(1, 0)
    with pytest.raises(AttributeError):
        action.index = 2  # type: ignore[misc]


# -- real models (issue 9): truncated responses, logged retries -------------------------------


def truncated_head(*calls: dict[str, Any]) -> list[Record]:
    return [
        InputMessage(S, 0, "in-1", "go", "h"),
        TurnStarted(S, 0, "in-1", 1),
        ModelResponseRecord(S, 0, 1, 0, "cut", tuple(calls), finish_reason="length"),
    ]


def test_truncated_response_calls_never_run_whatever_their_policy() -> None:
    """finish_reason=length: no call of the response runs, not even a first run of replay='safe'."""
    state = state_of(*truncated_head(call("c1", "safe"), call("c2", "never"), call("c3", "gone")))
    action = plan(state)
    assert decisions(action) == {"c1": ("truncated", 1), "c2": ("truncated", 1), "c3": ("truncated", 1)}
    assert action.to_start == ()
    assert decide_call(state.calls["c1"], SAFE, truncated=True).action == "truncated"


def test_truncated_response_then_the_model_is_called_again() -> None:
    state = state_of(
        *truncated_head(call("c1", "safe")),
        tool_result("c1", "safe", {"error": "truncated"}, is_error=True, code="truncated"),
    )
    assert plan(state) == CallModel(1, 1)


def test_a_response_stopped_for_another_reason_runs_its_calls() -> None:
    for reason in ("stop", "tool_calls", None, "content_filter"):
        records = head(call("c1", "never"))
        records[-1] = ModelResponseRecord(S, 0, 1, 0, None, (call("c1", "never"),), finish_reason=reason)
        assert decisions(plan(state_of(*records))) == {"c1": ("run", 1)}


def test_call_model_carries_the_logged_retry_count_and_deadline() -> None:
    from harness.records import ModelRetry

    base = [InputMessage(S, 0, "in-1", "go", "h"), TurnStarted(S, 0, "in-1", 1)]
    assert plan(state_of(*base)) == CallModel(1, 0)
    state = state_of(
        *base,
        ModelRetry(S, 0, 1, 0, 1, 5_000, "429"),
        ModelRetry(S, 0, 1, 0, 2, 9_000, "500", status=500),
    )
    assert plan(state) == CallModel(1, 0, retries=2, not_before=9_000)
    # Once the call has its response, its retries no longer matter; the next call starts at 0.
    state = state_of(
        *base,
        ModelRetry(S, 0, 1, 0, 1, 5_000, "429"),
        ModelResponseRecord(S, 0, 1, 0, None, (call("c1", "safe"),)),
        tool_started("c1", "safe"),
        tool_result("c1", "safe"),
    )
    assert plan(state) == CallModel(1, 1)
    # A retry record for a call that already has its response is an anomaly, ignored.
    late = state_of(*base, ModelResponseRecord(S, 0, 1, 0, "x", ()), ModelRetry(S, 0, 1, 0, 1, 5_000, "late"))
    assert late.anomalies == 1 and plan(late) == CompleteTurn(1, "x")


# -- merged appends (docs/architecture.md, "Fewer commits per turn") ------------------------------


@pytest.mark.parametrize("finish", [None, "stop", "length"])
@pytest.mark.parametrize("refused", [(), ("c2",), ("c1", "c2", "c3")])
def test_first_runs_are_what_the_planner_starts_once_the_response_is_folded(finish: str | None, refused: tuple[str, ...]) -> None:
    """The batch logged as started with its response is exactly the planner's first runs
    of that response, for every policy (a first run is safe whatever it is)."""
    response = ModelResponseRecord(
        S, 0, 1, 0, None, (call("c1", "safe"), call("c2", "never"), call("c3", "agent"), call("c4", "gone")), finish
    )
    before = [InputMessage(S, 0, "in-1", "go", "h"), TurnStarted(S, 0, "in-1", 1), response]
    results = [ToolResult(S, 0, cid, "x", {"error": "refused"}, True, False, "secret_in_arguments") for cid in refused]
    action = plan_turn(state_of(*before, *results), POLICIES, max_attempts=3)
    assert isinstance(action, RunBatch)
    assert first_runs(response, refused) == action.to_start
    if finish == "length":
        assert first_runs(response, refused) == ()
    else:
        assert [d.tool_call_id for d in first_runs(response, refused)] == [
            c for c in ("c1", "c2", "c3", "c4") if c not in refused
        ]
    # Logged as started in the same append, the calls then read as running (not parked).
    started = [tool_started(d.tool_call_id, d.name, d.attempt) for d in first_runs(response, refused)]
    after = state_of(*before, *results, *started)
    assert all(after.calls[d.tool_call_id].attempts == 1 for d in first_runs(response, refused))


def test_conversation_of_a_turn_being_started_is_the_one_its_fold_gives() -> None:
    """The first model call of a turn is made before its turn.started is folded: the
    message it sends ends with the turn's user message, exactly as after the fold."""
    done = [
        InputMessage(S, 0, "in-1", "first", "h"),
        TurnStarted(S, 0, "in-1", 1),
        ModelResponseRecord(S, 0, 1, 0, None, (call("c1", "safe"),)),
        tool_started("c1", "safe"),
        ToolResult(S, 0, "c1", "safe", {"ok": True}, False, False),
        ModelResponseRecord(S, 0, 1, 1, "one", ()),
        TurnFinished(S, 0, "in-1", 1, "completed", "one"),
        InputSettled(S, 0, "in-1", "completed"),
        InputMessage(S, 0, "in-2", "second", "h"),
    ]
    before = state_of(*done)
    after = state_of(*done, TurnStarted(S, 0, "in-2", 2))
    assert conversation(before, starting="in-2") == conversation(after)
    assert conversation(before, starting="in-2")[-1] == {"role": "user", "content": "second"}
    assert conversation(after, starting="in-2") == conversation(after)  # folded already: no second copy
    assert plan_turn(after, POLICIES, max_attempts=3) == CallModel(2, 0)  # what the driver calls


# -- a turn whose input already has its verdict ----------------------------------------------


def legacy_cancelled_turn() -> list[Record]:
    """What the old bug wrote: a cancel taken while in-1's turn was being started was
    settled as for a queued input, then the turn started anyway and parked on an ask."""
    return [
        InputMessage(S, 0, "in-1", "go", "h"),
        InputCancel(S, 0, "cancel:in-1", "in-1"),
        InputSettled(S, 0, "in-1", "aborted", "cancelled", "the input was cancelled"),
        InputSettled(S, 0, "cancel:in-1", "completed"),
        TurnStarted(S, 0, "in-1", 1),
        ModelResponseRecord(S, 0, 1, 0, None, (call("c1", "safe"),)),
        tool_started("c1", "safe"),
        AskOpened(S, 0, "c1", "approve", "ok?", {"type": "boolean"}),
    ]


@pytest.mark.parametrize("outcome", ["completed", "failed", "aborted", "rejected"])
def test_a_turn_whose_input_has_a_final_settlement_is_closed_running_nothing(outcome: str) -> None:
    records = [*head(call("c1", "safe")), tool_started("c1", "safe"),
               AskOpened(S, 0, "c1", "approve", "ok?", {"type": "boolean"}),
               InputSettled(S, 0, "in-1", outcome, None if outcome == "completed" else "session_unreadable")]
    action = plan(state_of(*records))
    assert isinstance(action, CloseSettledTurn)
    assert (action.turn, action.input_id, action.outcome) == (1, "in-1", outcome)
    assert f"input 'in-1' had already settled {outcome}" in action.error


def test_the_legacy_cancelled_turn_is_closed_before_its_ask_or_anything_else() -> None:
    state = state_of(*legacy_cancelled_turn())
    assert plan(state) == CloseSettledTurn(1, "in-1", "aborted", "cancelled")
    # ... whatever else the log says: a final answer, attempts used up, the deadline passed.
    final = state_of(*legacy_cancelled_turn()[:5], ModelResponseRecord(S, 0, 1, 0, "done", ()))
    assert isinstance(plan(final), CloseSettledTurn)
    spent = state_of(*legacy_cancelled_turn(), TurnResumed(S, 0, "in-1", 1, 9))
    assert isinstance(plan_turn(spent, POLICIES, max_attempts=1, now_ms=10**9, timeout_ms=1), CloseSettledTurn)
    # Closed (by the turn's end alone), the session has no active turn left.
    closed = state_of(*legacy_cancelled_turn(), TurnFinished(S, 0, "in-1", 1, "aborted", None, "input_already_settled"))
    assert closed.active_turn is None and closed.ended
    assert plan(closed) is None


def test_a_turn_whose_input_is_not_settled_or_settled_non_finally_goes_on() -> None:
    open_turn = [*head(call("c1", "safe")), tool_started("c1", "safe")]
    assert decisions(plan(state_of(*open_turn))) == {"c1": ("rerun", 2)}
    # A verdict that is not final (no version writes one today; a later one might) is no verdict.
    later = state_of(*open_turn, InputSettled(S, 0, "in-1", "waiting"))
    assert later.final_settlement(later.turns[0]) is None
    assert decisions(plan(later)) == {"c1": ("rerun", 2)}
    # Another input's verdict changes nothing for this turn.
    other = state_of(*open_turn, InputMessage(S, 0, "in-2", "next", "h"), InputSettled(S, 0, "in-2", "aborted"))
    assert decisions(plan(other)) == {"c1": ("rerun", 2)}
