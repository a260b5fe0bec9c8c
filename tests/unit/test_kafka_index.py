"""Where a session's history starts in its partition (harness.log.kafka.index, pure)."""

from __future__ import annotations

from harness.log.base import Checkpoint, LogEntry
from harness.log.kafka.index import KeyObserver, PartitionIndex
from harness.records import StepResult


def entry(seq: int, session: str) -> LogEntry:
    return LogEntry(seq, StepResult(session, 0, "call", f"s{seq}", seq))


CHECKPOINT = Checkpoint(covers=100, sessions={"live": [entry(40, "live"), entry(90, "live")]}, ended={"ended": 7})


def test_a_checkpoint_gives_live_records_ended_first_positions_and_a_start_for_the_rest():
    index = PartitionIndex(CHECKPOINT, loaded_at=0)
    assert index.history("live") == ([entry(40, "live"), entry(90, "live")], 100)
    assert index.history("ended") == ([], 6)  # seq 7 is offset 6
    assert index.history("unknown") == ([], 100)


def test_no_checkpoint_starts_at_zero():
    assert PartitionIndex(None, loaded_at=0).history("s") == ([], 0)


def test_a_read_from_inside_teaches_the_first_offsets_after_it():
    index = PartitionIndex(CHECKPOINT, loaded_at=0)
    seen = KeyObserver(start=90)
    for offset, key in [(95, b"live"), (100, b"new"), (103, b"new"), (104, b"other")]:
        seen.saw(key, offset)
    seen.stop = 110
    index.observe(seen)
    assert index.position == 110
    assert index.history("new") == ([], 100)
    assert index.history("other") == ([], 104)
    assert index.history("live")[1] == 100  # a live session of the checkpoint: its records + from covers
    assert index.history("never") == ([], 110)


def test_a_read_that_starts_beyond_what_is_known_teaches_nothing():
    index = PartitionIndex(CHECKPOINT, loaded_at=0)
    seen = KeyObserver(start=150)  # offsets 100..149 were not looked at
    seen.saw(b"late", 160)
    seen.stop = 200
    index.observe(seen)
    assert index.position == 100
    assert index.history("late") == ([], 100)


def test_an_older_checkpoint_changes_nothing_a_newer_one_moves_on():
    index = PartitionIndex(CHECKPOINT, loaded_at=0)
    index.merge(Checkpoint(covers=50, sessions={}, ended={"x": 3}), loaded_at=1)
    assert index.history("x") == ([], 100)
    index.merge(Checkpoint(covers=300, sessions={}, ended={"live": 40, "y": 250}), loaded_at=2)
    assert index.history("live") == ([], 39)  # ended since: from its first record
    assert index.history("y") == ([], 249)
    assert index.history("ended") == ([], 6)
    assert index.position == 300


def test_a_tail_that_read_on_from_what_is_known_teaches_every_session_after_it():
    index = PartitionIndex(CHECKPOINT, loaded_at=0)  # knows everything below 100
    ring = [(b"old", 98), (b"new", 100), (b"other", 102), (b"new", 103)]  # oldest first
    index.follow(110, 90, reversed(ring))  # read up to 110 (a commit marker or two after 103)
    assert index.position == 110
    assert index.history("new") == ([], 100)
    assert index.history("other") == ([], 102)
    assert index.history("nobody") == ([], 110)  # nothing of it below 110: nothing to read
    index.follow(110, 90, reversed(ring))  # nothing new: nothing changes
    assert index.position == 110


def test_a_tail_whose_ring_does_not_reach_back_to_what_is_known_teaches_nothing():
    index = PartitionIndex(CHECKPOINT, loaded_at=0)
    index.follow(200, 120, [(b"late", 150)])  # offsets 100..119 are not in its ring
    assert index.position == 100
    assert index.history("late") == ([], 100)
