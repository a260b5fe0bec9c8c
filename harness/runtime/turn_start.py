"""A turn's ``harness.turn.started``: appended alone, or with the turn's first answer.

The first model call of a turn starts at once, beside its start (``driver._start_turn``).
A model that answers within :data:`RIDE_S` (a cached or scripted answer, a small local
model) has its answer logged in the SAME append as the start, ``[turn.started,
model.response, ...]``: one commit fewer per turn. A slower one gets the start appended
alone once ``RIDE_S`` passed, and its answer waits for that append (as a log must never
hold a response of a turn it does not hold). docs/architecture.md, "Fewer commits per
turn", says why every rule still holds.

:class:`TurnStart` holds the start until one of the two happens and tells the driver,
through :attr:`TurnStart.done`, when (and whether) it is in the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from harness.errors import RecordTooLarge
from harness.records import Record

__all__ = ["RIDE_S", "TurnStart"]

RIDE_S = 0.002
"""How long a turn's start waits for the first answer to ride with: about one commit, so
a slow model's turn is seen started no later than the commit after it would have been."""

Commit = Callable[[list[Record]], Awaitable[None]]


class TurnStart:
    """The start of one turn, not in the log yet: :meth:`alone` or :meth:`with_answer`
    appends it, once. :attr:`done` resolves when that append settles (its error, if any).
    """

    def __init__(self, records: list[Record], commit: Commit) -> None:
        self._records = records
        self._commit = commit
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._appending: asyncio.Future[None] | None = None

    @property
    def issued(self) -> bool:
        """Its append was issued (alone or with an answer)."""
        return self._appending is not None

    def alone(self) -> asyncio.Future[None]:
        """Append the start by itself (unless already issued); returns :attr:`done`."""
        if self._appending is None:
            self._appending = asyncio.ensure_future(self._commit(self._records))
            self._appending.add_done_callback(self._settle)
        return self.done

    async def with_answer(self, records: list[Record]) -> None:
        """Append the start followed by ``records`` (the first answer's append) as one.

        The append runs to its end even if the caller is cancelled meanwhile (it may land
        or not: :attr:`done` says which). If the answer is too large for the log
        (:class:`~harness.errors.RecordTooLarge`: nothing of that append landed), the
        start is appended alone first, then the error is raised: the turn it starts is
        in the log when the caller fails it.
        """
        assert self._appending is None, "a turn's start is appended once"
        self._appending = asyncio.ensure_future(self._together(records))
        self._appending.add_done_callback(self._settle)
        await asyncio.shield(self._appending)

    async def _together(self, records: list[Record]) -> None:
        try:
            await self._commit([*self._records, *records])
        except RecordTooLarge:
            await self._commit(self._records)  # its failure replaces the too-large error
            if not self.done.done():
                self.done.set_result(None)
            raise

    def _settle(self, appending: asyncio.Future[None]) -> None:
        if self.done.done():
            return
        if appending.cancelled():
            self.done.cancel()
        elif (error := appending.exception()) is not None:
            self.done.set_exception(error)
        else:
            self.done.set_result(None)
