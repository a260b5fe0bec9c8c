"""Failed authentications are limited per client address, over real HTTP: bad credentials get
401 up to ``--auth-failure-limit`` (10 a minute by default), then 429 with Retry-After
without the credentials being checked; other addresses are not affected; the address is the
one a trusted proxy names in X-Forwarded-For, from nobody else (``--forwarded-allow-ips``).
A fake clock moves the buckets, no sleeps."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.observability.prometheus import PrometheusSink
from harness.services.gateway.main import _settings
from harness.services.gateway.settings import GatewaySettings, parse_settings
from tests.apps.approvals import approvals
from tests.gateway.helpers import ServerThread, open_settings
from tests.gateway.test_hardening import Clock, message, refused_count

GOOD = "key-acme-1234"
BAD = "guess-0000"


def keyed(tmp_path: Path, **kw: Any) -> GatewaySettings:
    (tmp_path / "keys").write_text(f"acme {GOOD}\n")
    return GatewaySettings(log=f"sqlite:///{tmp_path / 'h.db'}", api_keys_file=str(tmp_path / "keys"),
                           heartbeat_s=0.3, **kw)


def prepared(settings: GatewaySettings) -> tuple[ServerThread, Clock, PrometheusSink]:
    server = ServerThread(settings, harnesses=[approvals])
    server.clock = clock = Clock()
    server.metrics = sink = PrometheusSink()
    return server, clock, sink


def count_checks(server: ServerThread) -> list[str | None]:
    """The Authorization headers the authenticator is asked to check, from now on."""
    assert server.state is not None
    auth = server.state.auth
    checked: list[str | None] = []
    real: Callable[[str | None], Any] = auth.authenticate

    def spy(authorization: str | None) -> Any:
        checked.append(authorization)
        return real(authorization)

    auth.authenticate = spy  # type: ignore[method-assign]
    return checked


def as_from(address: str, token: str | None = None) -> dict[str, str]:
    headers = {"X-Forwarded-For": address}  # (the test client is 127.0.0.1: a trusted proxy by default)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def test_bad_credentials_get_401_up_to_the_limit_then_429_before_they_are_checked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="harness.gateway")
    server, clock, sink = prepared(keyed(tmp_path))  # the default limit: on, 10 a minute
    a, b = "203.0.113.7", "203.0.113.8"
    with server, httpx.Client(base_url=server.url, timeout=30) as http:
        checked = count_checks(server)
        for n in range(10):
            r = http.get("/v1/sessions", headers=as_from(a, f"{BAD}-{n}"))
            assert r.status_code == 401, (n, r.text)
        assert len(checked) == 10
        r = http.get("/v1/sessions", headers=as_from(a, BAD))
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "6"  # 10 a minute: one more every 6 s
        detail = r.json()["detail"]
        assert "--auth-failure-limit" in detail and "\n" not in detail and BAD not in detail
        assert len(checked) == 10  # refused before the key was looked at
        # A write is refused the same way, and writes nothing.
        assert http.post("/v1/sessions/s-1/messages", headers=as_from(a, BAD), json=message()).status_code == 429
        # The budget is the address's: a good key from it waits too (documented), unchecked ...
        r = http.get("/v1/sessions", headers=as_from(a, GOOD))
        assert r.status_code == 429 and len(checked) == 10
        # ... a request without credentials is a plain 401 (nothing to check, nothing spent) ...
        assert http.get("/v1/sessions", headers=as_from(a)).status_code == 401
        # ... and another address is not affected, good key or bad.
        assert http.get("/v1/sessions", headers=as_from(b, GOOD)).status_code == 200
        assert http.get("/v1/sessions", headers=as_from(b, BAD)).status_code == 401
        assert refused_count(sink, "auth_failures") == 3
        assert refused_count(sink, "rate_limit") == 0
        # The bucket refills at 10 a minute: one more guess after 6 s, then 429 again.
        clock.advance(6.0)
        assert http.get("/v1/sessions", headers=as_from(a, BAD)).status_code == 401
        assert http.get("/v1/sessions", headers=as_from(a, BAD)).status_code == 429
        # Once the address has a failure to spare, its good key works; successes spend nothing.
        clock.advance(6.0)
        for _ in range(3):
            assert http.get("/v1/sessions", headers=as_from(a, GOOD)).status_code == 200
        assert http.post("/v1/sessions/s-1/messages", headers=as_from(a, GOOD), json=message()).status_code == 200
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    refusals = [line for line in warnings if "--auth-failure-limit" in line]
    assert len(refusals) == 1, warnings  # one line per address per minute, not one per refusal
    assert a in refusals[0] and "--forwarded-allow-ips" in refusals[0]
    assert not any(BAD in line or GOOD in line for line in warnings)


def test_auth_failure_limit_0_turns_it_off(tmp_path: Path) -> None:
    server, _, sink = prepared(keyed(tmp_path, auth_failure_limit=0))
    with server, httpx.Client(base_url=server.url, timeout=30) as http:
        checked = count_checks(server)
        assert {http.get("/v1/sessions", headers=as_from("203.0.113.7", BAD)).status_code
                for _ in range(25)} == {401}
        assert len(checked) == 25
        assert refused_count(sink, "auth_failures") == 0


def test_forwarded_for_is_believed_only_from_trusted_proxies(tmp_path: Path) -> None:
    # The test client (127.0.0.1) is not among --forwarded-allow-ips: its X-Forwarded-For is
    # ignored, so guesses that claim three addresses share its one budget.
    server, _, _ = prepared(keyed(tmp_path, auth_failure_limit=2, forwarded_allow_ips=("10.9.9.9",)))
    with server, httpx.Client(base_url=server.url, timeout=30) as http:
        codes = [http.get("/v1/sessions", headers=as_from(f"198.51.100.{n}", BAD)).status_code for n in range(3)]
        assert codes == [401, 401, 429]
        # A chain: only the rightmost entry a trusted proxy did not write counts; here none is trusted.
        r = http.get("/v1/sessions", headers=as_from("198.51.100.9, 198.51.100.10", GOOD))
        assert r.status_code == 429


def test_the_rate_limit_of_open_access_is_per_forwarded_address_from_a_trusted_proxy(tmp_path: Path) -> None:
    server, _, sink = prepared(open_settings(f"sqlite:///{tmp_path / 'h.db'}", rate_limit=1))
    with server, httpx.Client(base_url=server.url, timeout=30) as http:
        post = lambda who, n: http.post(f"/v1/sessions/{who}-{n}/messages",  # noqa: E731
                                        headers={"X-Forwarded-For": who}, json=message()).status_code
        assert [post("203.0.113.7", n) for n in range(3)] == [200, 200, 429]
        assert post("203.0.113.8", 0) == 200  # another caller behind the same proxy: its own bucket
        # A spoofed entry left of the proxy's own is not the client: the proxy's is.
        assert http.post("/v1/sessions/x/messages", headers={"X-Forwarded-For": "198.51.100.1, 203.0.113.7"},
                         json=message()).status_code == 429
        assert refused_count(sink, "rate_limit") == 2


@pytest.mark.parametrize(("argv", "env", "said"), [
    (["--auth-failure-limit", "ten"], {}, "--auth-failure-limit: must be failed authentications a minute"),
    (["--auth-failure-limit", "-1"], {}, "0 or more (0: no limit), not -1"),
    (["--auth-failure-limit", "2.5"], {}, "a whole number"),
    ([], {"HARNESS_GATEWAY_AUTH_FAILURE_LIMIT": "lots"}, "HARNESS_GATEWAY_AUTH_FAILURE_LIMIT: must be"),
    (["--forwarded-allow-ips", "ingress.local"], {}, "'ingress.local' is not an IP address or network"),
    (["--forwarded-allow-ips", "10.0.0.0/33"], {}, "'10.0.0.0/33' is not an IP address or network"),
    ([], {"HARNESS_GATEWAY_FORWARDED_ALLOW_IPS": ","}, "HARNESS_GATEWAY_FORWARDED_ALLOW_IPS: no address given"),
])
def test_a_wrong_value_is_one_clear_line(argv: list[str], env: dict[str, str], said: str,
                                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        _settings(["--log", "memory:", "--open-access", *argv], "harness gateway", None, need_apps=False)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err


def test_the_flags_and_their_environment() -> None:
    s = parse_settings(["--log", "memory:", "--open-access"], {})
    assert (s.auth_failure_limit, s.forwarded_allow_ips) == (10, ("127.0.0.1", "::1"))
    s = parse_settings(["--log", "memory:", "--open-access", "--auth-failure-limit", "0",
                        "--forwarded-allow-ips", "10.0.0.0/8, [fd00::1],*"], {})
    assert (s.auth_failure_limit, s.forwarded_allow_ips) == (0, ("10.0.0.0/8", "fd00::1", "*"))
    s = parse_settings(["--log", "memory:", "--open-access"], {"HARNESS_GATEWAY_AUTH_FAILURE_LIMIT": "30",
                                                                "HARNESS_GATEWAY_FORWARDED_ALLOW_IPS": "10.1.2.3"})
    assert (s.auth_failure_limit, s.forwarded_allow_ips) == (30, ("10.1.2.3",))
