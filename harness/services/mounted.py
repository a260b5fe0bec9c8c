"""Files mounted from Kubernetes Secrets: noticing that they changed.

The kubelet publishes a Secret's new version within about a minute of its change: it
writes a timestamped folder and swaps the ``..data`` link to it in one rename (the keys
are links through ``..data``). A service that read such files (the worker's
``--secrets-dir``, the gateway's JWT secret, JWKS and API keys) asks :class:`Recheck`
whether they changed, at most every ``RECHECK_SECONDS``, and reads them again if so:
a rotated secret needs no restart.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["RECHECK_SECONDS", "Recheck", "path_signature"]

RECHECK_SECONDS = 10.0
"""Least time between two looks at mounted files (stat calls only, no read)."""


def path_signature(path: Path) -> tuple[object, ...]:
    """What changes when the file or the folder of files at ``path`` changes: for a
    folder, where its ``..data`` link points and each entry's identity, modification
    time and size; for a file, the same of the file its links lead to. An entry that
    cannot be looked at is part of the signature as such (its error)."""
    try:
        if not path.is_dir():
            return (_identity(path),)
    except OSError as exc:
        return (type(exc).__name__,)
    out: list[object] = []
    try:
        out.append(os.readlink(path / "..data"))
    except OSError:
        out.append(None)
    try:
        with os.scandir(path) as entries:
            out.extend((entry.name, _identity(Path(entry.path))) for entry in sorted(entries, key=lambda e: e.name))
    except OSError as exc:
        out.append(type(exc).__name__)
    return tuple(out)


def _identity(path: Path) -> object:
    try:
        st = path.stat()
    except OSError as exc:
        return type(exc).__name__
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class Recheck:
    """Whether some mounted paths changed since the last look, looked at no more often
    than ``every`` seconds (thread-safe; one caller is told of each change).

    Args:
        paths: files or folders (none: never changed).
        every: least seconds between two looks.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        paths: Iterable[str | Path],
        *,
        every: float = RECHECK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._paths = [Path(p) for p in paths]
        self._every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._seen = self._signature()
        self._checked = clock()

    def changed(self) -> bool:
        """True once after the paths changed, when it is time to look again."""
        if not self._paths:
            return False
        with self._lock:
            if self._clock() - self._checked < self._every:
                return False
            self._checked = self._clock()
            signature = self._signature()
            if signature == self._seen:
                return False
            self._seen = signature
            return True

    def _signature(self) -> tuple[tuple[object, ...], ...]:
        return tuple(path_signature(p) for p in self._paths)
