"""``max_sessions``: at most N sessions of a worker running at once; the rest wait in order.

A session takes a slot when it starts to work (a new input, a turn to take over) and
gives it back once it stops running: it ended, failed, or every call of its turn waits
for a person or sleeps (those use no CPU and no model; a worker may hold thousands).
Sessions that want to start while every slot is taken wait in a queue, first come first
served, and start as slots free up. A session that wakes up (its sleep is due, its
answer came) goes on at once without queueing, so the count may briefly exceed N.

The gate knows nothing of sessions: whoever admits one gives a ``start`` coroutine
(which starts it and returns a predicate "still running?") and the gate calls it
when the session's turn comes. ``pump()`` gives back the slots of sessions that
stopped running and starts queued ones; the worker calls it periodically.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

__all__ = ["Active", "SessionGate", "Starter"]

Active = Callable[[], bool]
"""Whether an admitted session still runs (holds its slot)."""
Starter = Callable[[], Awaitable[Active | None]]
"""Starts a queued session; returns its ``Active`` predicate, or None if nothing is left to run."""


class SessionGate:
    """At most ``limit`` sessions running at once (``None``: no limit)."""

    def __init__(self, limit: int | None = None) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"max_sessions must be >= 1, not {limit}")
        self.limit = limit
        self._holders: dict[str, Active] = {}
        self._queue: OrderedDict[str, tuple[object, Starter]] = OrderedDict()

    @property
    def limited(self) -> bool:
        return self.limit is not None

    @property
    def running(self) -> int:
        """Sessions holding a slot."""
        return len(self._holders)

    @property
    def waiting(self) -> list[str]:
        """Queued sessions, first to start first."""
        return list(self._queue)

    def holds(self, session_id: str) -> bool:
        return session_id in self._holders

    def try_take(self, session_id: str, active: Active) -> bool:
        """Take a slot now if one is free and nobody waits ahead; the caller then starts it."""
        if self.limit is None or session_id in self._holders:
            if self.limit is not None:
                self._holders[session_id] = active
            return True
        if self._queue or len(self._holders) >= self.limit:
            return False
        self._holders[session_id] = active
        return True

    def enqueue(self, session_id: str, owner: object, start: Starter) -> None:
        """Wait for a slot (once: a session already queued keeps its place)."""
        if session_id not in self._queue:
            self._queue[session_id] = (owner, start)

    def drop(self, owner: object) -> None:
        """Forget what ``owner`` queued (its partition was revoked or stopped)."""
        for sid in [s for s, (o, _) in self._queue.items() if o is owner]:
            del self._queue[sid]

    def release(self, session_id: str) -> None:
        self._holders.pop(session_id, None)
        self._queue.pop(session_id, None)

    async def pump(self) -> int:
        """Give back the slots of sessions that stopped running; start queued sessions
        while slots are free. Returns how many started."""
        for sid, active in list(self._holders.items()):
            if not active():
                del self._holders[sid]
        started = 0
        while self._queue and (self.limit is None or len(self._holders) < self.limit):
            sid, (_, start) = self._queue.popitem(last=False)
            self._holders[sid] = _starting
            try:
                got = await start()
            except BaseException:
                self._holders.pop(sid, None)
                raise
            if got is None:
                self._holders.pop(sid, None)
            else:
                self._holders[sid] = got
                started += 1
        return started


def _starting() -> bool:
    return True
