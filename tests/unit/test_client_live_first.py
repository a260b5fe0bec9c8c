"""``HarnessClient.events(sid, live=True)`` as a client's first call on Kafka: the sessions
topic's partition count is not known until the log starts, and the call raised
RuntimeError ('await start() first') instead of starting it (a watcher that opens its
stream before it sends, as a page does, had no way in). No broker: the log's start and
the live topic reader are stood in for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import harness.live.kafka as live_kafka
from harness.client import HarnessClient
from harness.live import LiveEvent
from harness.records import LogEntry


async def test_live_events_as_the_first_call_starts_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    client = HarnessClient(bootstrap="127.0.0.1:9", topic_prefix="first-call")
    log: Any = client.log
    started: list[bool] = []

    async def start() -> None:  # what a reachable broker's start does: learn the partition count
        log._partitions_known = True
        log._started = True
        started.append(True)

    asked: dict[str, Any] = {}

    async def fake_live(**kw: Any) -> AsyncIterator[LiveEvent]:
        asked.update(kw)
        yield LiveEvent(session_id=kw["session_id"], turn=1, index=0, retry=0, position=0, text="hi", ts=1)

    async def no_records(session_id: str, after: int | None = None, types: Any = None) -> AsyncIterator[LogEntry]:
        await asyncio.Event().wait()
        yield  # type: ignore[misc]

    monkeypatch.setattr(log, "start", start)
    monkeypatch.setattr(live_kafka, "kafka_live_events", fake_live)
    monkeypatch.setattr(client, "_committed_events", no_records)
    try:
        before = int(__import__("time").time() * 1000)
        events = client.events("s-1", live=True)  # raised RuntimeError here
        got = await asyncio.wait_for(anext(aiter(events)), 10)  # type: ignore[arg-type]
        await events.aclose()  # type: ignore[attr-defined]
        assert isinstance(got, LiveEvent) and got.text == "hi"
        assert started == [True]
        assert asked["partition"] == log.partition_for("s-1")
        assert before <= asked["since_ms"] <= before + 5_000  # the time of the call, not of the first read
    finally:
        await client.close()
