"""Host-header edge cases a new user meets, against the real ``harness gateway``: an
HTTP/1.0 request with no Host (or an empty one) is told what is missing, not to add a
name to ``--allowed-hosts``; ``--allowed-hosts`` given a URL, a bracketed IPv6 address
with a port, or ``*.`` stops the start with one line saying what to give instead."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.gateway.helpers import child_env, harness_command, start_process


def raw_request(url: str, request: bytes) -> str:
    """``request`` sent as is (no client adds a Host), the whole answer read back."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode("latin-1")


def test_a_request_without_a_host_is_told_what_is_missing(tmp_path: Path) -> None:
    server = start_process(["gateway", "--log", f"sqlite:///{tmp_path / 'h.db'}", "--port", "0", "--open-access"],
                           ready="gateway ready")
    try:
        for request in (b"GET /v1/harnesses HTTP/1.0\r\n\r\n",
                        b"GET /v1/harnesses HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n"):
            answer = raw_request(server.url, request)
            assert answer.startswith("HTTP/1.1 400"), answer
            body = answer.split("\r\n\r\n", 1)[1]
            assert "without a Host header" in body, body
            assert "add the name" not in body  # (there is no name to add)
        # With its Host, the same request is served.
        answer = raw_request(server.url, b"GET /v1/harnesses HTTP/1.0\r\nHost: localhost\r\n\r\n")
        assert answer.startswith("HTTP/1.1 200"), answer
    finally:
        assert server.stop() == 0, server.stderr()


@pytest.mark.parametrize(("given", "said"), [
    ("http://localhost", "is a URL: give the host alone ('localhost'"),
    ("https://harness.example.com:8443/", "is a URL: give the host alone ('harness.example.com'"),
    ("[::1]:8080", "has a port"),
    ("[::1", "is not a host name or an IP address"),
    ("*.", "a '*' is only allowed as '*' (any host) or '*.example.com'"),
])
def test_allowed_hosts_that_would_never_match_stop_the_start(tmp_path: Path, given: str, said: str) -> None:
    done = subprocess.run(harness_command("gateway", "--log", f"sqlite:///{tmp_path / 'h.db'}", "--port", "0",
                                          "--open-access", "--allowed-hosts", given),
                          capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_a_gateway_on_the_ipv6_loopback_prints_a_url_that_works(tmp_path: Path) -> None:
    # It printed 'url=http://::1:PORT', which no browser or client takes.
    server = start_process(["gateway", "--log", f"sqlite:///{tmp_path / 'h.db'}", "--port", "0", "--open-access",
                            "--host", "::1"], ready="gateway ready")
    try:
        assert server.url.startswith("http://[::1]:"), server.url
        line = next(line for line in server.lines if line.startswith("gateway ready"))
        assert f"console={server.url}/" in line
        with httpx.Client(timeout=30) as http:
            r = http.get(f"{server.url}/v1/harnesses")  # (Host: [::1]:PORT, a loopback name)
            assert r.status_code == 200, r.text
    finally:
        assert server.stop() == 0, server.stderr()
