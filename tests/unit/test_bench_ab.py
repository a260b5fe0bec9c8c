"""The pure parts of ``bench/ab.py``: its settings and the ratio that cancels the places."""

from __future__ import annotations

import pytest

from bench.ab import env_pairs, geometric_ratio


def test_swapping_the_places_cancels_a_faster_place() -> None:
    # B is 10% faster; the second place adds 5% to whoever runs there.
    a_rates = [200.0, 200.0 * 1.05]  # run 1: A first; run 2: A second
    b_rates = [200.0 * 1.10 * 1.05, 200.0 * 1.10]
    assert geometric_ratio(b_rates, a_rates) == pytest.approx(1.10)
    assert b_rates[0] / a_rates[0] == pytest.approx(1.155)  # one run alone would say 15.5%


def test_settings_are_name_value_pairs() -> None:
    assert env_pairs(["HARNESS_CPU_POLICY=normal", "X=a=b", "EMPTY="], "--b-env") == {
        "HARNESS_CPU_POLICY": "normal", "X": "a=b", "EMPTY": "",
    }
    for wrong in ("FOO", "=1"):
        with pytest.raises(SystemExit, match="expected NAME=VALUE"):
            env_pairs([wrong], "--b-env")
