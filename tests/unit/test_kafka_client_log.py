"""librdkafka's log lines through ``ClientLog``: a kind of line once per window, whichever
client says it, and the next one says how many were held back (harness.log.kafka.client_log)."""

from __future__ import annotations

import logging

import pytest

from harness.log.kafka.client_log import ClientLog

FMT = "%s [%s] %s"
REFUSED = "[thrd:127.0.0.1:{port}/bootstrap]: Connect to ipv4#127.0.0.1:{port} failed: Connection refused (after {ms}ms)"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_repeating_itself_in_every_client_is_one_line_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = ClientLog(logging.getLogger("test.client"), window=60, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.client"):
        for i in range(500):  # 20 clients, every 2.4 s: each says the same, its own numbers aside
            clock.now += 0.12
            log.log(logging.ERROR, FMT, "FAIL", f"rdkafka#producer-{i % 20}", REFUSED.format(port=9092, ms=i % 3))
        log.log(logging.WARNING, FMT, "GETPID", "rdkafka#producer-1", "Failed to acquire transactional PID")
        clock.now += 0.5
        log.log(logging.ERROR, FMT, "FAIL", "rdkafka#producer-3", REFUSED.format(port=9092, ms=0))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0] == "FAIL [rdkafka#producer-0] " + REFUSED.format(port=9092, ms=0)
    assert lines[1] == "GETPID [rdkafka#producer-1] Failed to acquire transactional PID"  # another kind passes
    # a minute on, the next one passes and says how many were held back
    assert lines[2] == ("FAIL [rdkafka#producer-3] " + REFUSED.format(port=9092, ms=0)
                        + " (499 more like this in the last 60 s)")
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.WARNING, logging.ERROR]


def test_a_level_the_logger_drops_costs_nothing_and_is_not_counted(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = ClientLog(logging.getLogger("test.quiet"), window=60, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.quiet"):
        for _ in range(10):
            log.log(logging.DEBUG, FMT, "FETCH", "rdkafka#consumer-1", "fetching")
        log.log(logging.ERROR, FMT, "FAIL", "rdkafka#consumer-1", "down")
    assert [r.getMessage() for r in caplog.records] == ["FAIL [rdkafka#consumer-1] down"]


def test_a_coordinator_loading_its_state_is_normal_work_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    log = ClientLog(logging.getLogger("test.getpid"), window=60, clock=Clock())
    with caplog.at_level(logging.INFO, logger="test.getpid"):
        log.log(logging.WARNING, FMT, "GETPID", "rdkafka#producer-1",
                "Failed to acquire transactional PID from broker TxnCoordinator/1: Coordinator load in progress: retrying")
    assert [r.levelno for r in caplog.records] == [logging.INFO]


def test_librdkafkas_own_count_of_suppressed_repeats_is_not_a_new_kind(caplog: pytest.LogCaptureFixture) -> None:
    """`(after 0ms in state CONNECT)` then `(after 0ms in state CONNECT, 1 identical error(s)
    suppressed)`: the same failure, one kind (each passed as a new one)."""
    clock = Clock()
    log = ClientLog(logging.getLogger("test.client"), window=60, clock=clock)
    text = "Connect to ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT{})"
    with caplog.at_level(logging.INFO, logger="test.client"):
        for suffix in ("", ", 1 identical error(s) suppressed", ", 12 identical error(s) suppressed"):
            clock.now += 1
            log.log(logging.ERROR, FMT, "FAIL", "rdkafka#producer-1", text.format(suffix))
    assert [r.getMessage() for r in caplog.records] == ["FAIL [rdkafka#producer-1] " + text.format("")]


def test_a_refused_connection_is_one_kind_whichever_thread_and_connection_said_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker that stops: each client's bootstrap, GroupCoordinator, TxnCoordinator and
    broker-id connection said the same refusal, each as a kind of its own."""
    clock = Clock()
    log = ClientLog(logging.getLogger("test.client"), window=60, clock=clock)
    refused = "Connect to ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)"
    with caplog.at_level(logging.INFO, logger="test.client"):
        for where in ("[thrd:GroupCoordinator]: GroupCoordinator: 127.0.0.1:9092: ",
                      "[thrd:127.0.0.1:9092/1]: 127.0.0.1:9092/1: ", "[thrd:TxnCoordinator]: TxnCoordinator: ",
                      "[thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap: "):
            clock.now += 0.1
            log.log(logging.ERROR, FMT, "FAIL", "rdkafka#consumer-1", where + refused)
        log.log(logging.WARNING, FMT, "SESSTMOUT", "rdkafka#consumer-1", "[thrd:main]: Consumer group session timed out")
    assert len(caplog.records) == 2, [r.getMessage() for r in caplog.records]
