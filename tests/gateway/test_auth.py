"""Auth and tenants over real HTTP: JWT HS256, RS256 from a JWKS file, an API-key file,
--open-access only when asked for, and tenant isolation on every endpoint."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from harness.log import open_log
from harness.services.gateway.auth import Authenticator, AuthError
from harness.services.gateway.settings import GatewaySettings
from tests.apps.approvals import approvals
from tests.gateway.helpers import HARNESS, ServerThread, child_env, harness_command, read_events, wait_for

ISSUER = "https://id.example.test"
AUDIENCE = "harness-gateway"
SECRET = "s3cret-for-hs256-tests-0123456789abcdef"


def hs_token(tenant: str | None = "acme", *, secret: str = SECRET, **claims: Any) -> str:
    body: dict[str, Any] = {"iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 600, **claims}
    if tenant is not None:
        body["tenant"] = tenant
    return jwt.encode({k: v for k, v in body.items() if v is not None}, secret, algorithm="HS256")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def auth_files(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "secret").write_text(SECRET + "\n")
    (tmp_path / "keys").write_text("# tenant key\nacme key-acme-1234\nglobex key-globex-5678\n")
    return {"secret": tmp_path / "secret", "keys": tmp_path / "keys"}


@pytest.fixture
def secured(tmp_path: Path, auth_files: dict[str, Path]) -> Iterator[ServerThread]:
    settings = GatewaySettings(
        log=f"sqlite:///{tmp_path / 'h.db'}",
        jwt_secret_file=str(auth_files["secret"]),
        jwt_issuer=ISSUER,
        jwt_audience=AUDIENCE,
        api_keys_file=str(auth_files["keys"]),
        heartbeat_s=0.2,
        auth_failure_limit=0,  # (these tests send many wrong credentials from one address: test_auth_limit)
    )
    with ServerThread(settings, harnesses=[approvals], worker=True) as server:
        yield server


def test_missing_or_bad_credentials_are_401(secured: ServerThread) -> None:
    with httpx.Client(base_url=secured.url) as http:
        r = http.get("/v1/sessions")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert http.get("/healthz").status_code == 200  # probes need no token
        assert http.get("/").status_code == 200  # nor does the console page (its API calls do)
        bad = [
            "Basic abc",
            "Bearer",
            "Bearer key-unknown",
            f"Bearer {hs_token(exp=int(time.time()) - 10)}",
            f"Bearer {hs_token(iss='https://other.test')}",
            f"Bearer {hs_token(aud='someone-else')}",
            f"Bearer {hs_token(tenant=None)}",
            f"Bearer {hs_token(exp=None)}",
            f"Bearer {hs_token(secret='another-secret-of-enough-length-0123')}",
            "Bearer " + jwt.encode({"tenant": "acme", "exp": int(time.time()) + 60}, None, algorithm="none"),  # type: ignore[arg-type]
        ]
        for header in bad:
            r = http.get("/v1/sessions", headers={"Authorization": header})
            assert r.status_code == 401, header
            assert SECRET not in r.text and "key-" not in r.text
        unknown = http.get("/v1/sessions", headers=bearer("key-WRONG")).json()["detail"]
        assert unknown == "unknown API key, and not a JWT"  # (not the JWT library's "Not enough segments")
        assert http.get("/v1/sessions", headers=bearer(hs_token())).status_code == 200
        assert http.get("/v1/sessions", headers=bearer("key-acme-1234")).status_code == 200


def test_tenants_are_isolated_on_every_endpoint(secured: ServerThread, tmp_path: Path) -> None:
    acme = bearer(hs_token("acme"))
    globex = bearer("key-globex-5678")  # an API key of another tenant
    with httpx.Client(base_url=secured.url, timeout=30) as http:
        r = http.post("/v1/sessions/shared/messages", headers=acme,
                      json={"text": "please approve", "harness": HARNESS, "input_id": "a1"})
        assert r.json()["status"] == "accepted"
        d = wait_for(lambda: (x := http.get("/v1/sessions/shared", headers=acme).json())["open_asks"] and x,
                     timeout=30, what="acme's ask")
        ask = d["open_asks"][0]
        # every endpoint: the foreign tenant gets 404, whatever the id it guesses
        for sid in ("shared", "t", "t%2Facme%2Fshared"):
            assert http.get(f"/v1/sessions/{sid}", headers=globex).status_code in (404, 422)
        assert http.get("/v1/sessions/shared", headers=globex).status_code == 404
        # globex's stream of "shared" is of globex's own session (none yet): nothing of acme's comes
        with http.stream("GET", "/v1/sessions/shared/events", headers=globex) as response:
            comments: list[str] = []
            events = read_events(response, until=lambda evs: len(comments) >= 2, comments=comments)
        assert [e.event for e in events] == ["hello"]
        assert http.post("/v1/sessions/shared/answers", headers=globex,
                         json={"tool_call_id": ask["tool_call_id"], "name": "approval",
                               "value": {"approved": True}}).status_code == 404
        assert http.post("/v1/sessions/shared/records", headers=globex,
                         json={"records": [{"type": "x.y"}]}).status_code == 404
        assert http.post("/v1/sessions/shared/cancel", headers=globex, json={"input_id": "a1"}).status_code == 404
        assert http.get("/v1/sessions", headers=globex).json()["sessions"] == []
        # the same session id is another session for globex
        r = http.post("/v1/sessions/shared/messages", headers=globex,
                      json={"text": "hello", "harness": HARNESS, "input_id": "a1"})
        assert r.json()["status"] == "accepted"  # not input_conflict: acme's a1 is not globex's
        wait_for(lambda: http.get("/v1/sessions/shared", headers=globex).json()["summary"]["state"] == "idle",
                 timeout=30, what="globex's turn")
        mine = http.get("/v1/sessions/shared", headers=acme).json()
        assert mine["summary"]["state"] == "waiting"
        assert all(m["content"] != "hello" for m in mine["transcript"])
        assert [s["session_id"] for s in http.get("/v1/sessions", headers=acme).json()["sessions"]] == ["shared"]

    async def ids() -> list[str]:
        log = open_log(f"sqlite:///{tmp_path / 'h.db'}")
        try:
            return sorted(await log.sessions())  # type: ignore[attr-defined]
        finally:
            await log.close()

    assert asyncio.run(ids()) == ["t/acme/shared", "t/globex/shared"]  # the tenant is in the log's key


def test_rs256_from_a_jwks_file(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": "k1", "use": "sig", "alg": "RS256"})
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    settings = GatewaySettings(log=f"sqlite:///{tmp_path / 'h.db'}", jwks_file=str(tmp_path / "jwks.json"),
                               tenant_claim="org")
    exp = int(time.time()) + 600
    good = jwt.encode({"org": "initech", "exp": exp}, key, algorithm="RS256", headers={"kid": "k1"})
    forged = jwt.encode({"org": "initech", "exp": exp}, other, algorithm="RS256", headers={"kid": "k1"})
    unknown_kid = jwt.encode({"org": "initech", "exp": exp}, key, algorithm="RS256", headers={"kid": "k2"})
    hs = jwt.encode({"org": "initech", "exp": exp}, SECRET, algorithm="HS256")
    with ServerThread(settings, harnesses=[approvals]) as server, httpx.Client(base_url=server.url) as http:
        assert http.get("/v1/sessions", headers=bearer(good)).status_code == 200
        for token in (forged, unknown_kid, hs):
            assert http.get("/v1/sessions", headers=bearer(token)).status_code == 401
        r = http.post("/v1/sessions/s/messages", headers=bearer(good), json={"text": "hi", "harness": HARNESS})
        assert r.json()["status"] == "accepted"


def test_open_access_must_be_asked_for(tmp_path: Path) -> None:
    cmd = harness_command("gateway", "--log", f"sqlite:///{tmp_path / 'h.db'}")
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == 2
    assert "--open-access" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run(harness_command("gateway", "--log", f"sqlite:///{tmp_path / 'h.db'}",
                                          "--api-keys-file", str(tmp_path / "missing")),
                          capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == 2 and "cannot read the API keys file" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_open_access_anonymous_sees_only_untenanted_sessions(tmp_path: Path, auth_files: dict[str, Path]) -> None:
    settings = GatewaySettings(log=f"sqlite:///{tmp_path / 'h.db'}", open_access=True,
                               api_keys_file=str(auth_files["keys"]))
    with ServerThread(settings, harnesses=[approvals]) as server, httpx.Client(base_url=server.url) as http:
        http.post("/v1/sessions/a/messages", headers=bearer("key-acme-1234"), json={"text": "x", "harness": HARNESS})
        http.post("/v1/sessions/b/messages", json={"text": "x", "harness": HARNESS})
        assert [s["session_id"] for s in http.get("/v1/sessions").json()["sessions"]] == ["b"]
        assert http.get("/v1/sessions/a").status_code == 404
        assert [s["session_id"] for s in http.get("/v1/sessions", headers=bearer("key-acme-1234")).json()["sessions"]
                ] == ["a"]


def publish(folder: Path, version: str, files: dict[str, str]) -> None:
    """A Secret's new version as the kubelet publishes it: a timestamped folder, then
    ``..data`` swapped to it in one rename; the keys are links through ``..data``."""
    data = folder / f"..{version}"
    data.mkdir(parents=True)
    for name, text in files.items():
        (data / name).write_text(text)
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")
    (folder / "..data_tmp").symlink_to(data.name)
    (folder / "..data_tmp").replace(folder / "..data")


def rs_jwk(key: rsa.RSAPrivateKey, kid: str) -> dict[str, Any]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": kid, "use": "sig", "alg": "RS256"})
    return jwk


def test_rotated_auth_files_are_read_again_without_a_restart(tmp_path: Path) -> None:
    """A Kubernetes Secret rotated under a running gateway: a revoked API key stops
    working, a new one and a JWKS key added for the next signing key start working."""
    old_signer = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    new_signer = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    mount = tmp_path / "gateway-auth"
    publish(mount, "2026_01_01_v1", {"keys": "acme key-acme-OLD-1234\n",
                                      "jwks.json": json.dumps({"keys": [rs_jwk(old_signer, "k1")]})})
    settings = GatewaySettings(log=f"sqlite:///{tmp_path / 'h.db'}", api_keys_file=str(mount / "keys"),
                               jwks_file=str(mount / "jwks.json"), secrets_recheck_s=0.1)
    exp = int(time.time()) + 600
    by_old = jwt.encode({"tenant": "acme", "exp": exp}, old_signer, algorithm="RS256", headers={"kid": "k1"})
    by_new = jwt.encode({"tenant": "acme", "exp": exp}, new_signer, algorithm="RS256", headers={"kid": "k2"})
    with ServerThread(settings, harnesses=[approvals]) as server, httpx.Client(base_url=server.url) as http:

        def status(token: str) -> int:
            return http.get("/v1/sessions", headers=bearer(token)).status_code

        assert [status(t) for t in ("key-acme-OLD-1234", "key-acme-NEW-5678", by_old, by_new)] == [200, 401, 200, 401]
        publish(mount, "2026_01_02_v2", {"keys": "acme key-acme-NEW-5678\n",
                                          "jwks.json": json.dumps({"keys": [rs_jwk(old_signer, "k1"),
                                                                            rs_jwk(new_signer, "k2")]})})
        wait_for(lambda: status("key-acme-OLD-1234") == 401, timeout=30, what="the revoked API key to be refused")
        assert [status(t) for t in ("key-acme-NEW-5678", by_old, by_new)] == [200, 200, 200]


def test_an_auth_file_change_that_cannot_be_used_keeps_the_previous_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("acme key-acme-1234\n")
    now = [0.0]
    auth = Authenticator(GatewaySettings(log="sqlite:///x.db", api_keys_file=str(keys)), recheck=1,
                         clock=lambda: now[0])
    keys.write_text("acme key-acme-1234 a-third-word\n")
    now[0] += 1
    with caplog.at_level("WARNING", logger="harness.gateway"):
        assert auth.authenticate("Bearer key-acme-1234").tenant == "acme"
    (warning,) = caplog.records
    assert "cannot be used" in warning.getMessage() and "expected '<tenant> <key>'" in warning.getMessage()
    assert "key-acme-1234" not in warning.getMessage()
    keys.write_text("globex key-globex-5678\n")
    now[0] += 1
    assert auth.authenticate("Bearer key-globex-5678").tenant == "globex"
    with pytest.raises(AuthError):
        auth.authenticate("Bearer key-acme-1234")
