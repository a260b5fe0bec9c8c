"""Live events: what a session does right now that the log does not hold.

A model's answer streams in as text deltas. They reach subscribers as they arrive
(``session.events(live=True)`` in the process that drives the session; on Kafka the
topic ``<prefix>.live`` for every other process, read by
``HarnessClient.events(sid, live=True)`` and the gateway's ``KafkaLiveTails``; in
``harness serve`` the worker's sessions hand them to the gateway's streams through a
``LiveRouter``), but never become log records: the completed
``harness.model.response`` is logged once, before any tool runs.

Live events are best effort: a subscriber that was not listening, or that falls
too far behind, misses some; the committed response that follows holds the whole
text. Nothing here does I/O but the Kafka module (imported lazily).
"""

from harness.live.events import LIVE_TEXT_DELTA, LiveEvent
from harness.live.hub import (
    LiveHub,
    LiveOrder,
    LivePublisher,
    LiveRouter,
    LiveSource,
    LiveSubscription,
    merge_live,
)

__all__ = [
    "LIVE_TEXT_DELTA",
    "LiveEvent",
    "LiveHub",
    "LiveOrder",
    "LivePublisher",
    "LiveRouter",
    "LiveSource",
    "LiveSubscription",
    "merge_live",
]
