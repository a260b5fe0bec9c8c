"""The gateway's breaker: a read of a log that is down answers at once, until the log answers."""

from __future__ import annotations

import asyncio

import pytest

from harness.errors import FencedError, LogUnavailable
from harness.services.gateway.breaker import LogBreaker, LogDown


class FakeLog:
    def __init__(self) -> None:
        self.down = False
        self.reads = 0
        self.probes = 0

    async def read(self) -> str:
        self.reads += 1
        if self.down:
            raise LogUnavailable("read of t[0] got no answer from the Kafka cluster within 30 s")
        return "records"

    async def probe(self) -> None:
        self.probes += 1
        if self.down:
            raise LogUnavailable("the Kafka cluster at b:9092 did not answer within 5 s")


async def test_a_read_of_a_log_that_answers_passes_through() -> None:
    log = FakeLog()
    breaker = LogBreaker(log.probe, retry_every=0.01)
    assert await breaker.call(log.read) == "records"
    assert not breaker.is_open and log.probes == 0


async def test_once_a_read_finds_the_log_down_the_next_are_refused_without_asking_it() -> None:
    log = FakeLog()
    log.down = True
    breaker = LogBreaker(log.probe, retry_every=0.01)
    with pytest.raises(LogDown, match=r"not answering .*no answer from the Kafka cluster"):
        await breaker.call(log.read)
    assert breaker.is_open and log.reads == 1
    for _ in range(5):
        with pytest.raises(LogDown, match="not answering"):
            await breaker.call(log.read)
    assert log.reads == 1  # refused at once: the log was not asked
    while log.probes < 2:  # the probe keeps asking; it says why it is still down
        await asyncio.sleep(0.01)
    assert breaker.reason is not None and "did not answer within 5 s" in breaker.reason
    log.down = False
    while breaker.is_open:
        await asyncio.sleep(0.01)
    assert await breaker.call(log.read) == "records"
    assert log.reads == 2 and breaker.opened == 1
    await breaker.stop()


async def test_a_read_past_the_deadline_of_a_log_that_does_not_answer_opens_the_breaker() -> None:
    log = FakeLog()
    log.down = True  # the probe gets no answer either
    cancelled = asyncio.Event()

    async def hangs() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return "never"

    breaker = LogBreaker(log.probe, timeout=0.05, retry_every=0.01)
    with pytest.raises(LogDown, match=r"no answer within 0\.05 s and the log does not answer"):
        await breaker.call(hangs)
    await asyncio.sleep(0)  # (the cancel lands at the read's next step)
    assert breaker.is_open and cancelled.is_set()  # the hung read was given up
    log.down = False
    while breaker.is_open:  # the probe answers: closed again
        await asyncio.sleep(0.01)
    assert await breaker.call(log.read) == "records"


async def test_a_long_read_of_a_log_that_answers_goes_on() -> None:
    """A big listing or a long session is slow, not an outage: the probe says the log
    answers, so the read goes on to its end and nothing is refused."""
    log = FakeLog()

    async def slow() -> str:
        await asyncio.sleep(0.2)
        return "all of it"

    breaker = LogBreaker(log.probe, timeout=0.02, retry_every=0.01)
    assert await breaker.call(slow) == "all of it"
    assert log.probes == 1 and not breaker.is_open


async def test_errors_about_the_request_not_the_log_leave_it_closed() -> None:
    async def fenced() -> str:
        raise FencedError("lost the session")

    breaker = LogBreaker(FakeLog().probe)
    with pytest.raises(FencedError):
        await breaker.call(fenced)
    assert not breaker.is_open


def test_retry_after_is_whole_seconds() -> None:
    assert LogBreaker(FakeLog().probe, retry_every=0.2).retry_after_s == 1
    assert LogBreaker(FakeLog().probe, retry_every=2.5).retry_after_s == 3
