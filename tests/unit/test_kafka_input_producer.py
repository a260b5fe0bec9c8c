"""The input producer's delivery reports survive a caller that stopped waiting."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness.log.kafka import inputs


class _FakeProducer:
    def __init__(self, config: Any) -> None:
        self.reports: list[Any] = []

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.reports.append(kwargs["on_delivery"])

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0

    def close(self) -> None:
        pass


class _Msg:
    def offset(self) -> int:
        return 41


class _Settings:
    def input_producer_config(self) -> dict[str, str]:
        return {}


def test_a_delivery_report_after_the_submitter_was_cancelled_does_not_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    # `harness send` stopped by Ctrl-C while its input was in flight: asyncio.wrap_future
    # cancelled the producer's future, and the delivery report (served by the poll thread,
    # or by close()'s flush) raised InvalidStateError: close() failed with "unexpected
    # error: InvalidStateError", and in a long-lived client the poll thread died.
    monkeypatch.setattr(inputs, "Producer", _FakeProducer)
    producer = inputs.InputProducer(_Settings())  # type: ignore[arg-type]
    try:
        future = producer.produce("t.sessions", value=b"v", key=b"k", headers=[], partition=0)

        async def submit_then_stop() -> None:
            task = asyncio.ensure_future(asyncio.wait_for(asyncio.wrap_future(future), 10))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(submit_then_stop())
        (report,) = producer._producer.reports  # type: ignore[attr-defined]
        report(None, _Msg())  # the broker's acknowledgement arrives: no exception
        assert future.result() == 41
    finally:
        producer.close()
