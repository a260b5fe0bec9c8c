"""The per-turn INFO lines of a process ("turn 3 of session s-1 started ...", "... completed"),
sampled under load.

Two lines a turn cost a busy worker about a tenth of its CPU (bench/e2e.py at ~200 turns
a second: ~0.4 ms a turn, measured against the same worker without them, side by side),
and at that rate they are not read one by one anyway: ``harness_turns_total`` counts
them. So a process writes them as they come while that is at most ``RATE`` lines a
second on average (bursts of ``BURST``), which is every line of anything a person
watches; past that, lines pass at that rate and each one that passes says how many
were held back since the last. A turn that did not complete is always told.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["BURST", "RATE", "TurnLines"]

RATE = 10.0
"""Turn lines a second, on average, before they are sampled."""
BURST = 20
"""Turn lines that may pass at once (after a quiet while) before they are sampled."""


class TurnLines:
    """Writes turn lines to ``logger`` at INFO through a token bucket (module doc)."""

    def __init__(
        self, logger: logging.Logger, *, rate: float = RATE, burst: int = BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._held = 0
        self._lock = threading.Lock()  # (hosts of several event loops share the process's budget)

    def _take(self, always: bool) -> int | None:
        """None: hold this line back; else how many were held back before it."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
            self._at = now
            if self._tokens < 1 and not always:
                self._held += 1
                return None
            self._tokens = max(0.0, self._tokens - 1)
            held, self._held = self._held, 0
            return held

    def line(self, msg: str, *args: object, always: bool = False) -> None:
        """``logger.info(msg, *args)``, unless sampled out (``always``: never)."""
        if not self._logger.isEnabledFor(logging.INFO):
            return
        held = self._take(always)
        if held is None:
            return
        if held:
            self._logger.info(msg + " (%d turn lines held back before this one: over %g a second)",
                              *args, held, self._rate)
        else:
            self._logger.info(msg, *args)
