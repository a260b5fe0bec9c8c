"""Later copies of an input (SPEC 7.2: a resend has no second effect) and the waits of a
call that is over, as the views show them: the fold, the timeline, ``harness show``'s
lines, open sleeps and asks. Pure: records in, views out."""

from __future__ import annotations

from harness.cli.render import timeline_lines
from harness.records import (
    AskOpened,
    InputMessage,
    InputRecords,
    InputSettled,
    LogEntry,
    ModelResponseRecord,
    Record,
    SleepScheduled,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)
from harness.replay import fold
from harness.replay.resends import FirstInputs
from harness.views import Timeline, open_asks, open_sleeps, summarize, timeline

SID = "dup-1"
NOTES = [{"type": "app.note", "n": 1}, {"type": "app.tag"}]


def entries(*records: Record) -> list[LogEntry]:
    return [LogEntry(i + 1, r) for i, r in enumerate(records)]


def five_copies_then_the_turn() -> list[LogEntry]:
    """What five concurrent POSTs of one input id to a new session left (one turn ran),
    then app records sent twice under one id, the second copy landing after the first
    had settled."""
    return entries(
        *(InputMessage(SID, 1000 + k, "same-1", "hi", "acme/assistant") for k in range(5)),
        TurnStarted(SID, 1010, "same-1", 1),
        ModelResponseRecord(SID, 1011, 1, 0, "echo: hi"),
        TurnFinished(SID, 1012, "same-1", 1, "completed", "echo: hi"),
        InputSettled(SID, 1012, "same-1", "completed"),
        InputRecords(SID, 1020, "rec-same", NOTES),
        InputSettled(SID, 1021, "rec-same", "completed"),
        InputRecords(SID, 1022, "rec-same", NOTES),
    )


def test_s7_2_the_fold_keeps_the_first_copy_and_counts_the_others_as_anomalies():
    state = fold(SID, five_copies_then_the_turn())
    assert state.inputs["same-1"].seq == 1 and state.inputs["rec-same"].seq == 10
    assert state.anomalies == 5  # 4 copies of the message, 1 of the records
    assert [e.body for e in state.app_records] == NOTES  # landed once
    assert state.ended and not state.pending_inputs() and not state.pending_conflicts()


def test_s7_2_a_later_copy_reads_resent_in_the_timeline_never_unsettled():
    items = timeline(five_copies_then_the_turn())
    messages = [i for i in items if i.kind == "input.message"]
    assert [(i.seq, i.status) for i in messages] == [(1, "completed"), *((k, "resent") for k in range(2, 6))]
    assert all(i.detail == {"first_position": 1} and i.text is None for i in messages[1:])
    records = [i for i in items if i.kind == "input.records"]
    assert [(i.seq, i.status) for i in records] == [(10, "completed"), (12, "resent")]
    assert records[0].value == NOTES and records[1].value is None and records[1].preview is None  # the records once
    lines = timeline_lines(items, 2000, lambda text, *_: text)
    assert sum("not settled yet" in line for line in lines) == 0
    assert sum("same-1  (resent; the first at position 1 counts)" in line for line in lines) == 4
    assert sum("rec-same  (resent; the first at position 10 counts)" in line for line in lines) == 1
    assert sum("app.note" in line for line in lines) == 1


def test_s7_2_a_resend_reads_the_same_however_the_timeline_is_cut_into_batches():
    whole = [i.to_json() for i in timeline(five_copies_then_the_turn())]
    made, got = Timeline(), []
    for e in five_copies_then_the_turn():
        got += made.add([e])
    assert [i.to_json() for i in got] == whole


def test_a_conflicting_copy_carries_its_own_settlement_not_the_firsts():
    items = timeline(entries(
        InputMessage(SID, 1000, "in-1", "hi", "acme/assistant"),
        InputMessage(SID, 1001, "in-1", "other text"),
        InputSettled(SID, 1002, "in-1", "rejected", "input_conflict", "used", input_seq=2),
    ))
    assert [(i.seq, i.text, i.status) for i in items if i.kind == "input.message"] == [
        (1, "hi", None), (2, "other text", "rejected")]


def test_first_inputs_seeded_from_a_fold_knows_the_copies_before_a_cursor():
    log = five_copies_then_the_turn()
    seen = FirstInputs(fold(SID, log[:3]))  # a reader from position 3 on
    assert [seen.see(e.seq, e.record) for e in log[3:5]] == [1, 1]
    assert FirstInputs(fold(SID, log)).see(1, log[0].record) is None  # the first itself
    assert seen.see(11, InputSettled(SID, 0, "same-1", "completed")) is None  # not an input
    assert seen.see(13, InputMessage(SID, 0, "same-1", "another text")) is None  # a conflict, not a resend


def sleeping_turn(*end: Record) -> list[LogEntry]:
    calls = ({"id": "nap-1", "name": "nap", "arguments": {"seconds": 600}},
             {"id": "ok-1", "name": "approve", "arguments": {}})
    return entries(
        InputMessage(SID, 1000, "rem-1", "nap", "acme/assistant"),
        TurnStarted(SID, 1001, "rem-1", 1),
        ModelResponseRecord(SID, 1002, 1, 0, "napping", calls),
        ToolStarted(SID, 1003, "nap-1", "nap", 1),
        ToolStarted(SID, 1003, "ok-1", "approve", 1),
        SleepScheduled(SID, 1004, "nap-1", "wait", 601_004),
        AskOpened(SID, 1004, "ok-1", "approval", "Approve?", {"type": "object"}),
        *end,
    )


def test_a_sleep_and_an_ask_of_a_running_turn_are_open():
    state = fold(SID, sleeping_turn())
    assert [(s.name, s.to_json(now_ms=2000)["due"]) for s in open_sleeps(state)] == [("wait", False)]
    assert [a.name for a in open_asks(state)] == ["approval"]
    assert summarize(state, now_ms=2000).state == "waiting"


def test_a_cancelled_turn_leaves_no_sleep_listed_and_its_ask_closed():
    cancelled = sleeping_turn(
        TurnFinished(SID, 2000, "rem-1", 1, "aborted", None, "cancelled", "the input was cancelled"),
        InputSettled(SID, 2000, "rem-1", "aborted", "cancelled", "the input was cancelled"),
    )
    state = fold(SID, cancelled)
    assert open_sleeps(state) == () and open_asks(state) == ()
    summary = summarize(state, now_ms=10**9)  # long after the wake time too
    assert summary.state == "idle" and summary.sleeping_until is None
    [ask] = [i for i in timeline(cancelled) if i.kind == "ask"]
    assert ask.status == "closed"  # not "open: waiting for an answer" for ever
