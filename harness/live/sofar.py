"""The answer being streamed, so far: what a reader who comes half-way through is given first.

Live deltas go to the subscribers of the moment; a page reloaded half-way through an
answer (or a stream that reconnects) used to get only the deltas after it came back, the
start of the answer lost until the committed response. :class:`AnswersSoFar` keeps, per
session, the text of the model call being streamed (its latest ``turn`` / ``index`` /
``retry``) and gives a new subscriber that text as one delta (``position``: where it
starts) before the deltas that follow.

Kept for :data:`KEEP_S` after the answer's last delta (an answer that went quiet that
long is over, or its reader gets a gap, as before), at most :data:`MAX_CHARS` characters
an answer and :data:`MAX_SESSIONS` sessions. Pure: no I/O, the clock is given.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.live.events import LIVE_TEXT_DELTA, LiveEvent

__all__ = ["KEEP_S", "MAX_CHARS", "MAX_SESSIONS", "AnswersSoFar"]

KEEP_S = 30.0
"""An answer is kept this long after its last delta (a page reload takes a second or two)."""
MAX_CHARS = 262_144
"""An answer longer than this is not kept (its late reader sees a gap, marked)."""
MAX_SESSIONS = 4096
"""Answers kept at most (the oldest go first)."""


@dataclass(slots=True)
class _Answer:
    turn: int
    index: int
    retry: int
    start: int  # the answer's position of parts[0][0]
    end: int  # the position after the last character kept
    after: int | None  # the latest log position its deltas follow
    ts: int
    seen: float  # (the clock) when its last delta came
    parts: list[str] = field(default_factory=list)

    def key(self) -> tuple[int, int, int]:
        return self.turn, self.index, self.retry


class AnswersSoFar:
    """Each session's answer being streamed, so far (see the module docstring)."""

    def __init__(
        self,
        *,
        keep_s: float = KEEP_S,
        max_chars: int = MAX_CHARS,
        max_sessions: int = MAX_SESSIONS,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keep_s = keep_s
        self._max_chars = max_chars
        self._max_sessions = max_sessions
        self._now = now
        self._answers: OrderedDict[str, _Answer] = OrderedDict()

    def __len__(self) -> int:
        return len(self._answers)

    def add(self, event: LiveEvent) -> None:
        """Take one published delta into its session's answer."""
        if event.type != LIVE_TEXT_DELTA:
            return
        now = self._now()
        self._expire(now)
        sid, text, at = event.session_id, event.text, event.position
        answer = self._answers.get(sid)
        if answer is not None and answer.key() == (event.turn, event.index, event.retry) and at <= answer.end:
            if at < answer.start:  # (an earlier part: read back later than what followed it)
                if at + len(text) < answer.start:
                    return  # it would leave a gap: the start stays unknown
                answer.parts[:0] = [text[: answer.start - at]]
                answer.start = at
            if at + len(text) > answer.end:  # (a repeat adds nothing; an overlap its new part)
                answer.parts.append(text[answer.end - at:])
                answer.end = at + len(text)
        else:  # another call or try, or a gap: the answer starts over from this delta
            answer = _Answer(event.turn, event.index, event.retry, at, at + len(text), None, event.ts, now, [text])
            self._answers[sid] = answer
        if answer.end - answer.start > self._max_chars:
            del self._answers[sid]
            return
        if event.after is not None and (answer.after is None or event.after > answer.after):
            answer.after = event.after
        answer.ts, answer.seen = event.ts, now
        self._answers.move_to_end(sid)
        while len(self._answers) > self._max_sessions:
            self._answers.popitem(last=False)

    def so_far(self, session_id: str, after: int | None = None) -> LiveEvent | None:
        """The session's answer so far as one delta, or None (none kept, or the reader
        starts past it: ``after`` beyond the position its deltas follow, so its response
        may be among what the reader already has)."""
        self._expire(self._now())
        answer = self._answers.get(session_id)
        if answer is None:
            return None
        if after is not None and answer.after is not None and after > answer.after:
            return None
        if len(answer.parts) > 1:
            answer.parts[:] = ["".join(answer.parts)]
        return LiveEvent(
            session_id, answer.turn, answer.index, answer.retry, answer.start,
            answer.parts[0] if answer.parts else "", answer.ts, after=answer.after,
        )

    def latest(self, after: int | None = None) -> LiveEvent | None:
        """``so_far`` of the session whose answer moved last (the one of a one-session keeper)."""
        self._expire(self._now())
        return self.so_far(next(reversed(self._answers)), after) if self._answers else None

    def _expire(self, now: float) -> None:
        answers = self._answers
        while answers:
            oldest = next(iter(answers.values()))
            if now - oldest.seen <= self._keep_s:
                return
            answers.popitem(last=False)
