"""The gateway's metrics hook: requests counted by route template (never a session id in
a label) with their status, and SSE subscribers up and down."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from tests.apps.approvals import approvals
from tests.gateway.helpers import HARNESS, ServerThread, open_settings, read_events, wait_for


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, int]] = []
        self.subscribers = 0
        self.peak = 0

    def http_request(self, route: str, method: str, status: int, seconds: float) -> None:
        assert seconds >= 0
        with self.lock:
            self.requests.append((route, method, status))

    def sse_subscribers(self, delta: int) -> None:
        with self.lock:
            self.subscribers += delta
            self.peak = max(self.peak, self.subscribers)


def test_requests_and_streams_are_counted(tmp_path: Path) -> None:
    recorder = Recorder()
    server = ServerThread(open_settings(f"sqlite:///{tmp_path / 'h.db'}"), harnesses=[approvals], worker=True)
    server.metrics = recorder
    with server, httpx.Client(base_url=server.url, timeout=30) as http:
        http.post("/v1/sessions/secret-session-42/messages", json={"text": "hello", "harness": HARNESS})
        http.get("/v1/sessions/secret-session-42")
        http.get("/v1/sessions/nobody")
        with http.stream("GET", "/v1/sessions/secret-session-42/events") as response:
            read_events(response, until=lambda evs: len(evs) >= 2)
            assert recorder.subscribers == 1
        wait_for(lambda: recorder.subscribers == 0, timeout=30, what="the stream to be counted out")
    routes = set(recorder.requests)
    assert ("/v1/sessions/{session_id}/messages", "POST", 200) in routes
    assert ("/v1/sessions/{session_id}", "GET", 200) in routes
    assert ("/v1/sessions/{session_id}", "GET", 404) in routes
    assert ("/v1/sessions/{session_id}/events", "GET", 200) in routes
    assert all("secret-session-42" not in route for route, _, _ in recorder.requests)
    assert recorder.peak == 1
