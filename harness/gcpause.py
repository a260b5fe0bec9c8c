"""Pausing the cyclic garbage collector around bulk work that only builds.

A rebuild decodes and keeps hundreds of thousands of records: the collections its
allocations trigger free nothing while their cost grows with what is kept (about a
fifth of a 200k-record read). Reference counting still frees everything else.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["collector_paused"]

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


