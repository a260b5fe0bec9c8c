"""Summaries of quiet sessions from a few of their records (a SQLite log's first listing).

PURE: no I/O, no clock. A session with no turn in progress is summarized from the
records of :data:`SUMMARY_TYPES` alone, and the time of its last record; its summary is
the one a fold of all its records gives (a test pins it on a rich file):

* its inputs (every kind: a pending one makes it ``running``, the first message names
  its harness), their settlements (the last outcome, ``failed``), its turns' starts and
  ends (``turns``, whether one is in progress) and its model usage (``usage``): the
  fold's handlers of these types read nothing but what these types build;
* with no turn in progress a summary shows no open ask, no sleep and no active input,
  so the records of the turns' work (model responses, tool calls, steps, sleeps, asks,
  results, app records: the bulk of a log) change nothing in it;
* its last activity is the latest time among the records read and its last record
  (from ``heads``). The full fold takes the latest time of every record: the two differ
  only when a record inside a turn is later than the turn's end and the session's last
  record (two owners of one turn whose clocks disagree).

Every other session is read whole and folded as before (:meth:`Digest.whole`): one with a
turn in progress (its asks and sleeps come from its calls), one with a record that does
not check or decode among those read, or whose last record does not, and one missing
from ``heads`` or with none of these types.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from harness.errors import CorruptRecord
from harness.records import (
    InputAnswer,
    InputCancel,
    InputMessage,
    InputRecords,
    InputSettled,
    LogEntry,
    ModelUsage,
    TurnFinished,
    TurnStarted,
)
from harness.replay import SessionState
from harness.views import SessionSummary, summarize

__all__ = ["SUMMARY_TYPES", "Digest", "digest"]

SUMMARY_TYPES: frozenset[str] = frozenset(
    cls.TYPE
    for cls in (
        InputMessage,
        InputAnswer,
        InputRecords,
        InputCancel,
        InputSettled,
        TurnStarted,
        TurnFinished,
        ModelUsage,
    )
)
"""The record types a quiet session's summary depends on (the module doc says why)."""


@dataclass(slots=True)
class Digest:
    """What a listing learned from the records of :data:`SUMMARY_TYPES`.

    Attributes:
        summaries: the sessions with no turn in progress -> their summary.
        whole: the sessions to read whole and fold (see the module doc).
        unreadable: the records read that did not check or decode and name no session
            (those of a session are counted by its whole read).
    """

    summaries: dict[str, SessionSummary] = field(default_factory=dict)
    whole: set[str] = field(default_factory=set)
    unreadable: int = 0


def digest(
    entries: Iterable[LogEntry | CorruptRecord],
    lasts: Mapping[str, LogEntry | CorruptRecord],
    *,
    now_ms: int,
) -> Digest:
    """Summaries from ``entries`` (every record of :data:`SUMMARY_TYPES`, in log order)
    and ``lasts`` (each session's last record), as of ``now_ms``."""
    out = Digest()
    states: dict[str, SessionState] = {}
    latest: dict[str, int] = {}
    for item in [*entries, *lasts.values()]:
        if isinstance(item, CorruptRecord):
            if item.session_id is None:
                out.unreadable += 1
            else:  # its session's whole read counts it
                out.whole.add(item.session_id)
            continue
        sid = item.session_id
        latest[sid] = max(latest.get(sid, item.record.ts), item.record.ts)
    for item in entries:
        if not isinstance(item, CorruptRecord):
            _state(states, item.session_id).apply(item.seq, item.record)
    out.whole.update(sid for sid in states if sid not in lasts)
    out.whole.update(sid for sid in lasts if sid not in states)
    for sid, state in states.items():
        if sid in out.whole or state.active_turn is not None:
            out.whole.add(sid)
            continue
        out.summaries[sid] = summarize(state, now_ms=now_ms, last_activity_ms=latest[sid])
    return out


def _state(states: dict[str, SessionState], sid: str) -> SessionState:
    state = states.get(sid)
    if state is None:
        state = states[sid] = SessionState(session_id=sid)
    return state
