"""Failed authentications per client address: past the budget, 429 before any check.

Pure (the clock is injected, no I/O). Without it a caller guessing tokens costs nothing but
its own requests, and each guess costs the gateway a key lookup or a JWT signature check.
``--auth-failure-limit N`` (default :data:`DEFAULT_AUTH_FAILURE_LIMIT`; 0: off) gives every
client address a bucket of N failures, refilled at N a minute: N wrong credentials at once,
then one every ``60 / N`` seconds. A request that *presents* credentials from an address
whose bucket is empty is refused before they are looked at, whatever they are: a good token
from that address waits too (its owner shares the address with whoever spent the budget).
Successes never spend it, and a request without credentials neither (it is a 401 at no
cost: the console's first look, a probe).

Addresses are keyed as :func:`address_key` says: IPv6 ones by their /64 (one host's usual
allocation: its 2**64 addresses are one caller, or the limit would mean nothing for it).
Which address a request comes from is the trusted proxies' business (``proxies``).
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable

from harness.services.gateway.ratelimit import TokenBuckets

__all__ = ["DEFAULT_AUTH_FAILURE_LIMIT", "AuthFailureLimit", "address_key"]

DEFAULT_AUTH_FAILURE_LIMIT = 10
"""Failed authentications a minute per client address (and at once). A person mistyping a
key, or a client whose token expired retrying with any backoff, stays well under it; a
token guesser gets 10 a minute instead of as many as the gateway can check, and the
guesses past it cost a dictionary lookup, not a signature check."""

WARN_EVERY_S = 60.0
"""One WARNING line per address per this many seconds while it is refused."""


def address_key(host: str | None) -> str:
    """The limit's key of a client address: the address itself (IPv4, an IPv4-mapped IPv6
    address as IPv4), an IPv6 address's /64 network, or (not an IP: a Unix socket's peer,
    a test client's name) the text shortened."""
    if not host:
        return "?"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class AuthFailureLimit:
    """A failure budget per client address.

    Args:
        per_minute: failures an address may have at once and a minute (>= 1).
        clock: monotonic seconds (tests pass their own).

    Only the event loop touches it (no lock).
    """

    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute < 1:
            raise ValueError(f"an auth failure limit is 1 or more a minute, not {per_minute}")
        self.per_minute = per_minute
        self._clock = clock
        self._buckets = TokenBuckets(rate=per_minute / 60.0, burst=float(per_minute), clock=clock)
        self._warned: dict[str, float] = {}  # key -> when its last WARNING was
        self._pruned = clock()

    def refused(self, address: str | None) -> int:
        """0 when a request with credentials from ``address`` may be checked, else the
        seconds (``Retry-After``) until it may."""
        wait = self._buckets.wait(address_key(address))
        return 0 if wait <= 0 else self._buckets.retry_after(wait)

    def failed(self, address: str | None) -> None:
        """A request from ``address`` presented credentials that did not authenticate."""
        self._buckets.take(address_key(address))

    def should_warn(self, address: str | None) -> bool:
        """Whether this refusal of ``address`` is the one logged (the first in ``WARN_EVERY_S``)."""
        now = self._clock()
        if now - self._pruned >= WARN_EVERY_S:
            self._pruned = now
            self._warned = {k: t for k, t in self._warned.items() if now - t < WARN_EVERY_S}
        key = address_key(address)
        last = self._warned.get(key)
        if last is not None and now - last < WARN_EVERY_S:
            return False
        self._warned[key] = now
        return True

    def __len__(self) -> int:
        """Addresses with failures lately."""
        return len(self._buckets)
