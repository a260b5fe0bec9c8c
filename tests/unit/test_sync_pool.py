"""``harness.sync_pool``: a thread in a durable wait does not count against the pool."""

from __future__ import annotations

import threading

from harness.sync_pool import SyncPool, lend_thread


def test_a_waiting_thread_lets_the_pool_run_other_work_and_the_bound_comes_back() -> None:
    pool = SyncPool(1, thread_name_prefix="t")
    release = threading.Event()
    waiting = threading.Event()
    try:
        def waits() -> str:
            with lend_thread():
                waiting.set()
                release.wait(10)
            return "answered"

        first = pool.submit(waits)
        assert waiting.wait(5)
        assert pool.submit(lambda: "ran").result(timeout=5) == "ran"  # (a pool of one, its thread waiting)
        release.set()
        assert first.result(timeout=5) == "answered"
        assert pool._max_workers == 1  # the bound is back once the wait ends
    finally:
        release.set()
        pool.shutdown(wait=True)


def test_lend_thread_off_a_pool_thread_does_nothing() -> None:
    with lend_thread():
        pass
