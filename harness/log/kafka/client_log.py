"""librdkafka's own log lines, to Python logging, each kind at most once a minute.

confluent-kafka hands a client's log lines to ``logger.log(level, "%s [%s] %s", fac,
client, text)`` when that client is polled. While a broker is down every client of a
process (a producer per owned partition, the readers, the group member...) repeats its
connect failure every second, and a client polled rarely delivers its backlog in one
burst: tens of thousands of identical ``Connect to ... failed`` lines that bury the
harness's own. Here lines of the same kind (the same level, facility and text, numbers
aside, whichever client said it) pass once per ``WINDOW_S``; the next one that passes
says how many like it were held back meanwhile.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["WINDOW_S", "ClientLog", "client_log"]

WINDOW_S = 60.0
"""A kind of line passes at most once per this many seconds."""
MAX_KINDS = 1000
"""Kinds remembered at most (past that, the oldest are forgotten)."""

EXPECTED = ("Coordinator load in progress",)
"""What librdkafka warns about that is part of normal work (a transaction coordinator
loading its state after a start or a move: the client retries): logged at INFO."""

_NUMBERS = re.compile(r"\d+")
_SUPPRESSED = re.compile(r",? ?\d+ identical error\(s\) suppressed")
"""librdkafka's own count of repeats (``Connect to ... failed: Connection refused (after 0ms in
state CONNECT, 3 identical error(s) suppressed)``): not part of a line's kind, or every
repeat after the first would be a new kind that passes."""


_WHERE = re.compile(r"^\[thrd:[^\]]*\]: (?:\S+: )*")
"""Which of a client's threads said it, and about which broker connection
(``[thrd:GroupCoordinator]: GroupCoordinator: 127.0.0.1:9092: ``): a broker that went away
is refused on every connection of every client, the same failure each time."""


def _kind_text(text: str) -> str:
    return _NUMBERS.sub("#", _SUPPRESSED.sub("", _WHERE.sub("", text)))


class ClientLog:
    """A ``logger`` for librdkafka clients (``log(level, fmt, *args)``), throttled per kind."""

    def __init__(
        self, logger: logging.Logger, *, window: float = WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger = logger
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()  # (clients log from their own threads)
        self._kinds: dict[tuple[Any, ...], list[float]] = {}  # kind -> [last passed at, held back since]

    def log(self, level: int, msg: str, *args: Any) -> None:
        if level > logging.INFO and any(expected in str(args[-1] if args else msg) for expected in EXPECTED):
            level = logging.INFO
        if not self._logger.isEnabledFor(level):
            return
        if len(args) == 3:  # (facility, client name, text): the client is not part of the kind
            facility, _client, text = args
            kind: tuple[Any, ...] = (level, facility, _kind_text(str(text)))
        else:
            kind = (level, _kind_text(msg % args if args else msg))
        now = self._clock()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is not None and now - seen[0] < self._window:
                seen[1] += 1
                return
            held, since = (int(seen[1]), now - seen[0]) if seen is not None else (0, 0.0)
            self._kinds.pop(kind, None)  # (re-inserted last: the oldest kinds come first)
            self._kinds[kind] = [now, 0]
            if len(self._kinds) > MAX_KINDS:
                del self._kinds[next(iter(self._kinds))]
        if held:
            self._logger.log(level, msg + " (%d more like this in the last %.0f s)", *args, held, since)
        else:
            self._logger.log(level, msg, *args)


client_log = ClientLog(logging.getLogger("harness.log.kafka.client"))
"""The one every Kafka client of the process logs through (``KafkaSettings._base``)."""
