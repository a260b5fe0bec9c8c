"""Clocks: the real one, and a fake one for tests of sleeps, leases and expiries.

The library never reads the time directly: hosts take a ``Clock``, so every
wait can be tested without sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from datetime import timedelta
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "FakeClock", "SystemClock", "duration_seconds"]

_LONGEST_S = timedelta.max // timedelta(seconds=1)  # whole seconds: timedelta(seconds=) of it fits


def duration_seconds(value: object, what: str) -> float:
    """``value``, a ``timedelta`` or a number of seconds, in seconds (``what`` names it in
    the error, e.g. ``"step.sleep"``).

    Raises:
        ValueError: neither (a bool is not a number of seconds), NaN, or beyond
            ``timedelta.max`` either way (the caller turns it into its own error).
    """
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} takes a timedelta or a number of seconds as its duration, not {type(value).__name__}")
    if not (-_LONGEST_S <= value <= _LONGEST_S):  # False for NaN too
        raise ValueError(f"{what} of {value!r} seconds: give a finite duration, at most timedelta.max")
    return float(value)


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (UTC)."""
        ...

    async def sleep_until(self, when: float) -> None:
        """Return once ``now() >= when``."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    async def sleep_until(self, when: float) -> None:
        while True:
            delay = when - time.time()
            if delay <= 0:
                return
            await asyncio.sleep(delay)


class FakeClock:
    """A clock that moves only when told to (``advance``/``set``)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._ids = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep_until(self, when: float) -> None:
        if when <= self._now:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (when, next(self._ids), fut))
        await fut

    @property
    def sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def advance(self, seconds: float) -> None:
        self.set(self._now + seconds)

    def set(self, now: float) -> None:
        self._now = now
        while self._sleepers and self._sleepers[0][0] <= now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)
