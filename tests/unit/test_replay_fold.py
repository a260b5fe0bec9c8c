"""harness.replay.state and .conversation: the fold of records into a session's state."""

from __future__ import annotations

from typing import Any

import pytest

from harness.jsonvalues import dumps
from harness.records import (
    AppRecord,
    AskAnswered,
    AskOpened,
    InputAnswer,
    InputMessage,
    InputRecords,
    InputSettled,
    LogEntry,
    ModelResponseRecord,
    Record,
    SleepScheduled,
    StepResult,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnResumed,
    TurnStarted,
)
from harness.replay import SessionState, conversation, fold

S = "s-1"


def call(cid: str, name: str = "t", **arguments: Any) -> dict[str, Any]:
    return {"id": cid, "name": name, "arguments": arguments}


def msg(input_id: str, text: str = "hi", harness: str | None = "h") -> InputMessage:
    return InputMessage(S, 0, input_id, text, harness)


def started(input_id: str, turn: int) -> TurnStarted:
    return TurnStarted(S, 0, input_id, turn)


def response(turn: int, index: int, *calls: dict[str, Any], text: str | None = None) -> ModelResponseRecord:
    return ModelResponseRecord(S, 0, turn, index, text, tuple(calls))


def result(cid: str, content: Any = "ok", name: str = "t", **kw: Any) -> ToolResult:
    return ToolResult(S, 0, cid, name, content, **kw)


def finished(input_id: str, turn: int, text: str | None = "done") -> TurnFinished:
    return TurnFinished(S, 0, input_id, turn, "completed", text)


def entries(*records: Record) -> list[LogEntry]:
    return [LogEntry(seq, r) for seq, r in enumerate(records)]


def folded(*records: Record) -> SessionState:
    return fold(S, entries(*records))


def turn_with_batch(*calls: dict[str, Any]) -> list[Record]:
    """An input, its turn, and one model response carrying ``calls``."""
    return [msg("in-1"), started("in-1", 1), response(1, 0, *calls)]


# -- inputs -------------------------------------------------------------------------------


def test_inputs_dedup_by_input_id_first_wins() -> None:
    state = folded(
        msg("in-1", "first"),
        msg("in-1", "second"),
        InputRecords(S, 0, "in-1", [{"type": "x"}]),
    )
    assert list(state.inputs) == ["in-1"]
    inp = state.inputs["in-1"]
    assert isinstance(inp.record, InputMessage)
    assert inp.record.text == "first"
    assert inp.seq == 0
    # Other payloads under the same id are conflicts for the owner to refuse (issue 7).
    assert sorted(state.conflicts) == [1, 2]
    assert [c.seq for c in state.pending_conflicts()] == [1, 2]


def test_a_resend_with_the_same_payload_is_no_conflict_and_a_settled_conflict_is_done() -> None:
    state = folded(
        msg("in-1", "first"),
        msg("in-1", "first"),
        msg("in-1", "other"),
        InputSettled(S, 0, "in-1", "rejected", "input_conflict", input_seq=2),
    )
    assert state.anomalies == 1 and list(state.conflicts) == [2]
    assert state.conflicts[2].settled is not None and state.pending_conflicts() == []
    assert state.inputs["in-1"].settled is None  # the first one is still to be taken


def test_input_kinds() -> None:
    state = folded(
        msg("m"),
        InputAnswer(S, 0, "a", "c1", "ok?", True),
        InputRecords(S, 0, "r", []),
    )
    assert [i.kind for i in state.inputs.values()] == ["message", "answer", "records"]


def test_harness_name_comes_from_the_first_message_that_names_one() -> None:
    state = folded(msg("in-0", harness=None), msg("in-1", harness="acme/a"), msg("in-2", harness="other"))
    assert state.harness == "acme/a"


# -- turns ----------------------------------------------------------------------------------


def test_turns_are_numbered_from_one_in_order() -> None:
    state = folded(msg("in-1"), msg("in-2"), started("in-1", 1), finished("in-1", 1), started("in-2", 2))
    assert [(t.turn, t.input_id) for t in state.turns] == [(1, "in-1"), (2, "in-2")]
    assert state.inputs["in-1"].turn == 1
    assert state.inputs["in-2"].turn == 2
    assert state.turn_of("in-2") is state.turns[1]
    assert state.turn_of("nope") is None
    assert state.anomalies == 0


@pytest.mark.parametrize(
    "bad",
    [
        started("in-2", 3),  # skips a number
        started("in-2", 1),  # repeats a number
        started("in-1", 2),  # the input already has a turn
        started("ghost", 2),  # no such input
    ],
    ids=["skips", "repeats", "input-already-started", "unknown-input"],
)
def test_a_turn_started_out_of_order_is_an_anomaly(bad: TurnStarted) -> None:
    state = folded(msg("in-1"), msg("in-2"), started("in-1", 1), finished("in-1", 1), bad)
    assert len(state.turns) == 1
    assert state.inputs["in-2"].turn is None
    assert state.anomalies == 1


def test_turn_resumed_counts_owners() -> None:
    state = folded(msg("in-1"), started("in-1", 1))
    assert state.turns[0].attempts == 1
    state.apply(10, TurnResumed(S, 0, "in-1", 1, 2))
    state.apply(11, TurnResumed(S, 0, "in-1", 1, 3))
    assert state.turns[0].attempts == 3
    state.apply(12, TurnResumed(S, 0, "in-1", 1, 2))  # a stale number never lowers it
    assert state.turns[0].attempts == 3
    assert state.anomalies == 0


def test_turn_resumed_of_a_finished_or_unknown_turn_is_an_anomaly() -> None:
    state = folded(msg("in-1"), started("in-1", 1), finished("in-1", 1), TurnResumed(S, 0, "in-1", 1, 2))
    state.apply(10, TurnResumed(S, 0, "in-x", 7, 2))
    assert state.turns[0].attempts == 1
    assert state.anomalies == 2


def test_active_turn_and_turn_finished() -> None:
    state = folded(msg("in-1"))
    assert state.active_turn is None
    state.apply(1, started("in-1", 1))
    assert state.active_turn is state.turns[0]
    fin = finished("in-1", 1, "bye")
    state.apply(2, fin)
    assert state.active_turn is None
    assert state.turns[0].finished == fin
    state.apply(3, finished("in-1", 1, "again"))  # a second finish never overrides
    assert state.turns[0].finished == fin
    assert state.anomalies == 1


# -- model responses and calls ---------------------------------------------------------------


def test_model_response_registers_its_calls() -> None:
    state = folded(
        *turn_with_batch(call("c1", "a", x=1), call("c2", "b")),
        ToolResult(S, 0, "c1", "a", 1),
        ToolResult(S, 0, "c2", "b", 2),
        response(1, 1, call("c3", "a"), text="more"),
    )
    turn = state.turns[0]
    assert [r.index for r in turn.responses] == [0, 1]
    assert turn.last_response is turn.responses[1]
    c1, c2, c3 = (state.calls[c] for c in ("c1", "c2", "c3"))
    assert (c1.name, c1.arguments, c1.turn, c1.response_index, c1.position) == ("a", {"x": 1}, 1, 0, 0)
    assert (c2.name, c2.response_index, c2.position) == ("b", 0, 1)
    assert (c3.response_index, c3.position, c3.attempts, c3.result) == (1, 0, 0, None)
    assert [c.tool_call_id for c in state.batch(turn.responses[0])] == ["c1", "c2"]
    assert state.anomalies == 0


@pytest.mark.parametrize(
    "bad",
    [response(1, 0), response(1, 2), response(2, 0), response(0, 0)],
    ids=["repeated-index", "skipped-index", "unknown-turn", "turn-zero"],
)
def test_a_model_response_out_of_place_is_an_anomaly(bad: ModelResponseRecord) -> None:
    state = folded(msg("in-1"), started("in-1", 1), response(1, 0, text="a"), bad)
    assert [r.text for r in state.turns[0].responses] == ["a"]
    assert state.anomalies == 1


def test_a_model_response_of_a_finished_turn_is_an_anomaly() -> None:
    state = folded(msg("in-1"), started("in-1", 1), finished("in-1", 1), response(1, 0, call("c1")))
    assert state.turns[0].responses == []
    assert "c1" not in state.calls
    assert state.anomalies == 1


def test_a_repeated_call_id_keeps_the_first_call() -> None:
    state = folded(*turn_with_batch(call("c1", "a")), result("c1"), response(1, 1, call("c1", "b")))
    assert state.calls["c1"].name == "a"
    assert state.calls["c1"].response_index == 0
    assert state.anomalies == 1


def test_tool_started_counts_attempts() -> None:
    state = folded(*turn_with_batch(call("c1")))
    assert state.calls["c1"].attempts == 0
    state.apply(10, ToolStarted(S, 0, "c1", "t", 1))
    assert state.calls["c1"].attempts == 1
    state.apply(11, ToolStarted(S, 0, "c1", "t", 2))
    assert state.calls["c1"].attempts == 2
    state.apply(12, ToolStarted(S, 0, "c1", "t", 1))  # a stale number still counts a start
    assert state.calls["c1"].attempts == 3
    state.apply(13, ToolStarted(S, 0, "c1", "t", 7))
    assert state.calls["c1"].attempts == 7
    assert state.anomalies == 0


@pytest.mark.parametrize(
    "record",
    [
        ToolStarted(S, 0, "ghost", "t", 1),
        StepResult(S, 0, "ghost", "s", 1),
        SleepScheduled(S, 0, "ghost", "s", 1),
        AskOpened(S, 0, "ghost", "q", "?", {}),
        AskAnswered(S, 0, "ghost", "q", 1),
        AppRecord(S, 0, "x", {"type": "x"}, tool_call_id="ghost"),
        ToolResult(S, 0, "ghost", "t", 1),
    ],
    ids=lambda r: r.TYPE,
)
def test_a_record_of_an_unknown_call_is_an_anomaly(record: Record) -> None:
    state = folded(*turn_with_batch(call("c1")), record)
    assert list(state.calls) == ["c1"]
    assert state.anomalies == 1


def test_first_step_value_wins() -> None:
    state = folded(
        *turn_with_batch(call("c1")),
        StepResult(S, 0, "c1", "charge", {"id": "ch_1"}),
        StepResult(S, 0, "c1", "charge", {"id": "ch_2"}),
        StepResult(S, 0, "c1", "invoice", None),
    )
    assert state.calls["c1"].steps == {"charge": {"id": "ch_1"}, "invoice": None}
    assert state.anomalies == 1


def test_first_tool_result_wins() -> None:
    first = result("c1", "first")
    state = folded(*turn_with_batch(call("c1")), first, result("c1", "second", is_error=True))
    assert state.calls["c1"].result == first
    assert state.calls["c1"].finished
    assert state.anomalies == 1


def test_first_sleep_wake_time_wins() -> None:
    state = folded(
        *turn_with_batch(call("c1")),
        SleepScheduled(S, 0, "c1", "nap", 1000),
        SleepScheduled(S, 0, "c1", "nap", 2000),
    )
    assert state.calls["c1"].sleeps == {"nap": 1000}


def test_asks_opened_and_answered() -> None:
    opened = AskOpened(S, 0, "c1", "approve", "ok?", {"type": "boolean"}, 99)
    state = folded(*turn_with_batch(call("c1")), opened)
    c1 = state.calls["c1"]
    assert c1.asks["approve"].opened == opened
    assert c1.asks["approve"].answered is None
    assert c1.waiting_for_person()

    state.apply(10, AskOpened(S, 0, "c1", "approve", "again?", {}))  # a rerun re-opening: first stays
    assert c1.asks["approve"].opened == opened
    answered = AskAnswered(S, 0, "c1", "approve", True, "ans-1")
    state.apply(11, answered)
    assert c1.asks["approve"].answered == answered
    assert c1.waiting_for_person()  # answered, but no run of the call has taken it up yet
    assert state.anomalies == 0
    state.apply(12, ToolStarted(S, 0, "c1", "tool", 2))  # a rerun takes the answer up
    assert not c1.waiting_for_person()

    state.apply(13, AskAnswered(S, 0, "c1", "approve", False))  # second answer: first stands
    state.apply(14, AskAnswered(S, 0, "c1", "never-asked", 1))
    assert c1.asks["approve"].answered == answered
    assert "never-asked" not in c1.asks
    assert state.anomalies == 2


def test_waiting_for_person_while_any_ask_is_open() -> None:
    state = folded(
        *turn_with_batch(call("c1")),
        AskOpened(S, 0, "c1", "a", "?", {}),
        AskAnswered(S, 0, "c1", "a", 1),
        AskOpened(S, 0, "c1", "b", "?", {}),
    )
    assert state.calls["c1"].waiting_for_person()


# -- app records ----------------------------------------------------------------------------


def test_app_records_from_tools_and_settled_inputs_in_log_order() -> None:
    state = folded(
        *turn_with_batch(call("c1")),  # seq 0..2
        AppRecord(S, 0, "order", {"type": "order", "n": 1}, tool_call_id="c1"),  # seq 3
        result("c1"),  # seq 4
        InputRecords(S, 0, "rec-1", [{"type": "note", "n": 2}, {"type": "note", "n": 3}]),  # seq 5
        InputSettled(S, 0, "rec-1", "completed"),  # seq 6
    )
    got = [(e.seq, e.type, e.body, e.tool_call_id, e.input_id) for e in state.app_records]
    assert got == [
        (3, "order", {"type": "order", "n": 1}, "c1", None),
        (6, "note", {"type": "note", "n": 2}, None, "rec-1"),
        (6, "note", {"type": "note", "n": 3}, None, "rec-1"),
    ]


def test_app_records_of_a_discarded_second_result_do_not_land() -> None:
    # A racing or fenced writer's duplicate run: its records come in the same atomic
    # append as its result, which the fold drops; its records must go with it.
    state = folded(
        *turn_with_batch(call("c1")),
        AppRecord(S, 0, "order", {"type": "order", "run": 1}, tool_call_id="c1"),
        result("c1", "first"),
        AppRecord(S, 0, "order", {"type": "order", "run": 2}, tool_call_id="c1"),
        result("c1", "second"),
    )
    assert state.calls["c1"].result is not None
    assert state.calls["c1"].result.content == "first"
    assert [e.body for e in state.app_records] == [{"type": "order", "run": 1}]
    assert state.anomalies == 2  # the second run's record and its result


def test_tool_app_records_land_with_the_result_of_their_call() -> None:
    state = folded(
        *turn_with_batch(call("c1"), call("c2")),
        AppRecord(S, 0, "a", {"type": "a"}, tool_call_id="c1"),
    )
    assert state.app_records == []  # staged: a call cut before its result never appended them
    state.apply(10, AppRecord(S, 0, "b", {"type": "b"}, tool_call_id="c2"))
    state.apply(11, result("c2"))
    state.apply(12, result("c1"))
    assert [(e.seq, e.type, e.tool_call_id) for e in state.app_records] == [(10, "b", "c2"), (3, "a", "c1")]
    assert state.anomalies == 0


def test_input_records_land_only_when_settled_completed() -> None:
    state = folded(InputRecords(S, 0, "rec-1", [{"type": "note"}]))
    assert state.app_records == []  # not settled yet
    state.apply(1, InputSettled(S, 0, "rec-1", "rejected", "invalid_records", "bad"))
    assert state.app_records == []
    state.apply(2, InputSettled(S, 0, "rec-1", "completed"))  # a second verdict never counts
    assert state.app_records == []
    assert state.anomalies == 1


def test_input_settled_of_an_unknown_input_is_an_anomaly() -> None:
    state = folded(InputSettled(S, 0, "ghost", "completed"))
    assert state.inputs == {}
    assert state.anomalies == 1


# -- pending inputs, ended ---------------------------------------------------------------------


def test_pending_inputs_in_log_order() -> None:
    state = folded(
        msg("m1"),
        InputRecords(S, 0, "r1", []),
        msg("m2"),
        InputAnswer(S, 0, "a1", "c1", "q", 1),
    )
    assert [i.input_id for i in state.pending_inputs()] == ["m1", "r1", "m2", "a1"]
    assert not state.ended

    state.apply(10, started("m1", 1))  # a started message is no longer pending
    state.apply(11, InputSettled(S, 0, "r1", "completed"))
    state.apply(12, InputSettled(S, 0, "a1", "rejected", "no_such_ask"))
    assert [i.input_id for i in state.pending_inputs()] == ["m2"]

    state.apply(13, InputSettled(S, 0, "m2", "rejected", "busy"))  # a refused message is not pending
    assert state.pending_inputs() == []
    assert not state.ended  # turn 1 is still active


def test_ended_when_no_active_turn_and_nothing_pending() -> None:
    assert SessionState(session_id=S).ended
    state = folded(msg("in-1"))
    assert not state.ended
    state.apply(1, started("in-1", 1))
    assert not state.ended
    state.apply(2, finished("in-1", 1))
    state.apply(3, InputSettled(S, 0, "in-1", "completed"))
    assert state.ended
    state.apply(4, InputRecords(S, 0, "r", []))
    assert not state.ended


# -- apply, fold ------------------------------------------------------------------------------


def test_apply_ignores_a_record_already_folded() -> None:
    state = SessionState(session_id=S)
    state.apply(5, msg("in-1", "first"))
    assert state.last_seq == 5
    state.apply(5, msg("in-2"))  # the same position again: a re-read
    assert list(state.inputs) == ["in-1"]
    assert state.anomalies == 0
    state.apply(9, msg("in-4"))  # gaps in seq are fine (Kafka offsets skip markers)
    assert list(state.inputs) == ["in-1", "in-4"]
    assert state.last_seq == 9


def test_apply_folds_an_earlier_record_read_back_after_own_appends() -> None:
    # An owner folds its own append (seq 5) at once; reading the log back it finds
    # another writer's input at seq 3, which it has not seen yet.
    state = SessionState(session_id=S)
    state.apply(5, msg("own"))
    state.apply(3, msg("theirs"))
    state.apply(5, msg("own"))  # the read-back also returns its own record: skipped
    assert set(state.inputs) == {"own", "theirs"}
    assert state.last_seq == 5
    assert state.anomalies == 0


def test_apply_ignores_anything_at_or_below_what_was_read() -> None:
    state = SessionState(session_id=S)
    state.apply(7, msg("in-7"))
    state.mark_read(7)
    assert state.read_upto == 7
    state.apply(3, msg("in-3"))  # the log was read up to 7: position 3 is folded already
    state.apply(7, msg("in-7b"))
    assert list(state.inputs) == ["in-7"]
    state.mark_read(4)  # never goes back
    assert state.read_upto == 7


def test_fold_marks_the_log_read_up_to_its_last_record() -> None:
    state = fold(S, [LogEntry(2, msg("a")), LogEntry(6, msg("b"))])
    assert (state.last_seq, state.read_upto) == (6, 6)
    state.apply(4, msg("c"))
    assert "c" not in state.inputs


def test_pending_inputs_stay_in_log_order_when_folded_out_of_order() -> None:
    state = SessionState(session_id=S)
    state.apply(10, msg("own"))  # the owner's send(), folded at once
    state.apply(9, msg("theirs"))  # submitted by another client just before it
    state.mark_read(10)
    assert [i.input_id for i in state.pending_inputs()] == ["theirs", "own"]


def test_reapplying_a_tail_changes_nothing() -> None:
    log = entries(
        *turn_with_batch(call("c1")),
        ToolStarted(S, 0, "c1", "t", 1),
        StepResult(S, 0, "c1", "s", 1),
        result("c1"),
    )
    state = fold(S, log)
    snapshot = fold(S, log)
    for entry in log[2:]:
        state.apply_entry(entry)
    assert state == snapshot
    assert state.calls["c1"].attempts == 1


def test_apply_one_by_one_equals_fold() -> None:
    log = entries(*turn_with_batch(call("c1"), call("c2")), result("c2"), result("c1"))
    state = SessionState(session_id=S)
    for entry in log:
        state.apply_entry(entry)
    assert state == fold(S, log)


def test_unknown_record_class_only_moves_last_seq() -> None:
    state = SessionState(session_id=S)
    state.apply(4, Record(S, 0))
    assert state.last_seq == 4
    assert state == SessionState(session_id=S, last_seq=4)


# -- conversation ----------------------------------------------------------------------------


def test_conversation_puts_tool_results_in_call_order() -> None:
    state = folded(
        msg("in-1", "check out 42"),
        started("in-1", 1),
        response(1, 0, call("c1", "a", x=1), call("c2", "b"), call("c3", "c"), text="on it"),
        result("c3", {"n": 3}, name="c"),  # committed out of order
        result("c1", [1], name="a", is_error=True, code="tool_failed"),
        result("c2", "two", name="b"),
        response(1, 1, text="done"),
        finished("in-1", 1),
        msg("in-2", "again"),
        started("in-2", 2),
    )
    assert conversation(state) == [
        {"role": "user", "content": "check out 42"},
        {
            "role": "assistant",
            "content": "on it",
            "tool_calls": [
                {"id": "c1", "name": "a", "arguments": {"x": 1}},
                {"id": "c2", "name": "b", "arguments": {}},
                {"id": "c3", "name": "c", "arguments": {}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "a", "content": dumps([1]), "is_error": True},
        {"role": "tool", "tool_call_id": "c2", "name": "b", "content": dumps("two"), "is_error": False},
        {"role": "tool", "tool_call_id": "c3", "name": "c", "content": dumps({"n": 3}), "is_error": False},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "again"},
    ]


def test_conversation_leaves_out_calls_without_a_result() -> None:
    state = folded(*turn_with_batch(call("c1"), call("c2")), result("c2"))
    messages = conversation(state)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[2]["tool_call_id"] == "c2"


def test_conversation_of_arguments_none_is_an_empty_object() -> None:
    state = folded(
        msg("in-1"), started("in-1", 1), response(1, 0, {"id": "c1", "name": "t", "arguments": None})
    )
    assert conversation(state)[1]["tool_calls"] == [{"id": "c1", "name": "t", "arguments": {}}]


def test_conversation_of_an_empty_session_is_empty() -> None:
    assert conversation(folded(msg("in-1"))) == []  # an input not yet taken is not in it


def test_conversation_answers_every_call_of_a_finished_turn() -> None:
    state = folded(
        msg("in-1"),
        started("in-1", 1),
        response(1, 0, call("c1"), call("c2")),
        ToolStarted(S, 0, "c1", "t", 1),
        ToolStarted(S, 0, "c2", "t", 1),
        result("c1"),
        TurnFinished(S, 0, "in-1", 1, "failed", None, "attempts_exhausted", "taken over too often"),
        InputSettled(S, 0, "in-1", "failed", "attempts_exhausted"),
        msg("in-2", "next"),
        started("in-2", 2),
    )
    messages = conversation(state)
    asked = [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls", ())]
    answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert answered == asked


def test_usage_records_sum_into_the_session_totals() -> None:
    from harness.records import ModelUsage
    from harness.replay import UsageTotals

    state = fold(
        S,
        [
            LogEntry(0, ModelUsage(S, 0, 1, 0, "m-1", 100, 20, None)),
            LogEntry(1, ModelUsage(S, 0, 1, 1, "m-1", 150, 5, 0.5)),
            LogEntry(2, ModelUsage(S, 0, 2, 0, "m-2", 10, 1, 0.25)),
        ],
    )
    assert state.usage == UsageTotals(calls=3, input_tokens=260, output_tokens=26, cost=0.75)
    assert fold(S, []).usage == UsageTotals(calls=0, input_tokens=0, output_tokens=0, cost=None)
