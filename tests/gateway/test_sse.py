"""SSE over real HTTP: hello first, one event per record (id = position), heartbeats,
and a stream cut mid-way resumed with Last-Event-ID: no gap, no duplicate. SQLite (gateway
+ worker in one process) and Kafka (the gateway alone; a `harness worker` process)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.ids import tenant_session_id
from harness.log import open_log
from harness.services.gateway.sources import LogEventSource
from tests.apps.approvals import approvals
from tests.gateway.helpers import (
    APP,
    HARNESS,
    Event,
    Process,
    ServerThread,
    open_settings,
    read_events,
    settled,
    start_process,
    wait_for,
)


def log_positions(url: str, session_id: str) -> list[int]:
    async def read() -> list[int]:
        log = open_log(url)
        try:
            return [e.seq for e in await log.read(session_id)]
        finally:
            await log.close()

    return asyncio.run(read())


def cut_and_resume(http: httpx.Client, log_url: str, sid: str, *, use_header: bool) -> None:
    """Stream a session while it runs, cut the stream mid-way, resume; the union is the log."""
    assert http.post(f"/v1/sessions/{sid}/messages",
                     json={"text": "please approve", "harness": HARNESS, "input_id": "m1"}).json()["status"] == "accepted"
    first: list[Event] = []
    with http.stream("GET", f"/v1/sessions/{sid}/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        first = read_events(response, until=lambda evs: any(e.event == "harness.ask.opened" for e in evs))
    assert first[0].event == "hello" and first[0].id is None and first[0].data["session_id"] == sid
    records = [e for e in first if e.id is not None]
    ask = next(e for e in records if e.event == "harness.ask.opened")
    assert ask.data["data"]["session_id"] == sid  # the caller's id, never the log's
    # the stream is cut: meanwhile the turn goes on and another message comes
    answer = {"tool_call_id": ask.data["data"]["tool_call_id"], "name": "approval", "value": {"approved": True}}
    assert http.post(f"/v1/sessions/{sid}/answers", json=answer).json()["status"] == "accepted"
    assert http.post(f"/v1/sessions/{sid}/messages", json={"text": "hello", "input_id": "m2"}).json()["status"] in (
        "accepted", "queued")
    last = records[-1].id
    assert last is not None
    if use_header:
        request = http.stream("GET", f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": str(last)})
    else:
        request = http.stream("GET", f"/v1/sessions/{sid}/events", params={"after": last})
    with request as response:
        second = read_events(response, until=lambda evs: settled(evs, "m2"))
    assert second[0].event == "hello" and second[0].data["after"] == last
    seen = [e.id for e in records] + [e.id for e in second if e.id is not None]
    assert len(seen) == len(set(seen)), "a record was sent twice"
    assert seen == sorted(seen)
    log_sid = tenant_session_id(None, sid)
    on_log = log_positions(log_url, log_sid)
    assert seen == on_log[: len(seen)], "the streams together are not the log (a gap)"
    assert seen[-1] == on_log[-1] or settled(second, "m2")


def test_sse_cut_and_resume_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with ServerThread(open_settings(url), harnesses=[approvals], worker=True) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        cut_and_resume(http, url, "sse-1", use_header=True)
        cut_and_resume(http, url, "sse-2", use_header=False)


def test_sse_heartbeats_while_idle_and_404_for_unknown(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with ServerThread(open_settings(url, heartbeat_s=0.1), harnesses=[approvals], worker=True) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/v1/sessions/nobody/events").status_code == 404
        http.post("/v1/sessions/hb/messages", json={"text": "hello", "harness": HARNESS, "input_id": "x"})
        wait_for(lambda: http.get("/v1/sessions/hb").json()["summary"]["state"] == "idle", timeout=30, what="idle")
        comments: list[str] = []
        with http.stream("GET", "/v1/sessions/hb/events", headers={"Last-Event-ID": "999999"}) as response:
            events = read_events(response, until=lambda evs: len(comments) >= 2, comments=comments)
        assert [e.event for e in events] == ["hello"]  # nothing after the given position
        assert comments[:2] == [": heartbeat", ": heartbeat"]
        assert http.get("/v1/sessions/hb/events", headers={"Last-Event-ID": "abc"}).status_code == 422


@pytest.fixture
def kafka_gateway(kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> Iterator[tuple[str, str, Process]]:
    url = f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}&partitions=2"
    worker = start_process(["worker", "--log", url, "--app", APP], ready="worker ready")
    try:
        with ServerThread(open_settings(url)) as server:
            yield url, server.url, worker
    finally:
        worker.stop()


@pytest.mark.kafka
def test_sse_cut_and_resume_kafka(kafka_gateway: tuple[str, str, Process]) -> None:
    url, base, _worker = kafka_gateway
    with httpx.Client(base_url=base, timeout=60) as http:
        cut_and_resume(http, url, "k-1", use_header=True)
        # a second session in the same process shares the partition readers
        cut_and_resume(http, url, "k-2", use_header=False)


class LiveFeed(LogEventSource):
    """The log's records plus live events pushed by the test (a stand-in for the live
    channel of streaming models, which publishes text deltas that are never logged)."""

    def __init__(self, log: Any) -> None:
        super().__init__(log)
        self.queue: asyncio.Queue[dict[str, Any]] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def live(self, session_id: str) -> AsyncIterator[dict[str, Any]]:
        self.loop = asyncio.get_running_loop()
        self.queue = asyncio.Queue()
        while True:
            yield await self.queue.get()

    def push(self, event: dict[str, Any]) -> None:
        assert self.loop is not None and self.queue is not None
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


def test_live_events_are_forwarded_without_an_id(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    log = open_log(url)
    feed = LiveFeed(log)
    server = ServerThread(open_settings(url), harnesses=[approvals], worker=True, log=log)
    server.events = feed
    with server, httpx.Client(base_url=server.url, timeout=30) as http:
        http.post("/v1/sessions/lv/messages", json={"text": "hello", "harness": HARNESS, "input_id": "x"})
        with http.stream("GET", "/v1/sessions/lv/events") as response:
            def until(evs: list[Event]) -> bool:
                if settled(evs, "x") and feed.queue is not None and not any(e.event == "model.text.delta" for e in evs):
                    feed.push({"type": "model.text.delta", "session_id": "t/x/lv", "turn": 2, "index": 0,
                               "position": 0, "text": "Hel"})
                return any(e.event == "model.text.delta" for e in evs)

            events = read_events(response, until=until)
    delta = events[-1]
    assert delta.id is None and delta.data["text"] == "Hel" and delta.data["session_id"] == "lv"
    assert all(e.id is not None for e in events[1:-1])
    asyncio.run(log.close())
