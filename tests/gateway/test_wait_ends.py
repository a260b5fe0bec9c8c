"""A ``?wait`` POST ends with its client or its server: a client that goes away frees its
tenant's slot at once, and a server that stops answers every open wait ``running`` (no 500,
no traceback), over real HTTP (a raw socket, so the test decides when the client leaves).

Whether a wait holds its slot is seen from outside with ``--max-waits-per-tenant 1``: a
second ``?wait`` POST whose message the gateway refuses before writing (an unknown harness)
gets 429 while the slot is held, and its plain refusal (200) once it is free.
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.apps.approvals import approvals
from tests.gateway.helpers import APP, HARNESS, ServerThread, open_settings, start_process, wait_for


def open_wait(url: str, session_id: str, text: str, wait: float) -> socket.socket:
    """A ``POST .../messages?wait=`` sent on a socket of its own; the answer is read later."""
    parts = urlsplit(url)
    body = json.dumps({"text": text, "harness": HARNESS, "input_id": f"{session_id}-in"}).encode()
    sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
    sock.sendall(f"POST /v1/sessions/{session_id}/messages?wait={wait} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the one answer on ``sock`` (read until the server closes it,
    or its Content-Length is in)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "-1"))
    while len(body) < length or length < 0:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def wait_slot_held(http: httpx.Client) -> bool:
    """Whether this tenant's one ``?wait`` slot is held (see the module's docstring)."""
    r = http.post("/v1/sessions/probe/messages", params={"wait": 1}, json={"text": "hi", "harness": "no/such"})
    assert r.status_code in (200, 429), r.text
    if r.status_code == 200:
        assert r.json()["code"] == "unknown_harness"  # refused before any write: it held no slot for long
    return r.status_code == 429


def test_a_client_that_leaves_its_wait_frees_its_slot(tmp_path: Path) -> None:
    settings = open_settings(f"sqlite:///{tmp_path / 'h.db'}", max_waits_per_tenant=1)
    with ServerThread(settings, harnesses=[approvals], worker=True) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        sock = open_wait(server.url, "leave-1", "take a nap", 600)  # the turn sleeps 600 s
        wait_for(lambda: wait_slot_held(http), timeout=30, what="the ?wait POST to hold its slot")
        sock.close()  # as `curl -m 1` does: the client gives up
        wait_for(lambda: not wait_slot_held(http), timeout=30, what="the slot to be freed when its client left")
        # The turn goes on without the client; a new ?wait is served.
        assert http.get("/v1/sessions/leave-1").json()["summary"]["state"] in ("running", "sleeping")
        r = http.post("/v1/sessions/leave-2/messages", params={"wait": 20}, json={"text": "hello", "harness": HARNESS})
        assert r.status_code == 200 and r.json()["settlement"] == {"outcome": "completed", "text": "echo: hello"}


def test_stopping_the_server_answers_open_waits_running(tmp_path: Path) -> None:
    proc = start_process(["serve", "--log", "sqlite:///h.db", "--app", APP, "--open-access", "--port", "0",
                          "--max-waits-per-tenant", "1"], ready="serve ready", cwd=tmp_path)
    try:
        with httpx.Client(base_url=proc.url, timeout=30) as http:
            sock = open_wait(proc.url, "stop-1", "take a nap", 60)
            wait_for(lambda: wait_slot_held(http), timeout=30, what="the ?wait POST to hold its slot")
            proc.proc.send_signal(signal.SIGTERM)
            with sock:
                status, headers, body = read_answer(sock)
        assert proc.proc.wait(timeout=60) == 0
    finally:
        proc.stop()
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    out: dict[str, Any] = json.loads(body)
    # The receipt as a wait that timed out gives it: the input is in the log, its turn goes on.
    assert out["input_id"] == "stop-1-in" and out["status"] == "accepted" and out["position"] > 0
    assert out["settlement"] == {"outcome": "running"}
    err = proc.stderr()
    assert "Traceback" not in err and "CancelledError" not in err and "timeout graceful shutdown" not in err, err
