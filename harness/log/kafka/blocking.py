"""Blocking reads of a Kafka log on threads, counted until each thread is done with it.

A read of a partition (or of a checkpoint) blocks a thread of the loop's default
executor for up to its timeout (``READ_TIMEOUT_S``) when the broker is down, and a
caller that stops waiting (a request that timed out) cannot stop it. Python's exit
waits for those threads, so a gateway stopped while the broker is down would linger for
a minute or more. :class:`BlockingReads` counts the reads submitted and not finished
(those never started included), so a read-only process can see that only reads are left
and exit without them: a read changes nothing.

The reads run on threads of their own, not on the loop's default executor: with the
broker down they would fill it (one thread per partition read, each waiting its timeout)
and everything else that runs there would queue behind them, closing the log included.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["BlockingReads"]

T = TypeVar("T")


class BlockingReads:
    """Runs blocking reads on threads of its own and counts them."""

    def __init__(self, max_workers: int | None = None) -> None:
        self._max_workers = max_workers or min(32, (os.cpu_count() or 1) + 4)
        self._lock = threading.Lock()
        self._running = 0
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None  # started on first use

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
        future = loop.run_in_executor(self._threads(), counted)

        def done(f: asyncio.Future[T]) -> None:
            # Cancelled before its thread took it: it never runs, so it is uncounted here.
            if f.cancelled() and claimed.acquire(blocking=False):
                self._add(-1)

        future.add_done_callback(done)
        return await future

    def _threads(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self._max_workers, thread_name_prefix="harness-kafka-read"
                )
            return self._executor

    def close(self) -> None:
        """No wait for the reads still running (each ends at its own timeout); queued ones
        never start. Later reads get a new pool."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
