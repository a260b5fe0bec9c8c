"""The CPU scheduling policy of a worker process (Linux): ``batch`` by default.

A worker's threads hand work to each other many times a turn: the event loop queues an
append for its partition's writer thread, librdkafka's threads serve the producer and the
tail, the writer wakes the loop again. Under Linux's default policy every such wake-up
may preempt the thread running on that core, often the event loop while it holds
Python's GIL: the woken thread then blocks on the GIL at once, and the two switch back.
``SCHED_BATCH`` tells the scheduler these threads are throughput work: a woken thread
waits for a free core or the end of the running one's slice instead of preempting it.
No privilege is needed (the nice value stays). A real-time or idle policy given to the
process from outside (``chrt``) is left as it is.

Measured on the 2-core machine (``bench/e2e.py``'s deployed path, two workers of the
same code side by side in alternating windows, one of them batch): 1.20x the turns per
second, 0.85x the worker's CPU per turn, involuntary context switches 31 -> 10 per turn
(docs/architecture.md, "The worker's scheduling policy"). ``normal`` keeps the default.
"""

from __future__ import annotations

import os

__all__ = ["CPU_POLICIES", "DEFAULT_CPU_POLICY", "apply_cpu_policy"]

CPU_POLICIES = ("batch", "normal")
DEFAULT_CPU_POLICY = "batch"


def apply_cpu_policy(policy: str, *, pid_dir: str = "/proc/self/task") -> str | None:
    """Put every thread of this process under ``policy`` (threads started later inherit
    it from the thread that starts them). Returns why it could not (None: done, or
    nothing to do: ``normal`` on a process never changed, or not Linux)."""
    if policy not in CPU_POLICIES:
        raise ValueError(f"CPU policy is one of {', '.join(CPU_POLICIES)}, not {policy!r}")
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None or not hasattr(os, "sched_setscheduler"):
        return None if policy == "normal" else "this system has no SCHED_BATCH (Linux only)"
    wanted = batch if policy == "batch" else os.SCHED_OTHER
    try:
        threads = [int(t) for t in os.listdir(pid_dir)]
    except OSError:
        threads = [0]  # no /proc: this thread only
    for tid in threads:
        try:
            current = os.sched_getscheduler(tid)
            # Only between the two time-sharing policies: a real-time or idle policy an
            # operator chose (chrt) stays as it is.
            if current != wanted and current in (os.SCHED_OTHER, batch):
                os.sched_setscheduler(tid, wanted, os.sched_param(0))
        except ProcessLookupError:
            continue  # that thread ended meanwhile
        except OSError as exc:
            return f"cannot set the {policy} CPU policy ({exc.strerror or exc})"
    return None
