"""Clocks: the real one, and a fake one for tests of sleeps, leases and expiries.

The library never reads the time directly: hosts take a ``Clock``, so every
wait can be tested without sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from datetime import datetime, timedelta
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
    """A clock that moves only when told to (``advance``/``set``).

    ``start`` and ``set`` take seconds since the epoch or an aware ``datetime``;
    ``advance`` a ``timedelta`` or a number of seconds, never negative. A wrong value
    is refused at the call (``DefinitionError``; ``NaiveDatetime`` for a datetime
    without a timezone), not carried into the sleeps and leases that read the clock.
    """

    def __init__(self, start: float | datetime = 1_700_000_000.0) -> None:
        self._now = _instant(start, "FakeClock(start=)")
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

    def advance(self, seconds: float | timedelta) -> None:
        """Move the clock forward by ``seconds`` (or a ``timedelta``), waking the sleepers due."""
        from harness.errors import DefinitionError

        try:
            step = duration_seconds(seconds, "FakeClock.advance()")
        except ValueError as exc:
            raise DefinitionError(f"{exc}, e.g. advance(60) or advance(timedelta(days=2))") from None
        if step < 0:
            raise DefinitionError(f"FakeClock.advance() moves the clock forward, not by {seconds!r}: "
                                  "use set() to put it at an earlier time")
        self.set(self._now + step)

    def set(self, now: float | datetime) -> None:
        """Put the clock at ``now`` (seconds since the epoch, or an aware ``datetime``),
        waking the sleepers due."""
        now = _instant(now, "FakeClock.set()")
        self._now = now
        while self._sleepers and self._sleepers[0][0] <= now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)


def _instant(value: object, what: str) -> float:
    """``value`` (seconds since the epoch, or an aware datetime) in seconds since the epoch."""
    from harness.errors import DefinitionError, NaiveDatetime

    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise NaiveDatetime(f"{what} was given {value.isoformat()}, which has no timezone; give an aware "
                                "datetime, e.g. datetime(2030, 1, 1, tzinfo=UTC)", argument=what)
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DefinitionError(f"{what} takes seconds since the epoch (a finite number) or an aware datetime, "
                              f"not {value!r:.80}")
    return float(value)
