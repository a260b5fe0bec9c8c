"""The metrics facade the runtime calls: ``metrics.step(harness, outcome, seconds)`` ...

With metrics off (the default, and always for an embedded user who never turns
them on) every method is one attribute test and a return: nothing is imported,
nothing is allocated. ``enable_metrics()`` (in ``harness.observability``) plugs a
Prometheus sink in; only then is ``prometheus_client`` imported.

Labels stay bounded: outcomes and kinds come from fixed sets (anything else is
counted as ``other``), and free names (harness, tool, HTTP route, failure code)
are capped per label at ``MAX_LABEL_VALUES`` distinct values, after which new ones
are counted as ``other``. A session id is never a label.

Gauges that describe a worker's state (partitions owned, sessions by state,
checkpoint age, input lag) are not pushed: a worker registers a *source* whose
``observe()`` returns an immutable :class:`Observation`, read at scrape time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "MAX_LABEL_VALUES",
    "OTHER",
    "RATE_LIMIT_REASONS",
    "SESSION_STATES",
    "STEP_OUTCOMES",
    "TOKEN_KINDS",
    "TOOL_OUTCOMES",
    "TURN_OUTCOMES",
    "Metrics",
    "MetricsSink",
    "Observation",
    "ObservationSource",
    "metrics",
]

OTHER = "other"
"""The label value of anything outside a fixed set, or past a label's cap."""
MAX_LABEL_VALUES = 100
"""Distinct values one free label (harness, tool, route, code) may take per process."""

STEP_OUTCOMES = frozenset({"ran", "served", "failed"})
"""``ran``: ``fn`` was called and its value committed; ``served``: the value came from
the log (a replay); ``failed``: ``fn`` or the commit raised."""
TOOL_OUTCOMES = frozenset({"ok", "error", "cut", "rejected"})
"""``ok``/``error``: the tool returned / returned an error result; ``cut``: recovery
answered for a call that may have run; ``rejected``: unknown tool or invalid arguments."""
TURN_OUTCOMES = frozenset({"completed", "failed", "aborted"})
TOKEN_KINDS = frozenset({"input", "output"})
RATE_LIMIT_REASONS = ("rate_limit", "auth_failures")
"""Why the gateway answered 429 by a limit: the caller's ``--rate-limit``, or its address's
``--auth-failure-limit``."""
SESSION_STATES = ("running", "waiting", "sleeping", "unreadable", "held")
"""``waiting``: parked on ``step.ask``; ``sleeping``: parked on ``step.sleep``;
``unreadable``: never driven, its log has an unreadable record (parked for good, its
inputs refused); ``held``: not driven while ``secrets_for`` fails for it (retried)."""


@dataclass(frozen=True, slots=True)
class Observation:
    """What one worker looks like now (read by the metrics collector at scrape time).

    Args:
        partitions: the partitions this worker drives.
        sessions: live sessions by state (``SESSION_STATES``).
        uncovered_since: per owned partition, the wall time (``time.time()``) of the
            oldest folded record no checkpoint covers yet; absent when all are covered.
        input_lag: per owned partition, log end minus the position driven so far.
    """

    partitions: tuple[int, ...] = ()
    sessions: Mapping[str, int] = field(default_factory=dict)
    uncovered_since: Mapping[int, float] = field(default_factory=dict)
    input_lag: Mapping[int, int] = field(default_factory=dict)


class ObservationSource(Protocol):
    def observe(self) -> Observation: ...


class MetricsSink(Protocol):
    """Where events go when metrics are on (``harness.observability.prometheus``)."""

    def harness_served(self, harness: str) -> None: ...
    def step(self, harness: str, outcome: str, seconds: float | None) -> None: ...
    def tool_call(self, harness: str, tool: str, outcome: str) -> None: ...
    def turn(self, harness: str, outcome: str, code: str | None) -> None: ...
    def turn_attempt(self, harness: str) -> None: ...
    def fenced_writer(self) -> None: ...
    def loop_stalled(self) -> None: ...
    def loop_stall(self, seconds: float) -> None: ...
    def group_commit(self, batch_size: int) -> None: ...
    def model_call(self, harness: str, seconds: float, input_tokens: int, output_tokens: int) -> None: ...
    def dead_letters(self, count: int) -> None: ...
    def drain_cut(self, sessions: int) -> None: ...
    def rebuild(self, seconds: float, records: int) -> None: ...
    def http_request(self, route: str, method: str, status: int, seconds: float) -> None: ...
    def sse_subscribers(self, delta: int) -> None: ...
    def rate_limited(self, reason: str) -> None: ...
    def add_source(self, source: ObservationSource) -> None: ...
    def remove_source(self, source: ObservationSource) -> None: ...


class _Bounded:
    """Caps the distinct values of one free label; the rest become ``other``."""

    def __init__(self, cap: int = MAX_LABEL_VALUES) -> None:
        self._cap = cap
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str | None) -> str:
        if not value:
            return OTHER
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) >= self._cap:
                return OTHER
            self._seen.add(value)
        return value


def _one_of(value: str, allowed: frozenset[str]) -> str:
    return value if value in allowed else OTHER


class Metrics:
    """The process's metrics facade; a no-op until a sink is plugged in.

    Every method is safe to call from any thread and never raises for a bad label
    value (it is counted as ``other``): metrics must not break a session.
    """

    def __init__(self) -> None:
        self._sink: MetricsSink | None = None
        self._reset_caps()

    def _reset_caps(self) -> None:
        self._harness = _Bounded()
        self._tool = _Bounded()
        self._code = _Bounded()
        self._route = _Bounded()

    @property
    def enabled(self) -> bool:
        return self._sink is not None

    def plug(self, sink: MetricsSink | None) -> None:
        """Send events to ``sink`` from now on (``None``: metrics off again).

        A new sink starts with empty series, so each label's cap starts afresh too.
        """
        self._reset_caps()
        self._sink = sink

    # -- steps, tools, turns, models: the session runtime's call sites ----------------

    def harness_served(self, harness: str) -> None:
        """This process runs ``harness``: its series that alerts take ``increase()`` of
        start at 0 now, since a series born at its first increment hides that increment
        (a worker restarted by a poison turn would never show its ``attempts_exhausted``)."""
        sink = self._sink
        if sink is not None:
            sink.harness_served(self._harness(harness))

    def step(self, harness: str, outcome: str, seconds: float | None = None) -> None:
        """One ``step.do``: ``harness_steps_total`` (+ ``harness_step_duration_seconds``
        when ``seconds`` is given: time in ``fn`` plus the commit)."""
        sink = self._sink
        if sink is not None:
            sink.step(self._harness(harness), _one_of(outcome, STEP_OUTCOMES), seconds)

    def tool_call(self, harness: str, tool: str, outcome: str) -> None:
        """One finished tool call: ``harness_tool_calls_total``."""
        sink = self._sink
        if sink is not None:
            sink.tool_call(self._harness(harness), self._tool(tool), _one_of(outcome, TOOL_OUTCOMES))

    def turn(self, harness: str, outcome: str, code: str | None = None) -> None:
        """One finished turn: ``harness_turns_total`` (+ ``harness_turn_failures_total``
        by code, e.g. ``attempts_exhausted``, when it did not complete)."""
        sink = self._sink
        if sink is not None:
            out = _one_of(outcome, TURN_OUTCOMES)
            sink.turn(self._harness(harness), out, None if out == "completed" else self._code(code))

    def turn_attempt(self, harness: str) -> None:
        """A new owner took up an unfinished turn (``harness.turn.resumed``)."""
        sink = self._sink
        if sink is not None:
            sink.turn_attempt(self._harness(harness))

    def fenced_writer(self) -> None:
        """A writer found itself fenced by a newer owner."""
        sink = self._sink
        if sink is not None:
            sink.fenced_writer()

    def loop_stalled(self) -> None:
        """The event loop has not run for a while: counted when the watchdog notices it (its
        WARNING), so a loop hung for good, which never runs again, is seen too."""
        sink = self._sink
        if sink is not None:
            sink.loop_stalled()

    def loop_stall(self, seconds: float) -> None:
        """The event loop did not run for ``seconds`` (blocking code; reported when it
        runs again, or when the watchdog gives its leases up)."""
        sink = self._sink
        if sink is not None:
            sink.loop_stall(seconds)

    def group_commit(self, batch_size: int) -> None:
        """One committed transaction that carried ``batch_size`` appends."""
        sink = self._sink
        if sink is not None:
            sink.group_commit(batch_size)

    def model_call(self, harness: str, seconds: float, *, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """One model call: its latency and the tokens it used (0 when the model does not say)."""
        sink = self._sink
        if sink is not None:
            sink.model_call(self._harness(harness), seconds, max(input_tokens, 0), max(output_tokens, 0))

    # -- worker and gateway -----------------------------------------------------------

    def dead_letters(self, count: int = 1) -> None:
        """Undecodable records copied to the dead-letter topic."""
        sink = self._sink
        if sink is not None and count > 0:
            sink.dead_letters(count)

    def drain_cut(self, sessions: int) -> None:
        """A hand-over's drain timed out with ``sessions`` still running (cut)."""
        sink = self._sink
        if sink is not None and sessions > 0:
            sink.drain_cut(sessions)

    def rebuild(self, seconds: float, records: int) -> None:
        """A partition was taken up: how long its rebuild took and how many records it read."""
        sink = self._sink
        if sink is not None:
            sink.rebuild(seconds, records)

    def http_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """One gateway request; ``route`` is the route's template (``/sessions/{id}``), never a path."""
        sink = self._sink
        if sink is not None:
            sink.http_request(self._route(route), method.upper() if method.isalpha() else OTHER, status, seconds)

    def sse_subscribers(self, delta: int) -> None:
        """An SSE stream opened (+1) or closed (-1)."""
        sink = self._sink
        if sink is not None:
            sink.sse_subscribers(delta)

    def rate_limited(self, reason: str = "rate_limit") -> None:
        """A gateway request refused by a rate limit (429): ``reason`` ``rate_limit`` (the
        caller's ``--rate-limit``) or ``auth_failures`` (its address's ``--auth-failure-limit``)."""
        sink = self._sink
        if sink is not None:
            sink.rate_limited(reason if reason in RATE_LIMIT_REASONS else OTHER)

    def add_source(self, source: ObservationSource) -> None:
        sink = self._sink
        if sink is not None:
            sink.add_source(source)

    def remove_source(self, source: ObservationSource) -> None:
        sink = self._sink
        if sink is not None:
            sink.remove_source(source)

    @staticmethod
    def now() -> float:
        """A monotonic clock reading, for durations (``metrics.now() - started``)."""
        return time.monotonic()


metrics = Metrics()
"""The process's facade. ``from harness.observability import metrics``."""
