"""Token buckets per caller: at most ``rate`` requests a second on average, ``burst`` at once.

Pure (the clock is injected, no I/O). The gateway keeps one :class:`TokenBuckets` per
process and takes a token per write request (``--rate-limit``; with
``--rate-limit-reads`` per API request) for the caller's key: its tenant, or its client
address under ``--open-access`` without a token. ``authlimit.AuthFailureLimit`` keeps
another per client address, a token per failed authentication.

Memory stays bounded: a bucket that has filled up again is no different from a new one,
so every ``burst / rate`` seconds (the time an emptied bucket takes to fill) the full ones
are dropped. What is kept is the callers seen in about the last refill time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["TokenBuckets"]


class TokenBuckets:
    """One token bucket per key.

    Args:
        rate: tokens added per second (> 0).
        burst: the most a bucket holds (>= 1): a new or idle caller may send this many at once.
        clock: monotonic seconds (tests pass their own).

    Only the event loop touches it (no lock).
    """

    def __init__(self, *, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not rate > 0 or not burst >= 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, not rate={rate} burst={burst}")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, when counted)
        self._refill_s = burst / rate
        self._swept = clock()

    def take(self, key: str) -> float:
        """Take one token of ``key``'s bucket: 0.0 when there was one, else the seconds
        until there is (nothing taken)."""
        now = self._clock()
        if now - self._swept >= self._refill_s:
            self._sweep(now)
        tokens, then = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - then) * self.rate)
        if tokens >= 1:
            self._buckets[key] = (tokens - 1, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1 - tokens) / self.rate

    def wait(self, key: str) -> float:
        """Seconds until ``key``'s bucket holds a token (0.0: it holds one now); nothing taken."""
        now = self._clock()
        tokens, then = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - then) * self.rate)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def retry_after(self, wait_s: float) -> int:
        """``wait_s`` as a ``Retry-After`` (whole seconds, at least 1)."""
        return max(1, math.ceil(wait_s))

    def __len__(self) -> int:
        """Buckets held now (the callers seen lately)."""
        return len(self._buckets)

    def _sweep(self, now: float) -> None:
        self._swept = now
        full = [key for key, (tokens, then) in self._buckets.items()
                if tokens + max(0.0, now - then) * self.rate >= self.burst]
        for key in full:
            del self._buckets[key]
