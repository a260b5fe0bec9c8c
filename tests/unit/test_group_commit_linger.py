"""Whom a Kafka partition's next group commit waits for (harness.log.kafka.writer)."""

from __future__ import annotations

import concurrent.futures

from harness.log.kafka.writer import Append, linger_for, returning_sessions


def append(session: str, *types: str) -> Append:
    return Append(session, 1, [(t, b"") for t in types], concurrent.futures.Future())


STEP, SETTLED = "harness.step.result", "harness.input.settled"


def test_sessions_whose_input_settled_are_not_expected_back() -> None:
    batch = [
        append("a", STEP),
        append("b", "harness.model.response", "harness.turn.finished", SETTLED),
        append("c", STEP),
    ]
    assert returning_sessions(batch) == {"a", "c"}


def test_a_lone_session_never_waits() -> None:
    assert linger_for({"a"}, [append("a", STEP)]) == 0
    assert linger_for(set(), [append("a", STEP), append("b", STEP)]) == 0


def test_waits_for_every_returning_session_not_in_yet() -> None:
    assert linger_for({"a", "b", "c"}, [append("a", STEP)]) == 3
    # a newcomer counts too: the wait ends when all four are in
    assert linger_for({"a", "b", "c"}, [append("d", STEP)]) == 4


def test_commits_at_once_when_every_returning_session_is_in() -> None:
    assert linger_for({"a", "b"}, [append("b", STEP), append("a", STEP), append("a", STEP)]) == 0
