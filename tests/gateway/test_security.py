"""The gateway under attack, over real HTTP: tenant claims that cannot name a tenant, odd
API key files, security headers, and the streams and waiting requests one tenant may hold
(bounded with a 429, never the gateway's memory and sockets)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.services.gateway.auth import Authenticator, AuthError, GatewayConfigError
from harness.services.gateway.middleware import CONSOLE_CSP
from harness.services.gateway.settings import GatewaySettings
from tests.apps.approvals import approvals
from tests.gateway.helpers import (
    HARNESS,
    ServerThread,
    open_settings,
    read_events,
    read_events_from,
    wait_for,
)

SECRET = "s3cret-for-hs256-security-tests-0123456789"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def raw_hs_token(payload_json: str) -> str:
    """An HS256 JWT over a payload given as JSON text (so it may hold what json.dumps would not write)."""
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64(payload_json.encode("utf-8"))
    sig = hmac.new(SECRET.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(sig)}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[ServerThread]:
    (tmp_path / "secret").write_text(SECRET + "\n")
    (tmp_path / "keys").write_text("acme key-acme-1234\nglobex key-globex-5678\n")
    settings = GatewaySettings(log=f"sqlite:///{tmp_path / 'h.db'}", jwt_secret_file=str(tmp_path / "secret"),
                               api_keys_file=str(tmp_path / "keys"), heartbeat_s=0.2,
                               max_streams_per_tenant=2, max_waits_per_tenant=1)
    with ServerThread(settings, harnesses=[approvals], worker=True) as server:
        yield server


ACME = bearer("key-acme-1234")
GLOBEX = bearer("key-globex-5678")


@pytest.mark.parametrize("tenant_json", [
    r'"\ud800"',  # a lone surrogate: valid JSON, no UTF-8 (was a 500 on every write)
    r'"acme\nglobex"',
    r'"acme\u0000"',
    json.dumps("x" * 300),
])
def test_a_tenant_claim_that_cannot_name_a_tenant_is_a_401(secured: ServerThread, tenant_json: str) -> None:
    token = raw_hs_token(f'{{"exp": {int(time.time()) + 600}, "tenant": {tenant_json}}}')
    with httpx.Client(base_url=secured.url, timeout=30) as http:
        for r in (http.get("/v1/sessions", headers=bearer(token)),
                  http.post("/v1/sessions/s-1/messages", headers=bearer(token), json={"text": "hi", "harness": HARNESS}),
                  http.get("/v1/sessions/s-1/events", headers=bearer(token))):
            assert r.status_code == 401, r.text
            assert "cannot name a tenant" in r.json()["detail"]
        # a tenant claim that is text is taken as it is, '/' and '..' included (percent-encoded in the log)
        for tenant in ("a/b", "..", "t/other", "a%2Fb"):
            token = raw_hs_token(json.dumps({"exp": int(time.time()) + 600, "tenant": tenant}))
            assert http.get("/v1/sessions", headers=bearer(token)).status_code == 200


def test_an_api_keys_file_giving_one_key_to_two_tenants_is_refused(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("acme shared-key-1\nglobex shared-key-1\n")
    with pytest.raises(GatewayConfigError) as caught:
        Authenticator(GatewaySettings(log="memory:", api_keys_file=str(keys)))
    assert ":2: this key is given to tenant 'acme' too" in str(caught.value)
    assert "shared-key-1" not in str(caught.value)  # never the key itself
    keys.write_text("acme key-1\nacme key-1\n")  # the same line twice is no conflict
    assert Authenticator(GatewaySettings(log="memory:", api_keys_file=str(keys))).authenticate("Bearer key-1").tenant == "acme"


def test_an_api_keys_file_with_a_bom_and_crlf_lines_names_the_tenants_it_says(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_bytes("\ufeffacme key-1\r\n# globex\r\n\tglobex\tkey-2 \r\n".encode())
    auth = Authenticator(GatewaySettings(log="memory:", api_keys_file=str(keys)))
    assert auth.authenticate("Bearer key-1").tenant == "acme"  # not '\ufeffacme', another tenant
    assert auth.authenticate("Bearer key-2").tenant == "globex"
    with pytest.raises(AuthError):
        auth.authenticate("Bearer key-3")


def test_security_headers_on_the_console_and_the_api(secured: ServerThread) -> None:
    with httpx.Client(base_url=secured.url, timeout=30) as http:
        for path, headers in [("/", {}), ("/console/app.js", {}), ("/v1/sessions", ACME), ("/v1/sessions", {}),
                              ("/v1/sessions/nope", ACME), ("/healthz", {}), ("/openapi.json", {})]:
            r = http.get(path, headers=headers)
            assert r.headers["x-content-type-options"] == "nosniff", path
            assert r.headers["x-frame-options"] == "DENY", path
            assert r.headers["referrer-policy"] == "no-referrer", path
            csp = r.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in csp, path
            assert csp == CONSOLE_CSP if path in ("/", "/console/app.js") else csp.startswith("default-src 'none'"), path
            assert "access-control-allow-origin" not in r.headers, path
        assert "'unsafe-inline'" not in CONSOLE_CSP and "script-src 'self'" in CONSOLE_CSP
        # a cross-origin page cannot send JSON: its preflight is refused, and no CORS header comes
        pre = http.options("/v1/sessions/s-1/messages", headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization"})
        assert pre.status_code >= 400 and "access-control-allow-origin" not in pre.headers
        # ... and what a form may send without one is not taken
        r = http.post("/v1/sessions/s-1/messages", headers={**ACME, "Content-Type": "text/plain"},
                      content=json.dumps({"text": "hi", "harness": HARNESS}))
        assert r.status_code == 415


def _open_stream(url: str, headers: dict[str, str], opened: list[Any], stop: threading.Event) -> None:
    """Hold an event stream open (until ``stop``) once its hello came; a refusal's response goes to ``opened``."""
    with httpx.Client(base_url=url, timeout=30) as http, http.stream("GET", "/v1/sessions/s-1/events",
                                                                      headers=headers) as r:
        if r.status_code != 200:
            r.read()
            opened.append(r)
            return
        lines = r.iter_lines()
        read_events_from(lines, until=lambda evs: any(e.event == "hello" for e in evs))
        opened.append(r)
        while not stop.is_set():
            next(lines)  # heartbeats every 0.2 s


def test_event_streams_per_tenant_are_bounded_with_a_429(secured: ServerThread) -> None:
    stop = threading.Event()
    opened: list[Any] = []
    threads = [threading.Thread(target=_open_stream, args=(secured.url, ACME, opened, stop), daemon=True)
               for _ in range(2)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: len(opened) == 2, timeout=30, what="two streams of acme to open")
        assert [r.status_code for r in opened] == [200, 200]
        with httpx.Client(base_url=secured.url, timeout=30) as http:
            r = http.get("/v1/sessions/s-1/events", headers=ACME)
            assert r.status_code == 429, r.text
            assert "too many open event streams at once for this tenant (at most 2" in r.json()["detail"]
            assert r.headers["retry-after"]
            # another tenant is not held back by acme's streams
            with http.stream("GET", "/v1/sessions/s-1/events", headers=GLOBEX) as other:
                assert other.status_code == 200
                read_events(other, until=lambda evs: any(e.event == "hello" for e in evs))
        stop.set()
        for t in threads:
            t.join(timeout=30)

        def can_open_again() -> bool:
            with httpx.Client(base_url=secured.url, timeout=30) as http, \
                    http.stream("GET", "/v1/sessions/s-1/events", headers=ACME) as again:
                return again.status_code == 200
        wait_for(can_open_again, timeout=30, what="a closed stream to give its slot back")
        assert secured.state is not None
        wait_for(lambda: not secured.state.stream_slots.held, timeout=30, what="every slot to be released")
    finally:
        stop.set()


def test_waiting_requests_per_tenant_are_bounded_with_a_429_before_anything_is_written(secured: ServerThread) -> None:
    with httpx.Client(base_url=secured.url, timeout=60) as http:
        # a turn that naps for 600 s: the first ?wait holds its slot for its seconds
        holder = threading.Thread(target=lambda: http.post(
            "/v1/sessions/s-1/messages?wait=3", headers=ACME,
            json={"text": "nap", "harness": HARNESS, "input_id": "in-1"}), daemon=True)
        holder.start()
        assert secured.state is not None
        wait_for(lambda: secured.state.wait_slots.held.get("acme") == 1, timeout=30, what="the first wait")
        r = http.post("/v1/sessions/s-2/messages?wait=3", headers=ACME,
                      json={"text": "hello", "harness": HARNESS, "input_id": "in-2"})
        assert r.status_code == 429, r.text
        assert "too many requests waiting (?wait=) at once for this tenant (at most 1" in r.json()["detail"]
        assert http.get("/v1/sessions/s-2", headers=ACME).status_code == 404  # nothing was written
        # without ?wait, and for another tenant, it goes on
        assert http.post("/v1/sessions/s-2/messages", headers=ACME,
                         json={"text": "hello", "harness": HARNESS}).status_code == 200
        assert http.post("/v1/sessions/s-2/messages?wait=1", headers=GLOBEX,
                         json={"text": "hello", "harness": HARNESS}).status_code == 200
        holder.join(timeout=30)
        wait_for(lambda: not secured.state.wait_slots.held, timeout=30, what="the wait's slot to be released")
        assert http.post("/v1/sessions/s-2/messages?wait=1", headers=ACME,
                         json={"text": "again", "harness": HARNESS}).status_code == 200


def test_open_access_counts_the_anonymous_caller_as_one_tenant(tmp_path: Path) -> None:
    settings = open_settings(f"sqlite:///{tmp_path / 'h.db'}", max_streams_per_tenant=1)
    with ServerThread(settings, harnesses=[approvals], worker=True) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http, \
            http.stream("GET", "/v1/sessions/s-1/events") as first:
        # Keep the iterator: a line iterator dropped half-way closes the connection (httpcore),
        # and a closed stream gives its slot back.
        lines = first.iter_lines()
        read_events_from(lines, until=lambda evs: any(e.event == "hello" for e in evs))
        with http.stream("GET", "/v1/sessions/s-2/events") as second:  # (a 200 would never end)
            assert second.status_code == 429
        assert next(lines) is not None  # the first is still open
