"""The gateway against a hostile web page and a flooding tenant, over real HTTP: Host names
it does not serve (DNS rebinding) get 400, a tenant's burst over ``--rate-limit`` gets 429
with Retry-After and recovers as its bucket refills (a fake clock, no sleeps), and a JWKS
file holding a private key stops ``harness gateway`` with one line."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from prometheus_client import generate_latest

from harness.observability.prometheus import PrometheusSink
from tests.apps.approvals import approvals
from tests.gateway.helpers import HARNESS, ServerThread, child_env, harness_command, open_settings


class Clock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 5000.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def message(text: str = "hi") -> dict[str, str]:
    return {"text": text, "harness": HARNESS}


# -- Host names (DNS rebinding) -------------------------------------------------------------


def test_a_loopback_gateway_refuses_a_rebound_host_name(tmp_path: Path) -> None:
    # An --open-access gateway on 127.0.0.1 (the default --host): a page of evil.example whose
    # name now resolves to 127.0.0.1 makes the browser send its own name as Host.
    settings = open_settings(f"sqlite:///{tmp_path / 'h.db'}")
    assert settings.host == "127.0.0.1" and settings.allowed_hosts is None
    with ServerThread(settings, harnesses=[approvals]) as server, httpx.Client(base_url=server.url,
                                                                              timeout=30) as http:
        port = server.url.rsplit(":", 1)[1]
        rebound = {"Host": f"evil.example:{port}"}
        r = http.post("/v1/sessions/rebound/messages", headers=rebound, json=message())
        assert r.status_code == 400, r.text
        detail = r.json()["detail"]
        assert "'evil.example:" in detail and "--allowed-hosts" in detail and "\n" not in detail
        assert r.headers["x-frame-options"] == "DENY"  # (the refusal has the security headers too)
        assert http.get("/v1/sessions", headers=rebound).status_code == 400
        assert http.get("/", headers=rebound).status_code == 400  # the console too
        # The loopback names, with any port, are served; the refused POST wrote nothing.
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
            r = http.get("/v1/sessions/rebound", headers={"Host": host})
            assert r.status_code == 404, (host, r.text)
        assert http.post("/v1/sessions/s-1/messages", json=message()).status_code == 200


def test_a_probe_by_pod_ip_is_answered_when_allowed_and_other_hosts_are_not(tmp_path: Path) -> None:
    # As in the chart: bound to 0.0.0.0 behind an ingress, --allowed-hosts names the ingress's
    # host and the pod's IP, which is what the kubelet's probes send as Host.
    settings = open_settings(f"sqlite:///{tmp_path / 'h.db'}", host="0.0.0.0",
                             allowed_hosts=("*.example.com", "10.1.2.3"))
    with ServerThread(settings, harnesses=[approvals]) as server, httpx.Client(base_url=server.url,
                                                                              timeout=30) as http:
        for path in ("/healthz", "/readyz"):
            r = http.get(path, headers={"Host": "10.1.2.3:8080"})
            assert r.status_code == 200, (path, r.text)
        assert http.get("/v1/sessions", headers={"Host": "harness.example.com"}).status_code == 200
        for host in ("10.1.2.4:8080", "example.com", "harness.example.com.evil.example", "127.0.0.1"):
            r = http.get("/healthz", headers={"Host": host})
            assert r.status_code == 400, (host, r.text)
    # Not restricted: bound to a non-loopback address, any Host is served (behind an ingress it varies).
    settings = open_settings(f"sqlite:///{tmp_path / 'h.db'}", host="0.0.0.0")
    with ServerThread(settings, harnesses=[approvals]) as server, httpx.Client(base_url=server.url,
                                                                              timeout=30) as http:
        assert http.get("/healthz", headers={"Host": "10.1.2.4:8080"}).status_code == 200


# -- rate limit ---------------------------------------------------------------------------


@pytest.fixture
def limited(tmp_path: Path) -> tuple[ServerThread, Clock, PrometheusSink]:
    (tmp_path / "keys").write_text("acme key-acme-1234\nglobex key-globex-5678\n")
    settings = open_settings(f"sqlite:///{tmp_path / 'h.db'}", api_keys_file=str(tmp_path / "keys"), rate_limit=1)
    server = ServerThread(settings, harnesses=[approvals])
    server.clock = clock = Clock()
    server.metrics = sink = PrometheusSink()
    return server, clock, sink


def refused_count(sink: PrometheusSink, reason: str = "rate_limit") -> float:
    text = generate_latest(sink.registry).decode()
    series = f'harness_http_rate_limited_total{{reason="{reason}"}} '
    line = next(line for line in text.splitlines() if line.startswith(series))
    return float(line.split()[1])


def test_a_burst_over_the_rate_limit_gets_429_and_recovers(limited: tuple[ServerThread, Clock, PrometheusSink]) -> None:
    server, clock, sink = limited
    acme = {"Authorization": "Bearer key-acme-1234"}
    globex = {"Authorization": "Bearer key-globex-5678"}
    with server, httpx.Client(base_url=server.url, timeout=30) as http:
        # --rate-limit 1: a burst of 2, then one a second.
        for n in range(2):
            r = http.post(f"/v1/sessions/s-{n}/messages", headers=acme, json=message())
            assert r.status_code == 200, r.text
        r = http.post("/v1/sessions/s-refused/messages", headers=acme, json=message())
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
        detail = r.json()["detail"]
        assert "--rate-limit" in detail and "\n" not in detail and "acme" not in detail
        assert refused_count(sink) == 1
        # The refused write wrote nothing; reads are not limited; another tenant has its own bucket.
        assert http.get("/v1/sessions/s-refused", headers=acme).status_code == 404
        assert http.get("/v1/sessions", headers=acme).status_code == 200
        assert http.post("/v1/sessions/g-1/messages", headers=globex, json=message()).status_code == 200
        # A bad key spends no tenant's tokens (it is a 401 before the bucket).
        assert http.post("/v1/sessions/x/messages", headers={"Authorization": "Bearer nope"},
                         json=message()).status_code == 401
        clock.advance(1.0)
        assert http.post("/v1/sessions/s-later/messages", headers=acme, json=message()).status_code == 200
        assert http.post("/v1/sessions/s-later-2/messages", headers=acme, json=message()).status_code == 429
        assert refused_count(sink) == 2
        # The anonymous caller of --open-access is limited by its address.
        for n in range(2):
            assert http.post(f"/v1/sessions/o-{n}/messages", json=message()).status_code == 200
        assert http.post("/v1/sessions/o-2/messages", json=message()).status_code == 429


def test_rate_limit_reads_counts_reads_too_but_never_health(tmp_path: Path) -> None:
    settings = open_settings(f"sqlite:///{tmp_path / 'h.db'}", rate_limit=1, rate_limit_reads=True)
    server = ServerThread(settings, harnesses=[approvals])
    server.clock = clock = Clock()
    with server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert [http.get("/v1/sessions").status_code for _ in range(3)] == [200, 200, 429]
        assert [http.get(path).status_code for path in ("/healthz", "/readyz", "/healthz")] == [200, 200, 200]
        clock.advance(1.0)
        assert http.get("/v1/sessions").status_code == 200


# -- JWKS with a private key ----------------------------------------------------------------


def private_jwks(kind: str) -> tuple[dict[str, object], list[str]]:
    """A JWKS holding one bad key of ``kind`` (kid ``leaked-1``), and its secret parts."""
    if kind == "rsa":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
        secrets = [jwk[m] for m in ("d", "p", "q", "dp", "dq", "qi")]
    elif kind == "ec":
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec.generate_private_key(ec.SECP256R1())))
        secrets = [jwk["d"]]
    else:
        jwk = {"kty": "oct", "k": "c2hhcmVkLXNlY3JldC1mb3ItaHMyNTYtdG9rZW5z"}
        secrets = [jwk["k"]]
    jwk.update({"kid": "leaked-1", "use": "sig"})
    return {"keys": [jwk]}, secrets


@pytest.mark.parametrize("kind", ["rsa", "ec", "oct"])
def test_harness_gateway_refuses_a_jwks_with_a_private_key(tmp_path: Path, kind: str) -> None:
    jwks, secrets = private_jwks(kind)
    (tmp_path / "jwks.json").write_text(json.dumps(jwks))
    done = subprocess.run(harness_command("gateway", "--log", f"sqlite:///{tmp_path / 'h.db'}", "--port", "0",
                                          "--jwks-file", str(tmp_path / "jwks.json")),
                          capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "'leaked-1'" in lines[0] and "JWKS" in lines[0]
    assert ("PRIVATE" if kind != "oct" else "symmetric") in lines[0]
    assert done.stdout == ""  # (never served)
    for secret in secrets:
        assert secret not in done.stderr
