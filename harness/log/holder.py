"""Whether the holder of a lapsed lease is a process still alive on this machine.

A lease is renewed by the holder's own threads (its event loop, or its loop watchdog
when the loop is blocked). A call that keeps the GIL (a long C computation: a huge
integer power, a runaway regex, a sort of millions of items, a C extension that does
not release it) stops every thread of its process, the watchdog too, so the lease
lapses while the step is still running. Another owner that took the session over then
would run that step a second time. On SQLite every owner shares one machine, so a
taker can ask the OS: a holder process that is alive and not stopped (SIGSTOP) keeps
its sessions for up to :data:`HOLDER_GRACE_S` past its lease, the time the watchdog
keeps a blocked loop's leases; one stuck longer is taken as hung. A dead, stopped or
zombie holder, one on another machine, or one whose owner id names no process, is
taken over as soon as its lease ran out, as before.

Linux only (``/proc``); elsewhere nothing changes. Read only when a lease has lapsed,
never on the per-step path.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["HOLDER_GRACE_S", "owner_pid", "running_holder"]

HOLDER_GRACE_S = 300.0
"""How long past its lease a holder still alive on this machine keeps its sessions
(the loop watchdog's ``KEEP_LEASES_FOR_S``: a process stuck longer is hung)."""

_PROC = Path("/proc")


def owner_pid(owner: str, hostname: str) -> int | None:
    """The pid an owner id names if it names a process on ``hostname``.

    Owner ids are ``<host>:<pid>:<hex>`` (``HarnessHost``) and
    ``worker:<host>:<pid>:<hex>`` (``harness worker``); any other id names no process.
    """
    head, sep, _tag = owner.rpartition(":")
    head, sep2, pid = head.rpartition(":")
    if not (sep and sep2 and pid.isdigit()):
        return None
    host = head.rpartition(":")[2]
    if host != hostname:
        return None
    return int(pid)


def _state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from ``/proc/<pid>/stat`` (None: no such process)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 1 :].split()  # the command name may hold spaces and ')'
    return fields[0].decode("ascii", "replace") if fields else None


def running_holder(owner: str) -> int | None:
    """The pid of ``owner``'s process if it is alive on this machine and not stopped,
    traced or a zombie; None otherwise (or off Linux, or when it is this process: this
    process is running, so a lease of its own that lapsed is not held up by the GIL)."""
    if not _PROC.is_dir():
        return None
    pid = owner_pid(owner, socket.gethostname())
    if pid is None or pid == os.getpid():
        return None
    state = _state(pid)
    if state is None or state in {"T", "t", "Z", "X", "x"}:
        return None
    return pid
