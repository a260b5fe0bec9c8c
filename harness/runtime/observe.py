"""What a worker publishes about itself: metrics observations and health.

The event loop publishes; the metrics server's thread reads. Everything the
thread reads is an immutable snapshot or a plain number swapped in whole, so it
needs no lock and never sees a dict being changed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from harness.observability.facade import SESSION_STATES, Observation
from harness.replay import SessionState

if TYPE_CHECKING:
    from harness.runtime.partition import PartitionRuntime

__all__ = ["BROKER_STALE_S", "LIVENESS_STALE_S", "WorkerHealth", "observe_runtimes", "session_state"]

LIVENESS_STALE_S = 120.0
"""The loop's heartbeat may be this old before ``/healthz`` fails. Generous: folding a
large partition holds the loop for a while, and a restart would only redo that work."""
BROKER_STALE_S = 30.0
"""``/readyz`` fails when the broker has not answered for this long (probes every few s)."""


def session_state(state: SessionState, now_ms: int) -> str:
    """``running``, ``waiting`` (parked on an ask) or ``sleeping`` (parked on a sleep)."""
    turn = state.active_turn
    if turn is None or turn.last_response is None:
        return "running"
    calls = [c for c in state.batch(turn.last_response) if not c.finished]
    if not calls:
        return "running"
    if any(c.waiting_for_person() for c in calls):
        return "waiting"
    if any(wake > now_ms for c in calls for wake in c.sleeps.values()):
        return "sleeping"
    return "running"


def observe_runtimes(
    runtimes: Mapping[int, PartitionRuntime],
    owned: Iterable[int],
    *,
    uncovered_since: Mapping[int, float],
    input_lag: Mapping[int, int],
    now_ms: int,
) -> Observation:
    """A snapshot of the partitions a worker drives and their sessions."""
    counts = dict.fromkeys(SESSION_STATES, 0)
    for rt in list(runtimes.values()):
        for session in list(rt.sessions.values()):
            counts[session_state(session.state, now_ms)] += 1
        counts["unreadable"] += len(rt.parked)
        counts["held"] += len(rt.held)
    partitions = tuple(sorted(owned))
    return Observation(
        partitions=partitions,
        sessions=counts,
        uncovered_since={p: t for p, t in uncovered_since.items() if p in partitions},
        input_lag={p: n for p, n in input_lag.items() if p in partitions},
    )


class WorkerHealth:
    """Liveness and readiness of a worker, from facts its loop publishes.

    * alive: the loop beat within ``LIVENESS_STALE_S``.
    * ready: it went live (took up what it was given, or joined its group with
      nothing to take), nothing assigned waits to be taken up, and (Kafka) the
      broker answered within ``BROKER_STALE_S``.
    """

    def __init__(self, *, needs_broker: bool) -> None:
        self.needs_broker = needs_broker
        self.beat_at = time.monotonic()
        self.live = False
        self.pending = 0  # partitions assigned but not yet taken up
        self.broker_at: float | None = None  # last time the broker answered
        self.stopping = False
        self.error: str | None = None

    def beat(self) -> None:
        self.beat_at = time.monotonic()

    def broker_answered(self) -> None:
        self.broker_at = time.monotonic()

    def alive(self) -> tuple[bool, str]:
        if self.error is not None:
            return False, f"worker failed: {self.error}"
        age = time.monotonic() - self.beat_at
        if age > LIVENESS_STALE_S:
            return False, f"event loop silent for {age:.0f}s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        ok, why = self.alive()
        if not ok:
            return ok, why
        if self.stopping:
            return False, "stopping"
        if not self.live:
            return False, "not yet live (joining the group / rebuilding)"
        if self.pending:
            return False, f"{self.pending} assigned partition(s) not yet taken up"
        if self.needs_broker:
            if self.broker_at is None:
                return False, "the broker has not answered yet"
            age = time.monotonic() - self.broker_at
            if age > BROKER_STALE_S:
                return False, f"the broker has not answered for {age:.0f}s"
        return True, "ok"
