"""Leaving a service process at once when sync code its stop cut, or a log read, still
runs on threads.

A sync step function or sync tool runs on a thread of the host's pool; a stop cancels
its step (nothing of it is recorded, the next owner runs it again) but cannot stop the
thread. Python's exit would wait for that thread, so a ``harness worker`` that said
"worker stopped" would linger, and finish a side effect nobody records, for as long as
the code runs. The command-line services exit at once instead, as a crash would.

A blocking read of a Kafka log (a gateway's listing while the broker is down) waits for
its timeout on its thread, whoever was waiting for it; a stopped gateway would wait for
every such read in turn (a minute and more). A read changes nothing: a service whose log
is closed exits without them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Protocol

__all__ = ["exit_if_reads_linger", "exit_if_sync_calls_linger"]

log = logging.getLogger("harness.worker")


class _Host(Protocol):
    def stop_sync_calls(self) -> int: ...


def exit_if_sync_calls_linger(host: _Host, code: int) -> None:
    """``os._exit(code)`` if sync calls of ``host`` still run on threads (after the
    process's own clean-up: the log is closed); otherwise return."""
    running = host.stop_sync_calls()
    if not running:
        return
    log.warning(
        "%d sync call(s) (a step function or a sync tool) cut by the stop still run on threads: exiting without "
        "waiting for them; nothing of them is recorded, so their next owner runs those steps again", running,
    )
    _exit_now(code)


def exit_if_reads_linger(log_: object, code: int) -> None:
    """``os._exit(code)`` if blocking reads of ``log_`` (closed) still run on threads;
    otherwise return."""
    running = int(getattr(log_, "reads_running", 0))
    if not running:
        return
    logging.getLogger("harness.gateway").warning(
        "%d read(s) of the log still wait for an answer from it (is the broker down?): exiting without them "
        "(a read changes nothing)", running,
    )
    _exit_now(code)


def _exit_now(code: int) -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
