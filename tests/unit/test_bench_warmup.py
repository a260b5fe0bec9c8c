"""The benches' warm-up: it goes on while a local broker's JIT still compiles."""

from __future__ import annotations

import asyncio
import os

import pytest

import bench._common as common
from bench._common import jit_seconds, jit_settled, warm_broker


def test_a_warm_up_stops_after_its_least_once_the_jit_is_quiet_and_at_its_most_anyway() -> None:
    assert not jit_settled(5, least=20, most=120, jit_share=0.0)  # too early, however quiet
    assert not jit_settled(25, least=20, most=120, jit_share=0.30)  # still compiling
    assert jit_settled(25, least=20, most=120, jit_share=0.01)
    assert jit_settled(25, least=20, most=120, jit_share=None)  # not measurable: the least is all
    assert jit_settled(121, least=20, most=120, jit_share=0.9)  # never longer than the most


def test_the_jit_of_something_that_is_no_jvm_is_unknown() -> None:
    assert jit_seconds(None) is None
    assert jit_seconds(os.getpid()) is None  # this Python process has no JIT counters


def test_the_warm_up_runs_windows_until_the_broker_stops_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    # A broker whose JIT takes 50%, 20%, 2% of its CPU in successive windows.
    cpu, jit = [0.0], [0.0]
    shares = iter([0.5, 0.2, 0.02, 0.02])
    windows: list[float] = []
    now = [0.0]

    async def load(seconds: float) -> None:
        windows.append(seconds)
        now[0] += seconds
        share = next(shares)
        cpu[0] += 1.0
        jit[0] += share

    monkeypatch.setattr(common, "process_cpu_seconds", lambda pid: cpu[0])
    monkeypatch.setattr(common, "jit_seconds", lambda pid: jit[0])
    monkeypatch.setattr(common.time, "monotonic", lambda: now[0])
    report = asyncio.run(warm_broker(load, 1234, least=4, most=100, window=5))
    assert windows == [5, 5, 5]
    assert report["seconds"] == 15
    assert report["jit_share"] == pytest.approx(0.02)

