"""The gateway's metrics: requests counted by route template (never a session id in a
label) with their status, and SSE subscribers up and down; `--metrics-port` serves them
to Prometheus with the gateway's health."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import httpx

from tests.apps.approvals import approvals
from tests.gateway.helpers import (
    APP,
    HARNESS,
    ServerThread,
    open_settings,
    read_events_from,
    start_process,
    wait_for,
)


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
            lines = response.iter_lines()  # kept: dropping the iterator would close the stream
            read_events_from(lines, until=lambda evs: len(evs) >= 2)
            assert recorder.subscribers == 1
        wait_for(lambda: recorder.subscribers == 0, timeout=30, what="the stream to be counted out")
    routes = set(recorder.requests)
    assert ("/v1/sessions/{session_id}/messages", "POST", 200) in routes
    assert ("/v1/sessions/{session_id}", "GET", 200) in routes
    assert ("/v1/sessions/{session_id}", "GET", 404) in routes
    assert ("/v1/sessions/{session_id}/events", "GET", 200) in routes
    assert all("secret-session-42" not in route for route, _, _ in recorder.requests)
    assert recorder.peak == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_harness_serve_metrics_port_serves_prometheus_and_its_health(tmp_path: Path) -> None:
    port = free_port()
    proc = start_process(["serve", "--log", "sqlite:///h.db", "--app", APP, "--open-access", "--port", "0",
                          "--metrics-port", str(port), "--heartbeat", "1"], ready="serve ready", cwd=tmp_path)
    try:
        with httpx.Client(base_url=proc.url, timeout=30) as http:
            http.post("/v1/sessions/secret-session-7/messages", json={"text": "hello", "harness": HARNESS})
            http.get("/v1/sessions/secret-session-7")
            with http.stream("GET", "/v1/sessions/secret-session-7/events") as response:
                lines = response.iter_lines()  # kept: dropping the iterator would close the stream
                read_events_from(lines, until=lambda evs: len(evs) >= 2)
                scrape = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
                assert "harness_sse_subscribers 1.0" in scrape
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
        assert (ready.status_code, ready.text) == (200, "ready\n")
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        scrape = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert ('harness_http_requests_total{code="200",method="POST",route="/v1/sessions/{session_id}/messages"} 1.0'
                in scrape)
        assert "secret-session-7" not in scrape  # a session id is never a label
    finally:
        assert proc.stop() == 0, proc.stderr()
