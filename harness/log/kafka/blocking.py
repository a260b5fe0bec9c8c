"""Blocking reads of a Kafka log on threads, counted until each thread is done with it.

A read of a partition (or of a checkpoint) blocks a thread of the loop's default
executor for up to its timeout (``READ_TIMEOUT_S``) when the broker is down, and a
caller that stops waiting (a request that timed out) cannot stop it. Python's exit
waits for those threads, so a gateway stopped while the broker is down would linger for
a minute or more. :class:`BlockingReads` counts the reads submitted and not finished
(those never started included), so a read-only process can see that only reads are left
and exit without them: a read changes nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["BlockingReads"]

T = TypeVar("T")


class BlockingReads:
    """Runs blocking reads on the loop's default executor and counts them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0

    @property
    def running(self) -> int:
        """Reads submitted and not finished (queued ones included)."""
        with self._lock:
            return self._running

    def _add(self, n: int) -> None:
        with self._lock:
            self._running += n

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a thread (as ``asyncio.to_thread``), counted."""
        loop = asyncio.get_running_loop()
        claimed = threading.Lock()  # taken by whoever uncounts the read: its thread, or a cancel before it ran
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)

        def counted() -> T:
            ran = claimed.acquire(blocking=False)
            try:
                return call()
            finally:
                if ran:
                    self._add(-1)

        self._add(1)
        future = loop.run_in_executor(None, counted)

        def done(f: asyncio.Future[T]) -> None:
            # Cancelled before its thread took it: it never runs, so it is uncounted here.
            if f.cancelled() and claimed.acquire(blocking=False):
                self._add(-1)

        future.add_done_callback(done)
        return await future
