"""The host's thread pool for sync code, whose threads waiting in a durable wait do not count.

A sync tool runs on a pool thread, and its ``ctx.step.sleep`` / ``ctx.step.ask`` block that
thread for the whole wait: hours, days, until a person answers. Counted against the pool's
``max_workers`` (the host's ``sync_threads``), that many waiting tools stopped every other
sync tool and sync step fn of the host, of every session. While a thread waits
(:func:`lend_thread`), the pool may start one more thread in its place.

(The pool grows by adjusting ``ThreadPoolExecutor``'s ``_max_workers`` under its lock, as
``submit`` reads it; threads it started stay after the wait, idle, as a pool's threads do.)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

__all__ = ["SyncPool", "lend_thread"]

_here = threading.local()


def _mark(pool: SyncPool) -> None:
    _here.pool = pool


class SyncPool(ThreadPoolExecutor):
    """A ``ThreadPoolExecutor`` of ``max_workers`` threads, plus one for each thread in a
    durable wait (:meth:`waiting`)."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "") -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix,
                         initializer=_mark, initargs=(self,))

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """On a pool thread about to block in a durable wait: the pool may run one more
        thread meanwhile (one at once if work is queued)."""
        with self._shutdown_lock:
            self._max_workers += 1
            if not self._shutdown and not self._work_queue.empty():
                with contextlib.suppress(RuntimeError):  # (the interpreter is exiting: no new thread)
                    self._adjust_thread_count()
        try:
            yield
        finally:
            with self._shutdown_lock:
                self._max_workers -= 1


@contextlib.contextmanager
def lend_thread() -> Iterator[None]:
    """Around a durable wait of sync code: its pool thread does not count meanwhile (no-op
    on a thread of no :class:`SyncPool`)."""
    pool: SyncPool | None = getattr(_here, "pool", None)
    if pool is None:
        yield
        return
    with pool.waiting():
        yield
