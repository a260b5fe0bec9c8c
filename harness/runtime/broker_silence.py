"""What a worker says while its Kafka broker does not answer: one line when it stops
answering (with librdkafka's reason), then one at most every ``REPEAT_S`` saying for how
long, and one when it answers again. Pure: the clock is injected; the worker logs the lines.

Before, every probe (every ``PROBE_EVERY_S``) logged ``the broker did not answer a log-end
query: KafkaError{code=_TRANSPORT,val=-195,str="..."}``: a line every 5 s for as long as
the broker was down.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["REPEAT_S", "BrokerSilence", "kafka_reason"]

REPEAT_S = 60.0
"""How often a broker that still does not answer is mentioned again (as
``harness.log.kafka.client_log`` lets each kind of librdkafka line through)."""


def kafka_reason(exc: BaseException) -> str:
    """The readable part of a ``KafkaException`` (its ``KafkaError``'s text, not its repr)."""
    error = exc.args[0] if exc.args else None
    text = getattr(error, "str", None)
    if callable(text):
        return str(text())
    return str(exc) or type(exc).__name__


class BrokerSilence:
    """Turns probe outcomes into the worker's lines about its broker (None: say nothing)."""

    def __init__(self, bootstrap: str, *, repeat: float = REPEAT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._bootstrap = bootstrap
        self._repeat = repeat
        self._clock = clock
        self._last_ok = clock()
        self._said_at: float | None = None  # when the last line about this silence was said

    @property
    def silent(self) -> bool:
        return self._said_at is not None

    def failed(self, exc: BaseException) -> str | None:
        """A probe got no answer: the line to log, if one is due."""
        now = self._clock()
        if self._said_at is None:
            self._said_at = now
            return f"the broker at {self._bootstrap} did not answer ({kafka_reason(exc)}); waiting for it"
        if now - self._said_at < self._repeat:
            return None
        self._said_at = now
        return f"the broker at {self._bootstrap} has not answered for {now - self._last_ok:.0f} s; waiting for it"

    def answered(self) -> str | None:
        """A probe got an answer: the line to log if the broker had been silent."""
        now = self._clock()
        silent_for = now - self._last_ok
        self._last_ok = now
        if self._said_at is None:
            return None
        self._said_at = None
        return f"the broker at {self._bootstrap} answers again (after {silent_for:.0f} s)"
