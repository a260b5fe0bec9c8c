"""The gateway's pure hardening parts: Host patterns (DNS rebinding), token buckets with an
injected clock, the JWKS check for private keys, and the settings that carry them."""

from __future__ import annotations

import argparse

import pytest

from harness.services.gateway.auth import jwks_problem
from harness.services.gateway.authlimit import AuthFailureLimit, address_key
from harness.services.gateway.hosts import allowed_hosts, host_allowed, host_name, parse_allowed_hosts
from harness.services.gateway.proxies import TrustedProxies, parse_forwarded_allow_ips
from harness.services.gateway.ratelimit import TokenBuckets
from harness.services.gateway.settings import parse_settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- hosts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("header", "name"), [
    ("localhost:8080", "localhost"), ("127.0.0.1", "127.0.0.1"), ("[::1]:8080", "::1"), ("[::1]", "::1"),
    ("Gw.Example.COM.", "gw.example.com"), ("::1", "::1"), ("10.1.2.3:80", "10.1.2.3"),
])
def test_a_host_header_is_its_host_without_the_port(header: str, name: str) -> None:
    assert host_name(header) == name


def test_loopback_binds_answer_loopback_names_only_and_others_any_host() -> None:
    loopback = allowed_hosts(None, "127.0.0.1")
    assert loopback is not None
    for ok in ("localhost:8080", "127.0.0.1:8080", "[::1]:8080", "LOCALHOST"):
        assert host_allowed(ok, loopback), ok
    for bad in ("evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io", "", None):
        assert not host_allowed(bad, loopback), bad
    assert allowed_hosts(None, "::1") is not None and allowed_hosts(None, "localhost") is not None
    assert host_allowed("127.0.0.2:80", allowed_hosts(None, "127.0.0.2") or ())  # (its own address too)
    assert allowed_hosts(None, "0.0.0.0") is None and allowed_hosts(None, "::") is None  # any host
    assert allowed_hosts(None, "10.0.0.5") is None
    assert allowed_hosts(("*",), "127.0.0.1") is None  # '*' asked for: any host, even on loopback


def test_given_patterns_restrict_any_bind_and_wildcards_match_names_under_them() -> None:
    patterns = allowed_hosts(parse_allowed_hosts("*.example.com, 10.1.2.3,[fd00::1]"), "0.0.0.0")
    assert patterns == ("*.example.com", "10.1.2.3", "fd00::1")
    for ok in ("gw.example.com", "a.b.example.com:443", "10.1.2.3:8080", "[fd00::1]:8080"):
        assert host_allowed(ok, patterns), ok
    for bad in ("example.com", "evilexample.com", "gw.example.com.evil.example", "10.1.2.4", "localhost"):
        assert not host_allowed(bad, patterns), bad


@pytest.mark.parametrize("text", ["", " , ", "gw.example.com:8080", "gw.*.com", "*example.com", "a/b"])
def test_bad_allowed_hosts_are_refused_saying_why(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_allowed_hosts(text)
    assert len(str(caught.value).splitlines()) == 1


# -- token buckets -------------------------------------------------------------------------


def test_a_bucket_allows_its_burst_then_refuses_until_it_refills() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate=2, burst=4, clock=clock)
    assert [buckets.take("acme") for _ in range(4)] == [0.0] * 4
    wait = buckets.take("acme")
    assert wait == pytest.approx(0.5)
    assert buckets.retry_after(wait) == 1
    assert buckets.take("globex") == 0.0  # another key has its own bucket
    clock.now += 0.5
    assert buckets.take("acme") == 0.0
    assert buckets.take("acme") > 0


def test_buckets_of_idle_callers_are_dropped() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate=10, burst=20, clock=clock)
    for n in range(1000):
        buckets.take(f"a:10.0.{n // 256}.{n % 256}")
    assert len(buckets) == 1000
    clock.now += 2.0  # (burst / rate: every bucket is full again)
    buckets.take("acme")
    assert len(buckets) == 1


def test_a_bucket_needs_a_rate() -> None:
    with pytest.raises(ValueError):
        TokenBuckets(rate=0, burst=1)


# -- JWKS ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("jwk", "said"), [
    ({"kty": "RSA", "kid": "r1", "n": "AQAB", "e": "AQAB", "d": "c2VjcmV0"}, "kid 'r1' is a PRIVATE key"),
    ({"kty": "EC", "crv": "P-256", "x": "eA", "y": "eQ", "d": "c2VjcmV0"}, "key #2 (no kid) is a PRIVATE key"),
    ({"kty": "oct", "kid": "s1", "k": "c2VjcmV0"}, "kid 's1' is a symmetric (oct) key"),
])
def test_a_jwks_with_a_private_or_symmetric_key_is_refused_naming_its_kid(jwk: dict[str, str], said: str) -> None:
    public = {"kty": "RSA", "kid": "ok", "n": "AQAB", "e": "AQAB"}
    problem = jwks_problem([public, jwk])
    assert problem is not None and said in problem
    assert "c2VjcmV0" not in problem
    assert jwks_problem([public]) is None


# -- settings ------------------------------------------------------------------------------


def test_settings_take_the_new_flags_and_their_environment() -> None:
    s = parse_settings(["--log", "memory:", "--open-access"], {})
    assert (s.allowed_hosts, s.rate_limit, s.rate_limit_reads) == (None, 0.0, False)
    s = parse_settings(["--log", "memory:", "--open-access", "--allowed-hosts", "gw.example.com,10.1.2.3",
                        "--rate-limit", "5", "--rate-limit-reads"], {})
    assert (s.allowed_hosts, s.rate_limit, s.rate_limit_reads) == (("gw.example.com", "10.1.2.3"), 5.0, True)
    s = parse_settings(["--log", "memory:", "--open-access"],
                       {"HARNESS_GATEWAY_ALLOWED_HOSTS": "*.example.com", "HARNESS_GATEWAY_RATE_LIMIT": "2.5",
                        "HARNESS_GATEWAY_RATE_LIMIT_READS": "true"})
    assert (s.allowed_hosts, s.rate_limit, s.rate_limit_reads) == (("*.example.com",), 2.5, True)
    with pytest.raises(argparse.ArgumentTypeError, match="HARNESS_GATEWAY_ALLOWED_HOSTS"):
        parse_settings(["--log", "memory:", "--open-access"], {"HARNESS_GATEWAY_ALLOWED_HOSTS": "gw:80"})
    for bad in (["--rate-limit", "-1"], ["--rate-limit", "inf"], ["--rate-limit-reads"]):
        with pytest.raises(SystemExit):
            parse_settings(["--log", "memory:", "--open-access", *bad], {})


# -- auth failures per address, trusted proxies --------------------------------------------


def test_wait_peeks_without_taking() -> None:
    now = [0.0]
    buckets = TokenBuckets(rate=1, burst=1, clock=lambda: now[0])
    assert buckets.wait("k") == 0.0 and buckets.wait("k") == 0.0
    assert buckets.take("k") == 0.0
    assert buckets.wait("k") == pytest.approx(1.0)
    now[0] = 0.5
    assert buckets.wait("k") == pytest.approx(0.5)


def test_ipv6_addresses_are_limited_by_their_64() -> None:
    assert address_key("2001:db8::1") == address_key("2001:db8::ffff:2") == "2001:db8::/64"
    assert address_key("2001:db8:0:1::1") != address_key("2001:db8::1")
    assert address_key("::ffff:192.0.2.1") == "192.0.2.1"
    assert (address_key(None), address_key("testclient")) == ("?", "testclient")


def test_the_failure_budget_and_one_warning_a_minute() -> None:
    now = [0.0]
    limit = AuthFailureLimit(2, clock=lambda: now[0])
    assert limit.refused("192.0.2.1") == 0
    limit.failed("192.0.2.1")
    limit.failed("192.0.2.1")
    assert limit.refused("192.0.2.1") == 30 and limit.refused("192.0.2.2") == 0
    assert limit.should_warn("192.0.2.1") and not limit.should_warn("192.0.2.1")
    now[0] = 30.0
    assert limit.refused("192.0.2.1") == 0
    now[0] = 60.0
    assert limit.should_warn("192.0.2.1")
    with pytest.raises(ValueError):
        AuthFailureLimit(0)


def test_forwarded_for_is_walked_from_the_right_past_trusted_proxies() -> None:
    proxies = TrustedProxies(parse_forwarded_allow_ips("10.0.0.0/8, 127.0.0.1"))
    assert proxies.client("192.0.2.9", ["198.51.100.1"]) == "192.0.2.9"  # an untrusted peer: its header ignored
    assert proxies.client("10.1.1.1", []) == "10.1.1.1"
    assert proxies.client("10.1.1.1", ["198.51.100.1"]) == "198.51.100.1"
    assert proxies.client("10.1.1.1", ["6.6.6.6, 198.51.100.1, 10.2.2.2"]) == "198.51.100.1"  # 6.6.6.6: made up
    assert proxies.client("10.1.1.1", ["6.6.6.6", "198.51.100.1:4711"]) == "198.51.100.1"  # two headers, a port
    assert proxies.client("10.1.1.1", ["10.3.3.3, 10.2.2.2"]) == "10.3.3.3"  # all trusted: the leftmost
    assert proxies.client("10.1.1.1", ["not-an-ip"]) == "10.1.1.1"
    assert proxies.client("10.1.1.1", ["[2001:db8::1]:443"]) == "2001:db8::1"
    assert TrustedProxies(["*"]).client("192.0.2.9", ["198.51.100.1"]) == "198.51.100.1"
    assert not proxies.trusts(None)
