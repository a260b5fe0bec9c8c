"""The gateway's reads of the log during an outage: answered in seconds, not after a minute.

A read of a Kafka log that cannot reach the broker fails only after the log's own read
deadline (30 s, patient on purpose: a worker's rebuild should ride out a broker's short
restart), and a request may make two reads (the partition's checkpoint, then the
session), so a client's GET or POST got its 503 after 30-60 s, and every such request held
a thread of the process meanwhile. An HTTP client wants to hear quickly that the service
is down, and to be told when to try again.

:class::class:`LogBreaker` watches each read of the gateway: one that takes longer than
``timeout`` makes it ask the log whether it answers (``probe``: the gateway's readiness
check, bounded); if not, that read gets ``LogUnavailable`` (the route's 503 with
``Retry-After``), and so do the next ones, at once, without asking the log, while one
background task asks every ``retry_every`` seconds whether it answers again. If the log
answers, the read goes on: a long read (a big listing, a long session) is not an
outage. The first answer closes the breaker; only ``LogUnavailable`` and a probe that
fails open it (a missing topic, a refused record or a fenced writer say something about
the request, not about the log being down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from harness.errors import LogUnavailable

__all__ = ["DEFAULT_READ_TIMEOUT_S", "LogBreaker", "LogDown"]

DEFAULT_READ_TIMEOUT_S = 5.0
"""How long one gateway read may take before the gateway asks the log whether it answers."""

RETRY_EVERY_S = 2.0
"""How often an open breaker asks the log whether it answers again."""

T = TypeVar("T")

logger = logging.getLogger("harness.gateway")


class LogDown(LogUnavailable):
    """A gateway read refused or cut by the breaker: the log is not answering."""


class LogBreaker:
    """Fails the gateway's log reads fast while the log is known to be down (module doc).

    Args:
        probe: raises (``LogError``, ``OSError``, ``TimeoutError``) unless the log answers now.
        timeout: the deadline of one read, in seconds.
        retry_every: seconds between two probes while open; also the ``Retry-After`` given.
        clock: monotonic seconds (tests).
    """

    def __init__(
        self,
        probe: Callable[[], Awaitable[None]],
        *,
        timeout: float = DEFAULT_READ_TIMEOUT_S,
        retry_every: float = RETRY_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._probe = probe
        self.timeout = timeout
        self.retry_every = retry_every
        self._clock = clock
        self.reason: str | None = None
        """Why the log is taken for down (None: the breaker is closed)."""
        self._since = 0.0
        self._prober: asyncio.Task[None] | None = None
        self.opened = 0  # times the breaker opened (for tests and logs)

    @property
    def is_open(self) -> bool:
        return self.reason is not None

    @property
    def retry_after_s(self) -> int:
        """Whole seconds for a ``Retry-After`` header."""
        return max(1, math.ceil(self.retry_every))

    def check(self) -> None:
        """Nothing while the log is taken to answer.

        Raises:
            LogDown: the breaker is open (the log is known to be down).
        """
        if self.reason is not None:
            down = self._clock() - self._since
            raise LogDown(f"the session log is not answering (for {down:.0f} s: {self.reason})")

    async def call(self, read: Callable[[], Awaitable[T]]) -> T:
        """``await read()``; at once ``LogUnavailable`` while open. A read still running
        after ``timeout`` goes on only if the probe finds the log answering.

        Raises:
            LogDown: the log is down (known already, or found by this read).
        """
        self.check()
        task = asyncio.ensure_future(read())
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout)
            if not done:  # a long read, or a log that does not answer: ask it
                try:
                    await self._probe()
                except Exception as exc:  # noqa: BLE001 - any failure of the probe: down
                    said = " ".join(str(exc).split()) or type(exc).__name__
                    reason = f"a read got no answer within {self.timeout:g} s and the log does not answer ({said})"
                    self.open(reason)
                    raise LogDown(f"the session log is not answering ({reason})") from None
            return await task
        except LogDown:
            raise
        except LogUnavailable as exc:
            self.open(str(exc))
            raise LogDown(f"the session log is not answering ({exc})") from exc
        finally:
            if not task.done():
                task.cancel()  # (the request was cancelled, or the log is down)

    def open(self, reason: str) -> None:
        """Take the log for down (``reason`` says why) until a probe gets an answer."""
        if self.reason is None:
            self._since = self._clock()
            self.opened += 1
            logger.warning("the session log is not answering (%s): requests get 503 until it does", reason)
        self.reason = reason
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe_until_answered())

    def close(self) -> None:
        """The log answered: reads go to it again."""
        if self.reason is not None:
            logger.warning("the session log answers again after %.0f s", self._clock() - self._since)
        self.reason = None

    async def _probe_until_answered(self) -> None:
        while self.reason is not None:
            await asyncio.sleep(self.retry_every)
            try:
                await self._probe()
            except Exception as exc:  # noqa: BLE001 - any failure of the probe: still down
                if self.reason is not None:
                    self.reason = " ".join(str(exc).split()) or type(exc).__name__
                continue
            self.close()

    async def stop(self) -> None:
        """End the background probe (the gateway stops)."""
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
