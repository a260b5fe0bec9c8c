"""The benches' ``--bootstrap``: a broker that does not answer stops the run with one line."""

from __future__ import annotations

import socket

import pytest

from bench._common import broker


def test_a_bench_given_a_broker_that_is_down_stops_with_one_line_naming_it() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SystemExit) as stopped, broker(f"127.0.0.1:{port}", timeout=0.5):
        pytest.fail("the run went on without a broker")
    message = str(stopped.value.code)
    assert f"127.0.0.1:{port}" in message
    assert "no Kafka broker answered" in message
    assert "\n" not in message
