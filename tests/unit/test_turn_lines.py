"""Per-turn log lines are sampled under load (harness.runtime.turn_lines, fake clock)."""

from __future__ import annotations

import logging

import pytest

from harness.runtime.turn_lines import TurnLines


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def turn_lines(rate: float, burst: int) -> tuple[Clock, TurnLines]:
    clock = Clock()
    return clock, TurnLines(logging.getLogger("t.turns"), rate=rate, burst=burst, clock=clock)


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "t.turns"]


def test_every_line_passes_while_they_come_slower_than_the_rate(caplog: pytest.LogCaptureFixture) -> None:
    clock, turns = turn_lines(10, 5)
    with caplog.at_level(logging.INFO, "t.turns"):
        for i in range(50):
            turns.line("turn %d done", i)
            clock.now += 0.1  # 10 a second: the rate
    assert lines(caplog) == [f"turn {i} done" for i in range(50)]


def test_past_the_rate_lines_are_sampled_and_say_how_many_were_held_back(caplog: pytest.LogCaptureFixture) -> None:
    clock, turns = turn_lines(10, 5)
    with caplog.at_level(logging.INFO, "t.turns"):
        for i in range(200):  # 100 a second for 2 s
            turns.line("turn %d done", i)
            clock.now += 0.01
    out = lines(caplog)
    assert out[:5] == [f"turn {i} done" for i in range(5)]  # the burst
    assert 20 <= len(out) <= 26  # then about 10 a second
    held = [int(line.split("(")[1].split()[0]) for line in out[5:]]
    assert all(h > 0 for h in held) and 5 + len(held) + sum(held) <= 200
    assert "turn lines held back before this one" in out[-1]


def test_a_turn_that_did_not_complete_is_always_told(caplog: pytest.LogCaptureFixture) -> None:
    _, turns = turn_lines(1, 1)
    with caplog.at_level(logging.INFO, "t.turns"):
        for i in range(10):
            turns.line("turn %d completed", i)
        turns.line("turn %d failed", 99, always=True)
    assert lines(caplog)[0] == "turn 0 completed"
    assert lines(caplog)[-1] == "turn 99 failed (9 turn lines held back before this one: over 1 a second)"


def test_nothing_is_counted_when_info_is_off(caplog: pytest.LogCaptureFixture) -> None:
    _, turns = turn_lines(1, 1)
    with caplog.at_level(logging.WARNING, "t.turns"):
        for i in range(10):
            turns.line("turn %d completed", i)
    with caplog.at_level(logging.INFO, "t.turns"):
        turns.line("next")
    assert lines(caplog) == ["next"]
