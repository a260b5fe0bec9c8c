"""ended_from_control gives fold(...).ended for any sequence of records (it may only
skip work, never change the answer: a live session taken for ended would be dropped)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.records import (
    InputAnswer,
    InputCancel,
    InputMessage,
    InputRecords,
    InputSettled,
    LogEntry,
    ModelResponseRecord,
    StepResult,
    TurnFinished,
    TurnStarted,
)
from harness.replay import CONTROL_TYPES, control_fields, ended_from_control, fold

S = "s"
ids = st.sampled_from(["a", "b", "c"])
turns = st.integers(min_value=0, max_value=4)

positions = st.none() | st.integers(min_value=1, max_value=14)

record = st.one_of(
    st.builds(lambda i, t: InputMessage(S, 0, i, t), ids, st.sampled_from(["hi", "ho"])),
    st.builds(lambda i, v: InputAnswer(S, 0, i, "c1", "ask", v), ids, st.sampled_from([True, 1, {"a": 1}])),
    st.builds(lambda i: InputRecords(S, 0, i, []), ids),
    st.builds(lambda i, t: InputCancel(S, 0, i, t), ids, ids),
    st.builds(
        lambda i, o, at: InputSettled(S, 0, i, o, input_seq=at),
        ids,
        st.sampled_from(["completed", "rejected", "failed"]),
        positions,
    ),
    st.builds(lambda i, n: TurnStarted(S, 0, i, n), ids, turns),
    st.builds(lambda i, n: TurnFinished(S, 0, i, n, "completed"), ids, turns),
    st.builds(lambda n: ModelResponseRecord(S, 0, n, 0, "x", ()), turns),
    st.just(StepResult(S, 0, "c1", "step", 1)),
)


@given(st.lists(record, max_size=14))
@settings(max_examples=600, deadline=None)
def test_ended_from_control_equals_the_fold(records: list) -> None:
    entries = [LogEntry(i + 1, r) for i, r in enumerate(records)]
    expected = fold(S, entries).ended
    control = [(e.seq, e.record_type, control_fields(e.record)) for e in entries if e.record_type in CONTROL_TYPES]
    assert ended_from_control(control) == expected


def test_a_plain_finished_turn_is_ended_and_a_queued_input_is_not() -> None:
    done = [
        InputMessage(S, 0, "a", "hi"),
        TurnStarted(S, 0, "a", 1),
        TurnFinished(S, 0, "a", 1, "completed"),
        InputSettled(S, 0, "a", "completed"),
    ]
    assert ended_from_control([(i, r.TYPE, control_fields(r)) for i, r in enumerate(done)])
    queued = [*done, InputMessage(S, 0, "b", "again")]
    assert not ended_from_control([(i, r.TYPE, control_fields(r)) for i, r in enumerate(queued)])
