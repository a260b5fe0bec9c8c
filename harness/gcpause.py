"""The cyclic garbage collector: paused around bulk work that only builds, and tuned
for long-running services.

A rebuild decodes and keeps hundreds of thousands of records: the collections its
allocations trigger free nothing while their cost grows with what is kept (about a
fifth of a 200k-record read). Reference counting still frees everything else.

A worker keeps many objects alive for long (the records of live sessions, the last
ended ones) while each turn makes thousands of short-lived ones: with the default
thresholds its collections took ~8% of its CPU in ``bench/e2e.py`` and every full
collection paused the loop for ~130 ms. ``tune_for_service`` makes young collections
rarer and keeps what exists at startup (modules, the apps, schemas) out of all of them.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["SERVICE_GEN0_THRESHOLD", "collector_paused", "tune_for_service"]

SERVICE_GEN0_THRESHOLD = 20_000
"""Allocations between two young collections in a service (Python's default: 700)."""

_gc_lock = threading.Lock()
_gc_pauses = 0  # bulk reads running now, in any thread
_gc_resume = False  # whether the first of them found the collector enabled


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a bulk read builds its list of entries.

    A read keeps every record it decodes, so the collections its allocations trigger
    free nothing while their cost grows with the list: about a fifth of the time of a
    200k-record partition read (bench/rebuild.py). Reference counting still frees the
    rest. Concurrent reads share one pause; the collector is enabled again when the
    last ends, and only if it was enabled when the first began.
    """
    global _gc_pauses, _gc_resume
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_resume = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_resume:
                gc.enable()




def tune_for_service() -> None:
    """For a long-running process (worker, gateway), once it has loaded what it runs:
    move every object that exists now out of the collector's sight (``gc.freeze``: they
    live as long as the process anyway) and collect the young generation every
    ``SERVICE_GEN0_THRESHOLD`` allocations instead of 700. Measured (bench/e2e.py): the
    worker's collections from ~1.2 s to ~0.25 s of CPU over a 45 s run, ~0.8 ms of
    worker CPU less per turn, no full collection (each took ~130 ms) during the run."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(SERVICE_GEN0_THRESHOLD, max(middle, 20), old)
