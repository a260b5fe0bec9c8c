"""Session views: what a person (or a console, or an API client) sees of a session.

PURE: no I/O, no clock (the time comes in as ``now_ms``), no asyncio. Two views:

* :func:`summarize`: one session at a glance (:class:`SessionSummary`): its harness,
  its state (``running``, ``waiting`` for a person, ``sleeping`` until a time, ``idle``,
  ``failed``), its last activity, its open asks, how many turns and how the last one went,
  and what its model calls used (:class:`Usage`: tokens, cost when known);
* :func:`timeline`: a session's records as a person reads them (:class:`TimelineItem`):
  inputs and their settlements, turns with their attempts and takeovers, model
  responses (and their usage, and the transient failures retried before them), tool
  calls with their steps, asks with their answer (or still open), sleeps with their
  wake time, app records and errors.

Both are JSON-serialisable with ``.to_json()``, so ``harness sessions --json``,
``harness show --json``, the gateway's API and the web console share one shape.
Times are milliseconds since the epoch (UTC), as in the records.

The two live in :mod:`harness.views.summaries` and :mod:`harness.views.timelines`;
import them from here (``from harness.views import summarize, timeline``).
"""

from harness.views.summaries import (
    SESSION_STATES,
    OpenAsk,
    OpenSleep,
    SessionStateName,
    SessionSummary,
    Usage,
    classify,
    input_queued_behind_person,
    input_waits_for_person,
    last_record_ts,
    open_asks,
    open_sleeps,
    summarize,
    usage_text,
)
from harness.views.timelines import Timeline, TimelineItem, preview, timeline

__all__ = [
    "SESSION_STATES",
    "OpenAsk",
    "OpenSleep",
    "SessionStateName",
    "SessionSummary",
    "Timeline",
    "TimelineItem",
    "Usage",
    "classify",
    "input_queued_behind_person",
    "input_waits_for_person",
    "last_record_ts",
    "open_asks",
    "open_sleeps",
    "preview",
    "summarize",
    "timeline",
    "usage_text",
]
