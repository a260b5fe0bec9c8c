"""bench/e2e.py's figures that are pure arithmetic."""

from __future__ import annotations

import math

import pytest

from bench.e2e import turn_cost


def test_a_turns_cost_divides_out_a_machine_that_runs_every_process_slower() -> None:
    def run(scale: float, server_growth: float = 1.0) -> dict[str, object]:
        return {"cpu_per_turn": {
            "worker process": 2.5 * scale * server_growth,
            "client process (this one)": 0.9 * scale,
            "broker": 1.8 * scale * server_growth,
        }}

    first = turn_cost(run(1.0))
    assert turn_cost(run(1.25)) == pytest.approx(first)  # a 25% slower machine: the same cost
    assert turn_cost(run(1.25, server_growth=1.2)) == pytest.approx(first * 1.2)  # a turn that costs more shows


def test_a_turns_cost_is_unknown_when_the_brokers_cpu_is() -> None:
    # A broker this machine does not run (no pid): its CPU is nan, and so is the cost.
    cpu = {"worker process": 2.5, "client process (this one)": 0.9, "broker": float("nan")}
    assert math.isnan(turn_cost({"cpu_per_turn": cpu}))
