"""``Session``: a handle on one durable session, given out by ``HarnessHost.open``.

Handles of one session in one host share one core (``harness.runtime.core``): their
calls are queued in the log's order and each settles once; ``FencedError`` means a
real loss of ownership to another process. After ``close()`` every call on the handle
raises ``SessionClosed`` and writes nothing; calls still waiting end the same way.
Closing the last handle of a session stops its driver (recoverably: nothing is
written) and gives its ownership up at once, so another process can take it over.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from harness.definition import Harness
from harness.errors import DefinitionError, SessionClosed
from harness.live import LiveEvent, merge_live
from harness.records import LogEntry
from harness.replay import SessionState, UsageTotals
from harness.runtime import calls
from harness.runtime.core import SessionCore, SessionHost
from harness.runtime.results import OpenAsk, TurnResult

__all__ = ["OpenAsk", "Session", "SessionHost", "TurnResult"]

T = TypeVar("T")


class Session:
    """A handle on one durable session (made by ``HarnessHost.open``)."""

    def __init__(self, core: SessionCore, *, on_close: Callable[[Session], Awaitable[None]] | None = None) -> None:
        self._core = core
        self._on_close = on_close
        self._closed = False
        self._calls: set[asyncio.Future[Any]] = set()

    # -- what the handle shows ------------------------------------------------------------

    @property
    def harness(self) -> Harness:
        return self._core.harness

    @property
    def session_id(self) -> str:
        return self._core.session_id

    @property
    def secrets(self) -> Mapping[str, str]:
        return self._core.secrets

    @property
    def log_id(self) -> str:
        """The session's log id, the first part of every idempotency key."""
        return self._core.log_id

    @property
    def state(self) -> SessionState:
        """The folded state (read-only by convention)."""
        return self._core.state

    @property
    def failed(self) -> BaseException | None:
        """Why this session stopped for good here (fenced, an I/O failure), if it did."""
        return self._core.fatal

    @property
    def busy(self) -> bool:
        """A driver task is running (a turn, or inputs being taken)."""
        return self._core.busy

    @property
    def closed(self) -> bool:
        return self._closed

    # -- calls ---------------------------------------------------------------------------

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise SessionClosed(self.session_id)
        task = asyncio.ensure_future(coro)
        self._calls.add(task)
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:  # the caller was cancelled: so is its call
            task.cancel()
            raise
        finally:
            self._calls.discard(task)
        if task.cancelled():
            raise SessionClosed(self.session_id)  # close() ended the call
        return task.result()

    async def send(self, text: str, input_id: str | None = None) -> TurnResult:
        """Send a user message and run its turn.

        Resending an ``input_id`` with the same text has no second effect; with another
        text the result is ``rejected`` with code ``input_conflict`` (nothing is written).
        """
        return await self._call(calls.send(self._core, text, input_id))

    async def recover(self) -> list[TurnResult]:
        """Take over (once the old owner's lease expired) and finish what the log left open."""
        return await self._call(calls.recover(self._core))

    async def answer(
        self, tool_call_id: str, name: str, value: Any, input_id: str | None = None
    ) -> TurnResult | None:
        """Answer a ``step.ask``; returns how the resumed turn went (None: no such call).

        Raises:
            InvalidAnswer: no such open ask, it has its answer already (``reason``
                ``already_answered``; the same value again returns the turn's result), it
                expired, or the value fails its schema
                (the tool's pydantic model where this host runs the tool); the tool keeps
                waiting.
        """
        return await self._call(calls.answer(self._core, tool_call_id, name, value, input_id))

    async def append_records(self, records: list[dict[str, Any]], input_id: str | None = None) -> None:
        """Append app records outside a tool; resending an ``input_id`` appends once (SPEC 4.3)."""
        await self._call(calls.append_records(self._core, records, input_id))

    async def cancel(self, input_id: str) -> TurnResult:
        """Cancel an input: its turn stops at the next boundary and settles ``aborted``
        (a queued input never runs). Returns how the input ended (``aborted``, or its
        outcome if it had already settled; ``rejected`` / ``unknown_input`` if there is
        no such input)."""
        return await self._call(calls.cancel(self._core, input_id))

    async def records(self, type: str | None = None) -> list[dict[str, Any]]:  # noqa: A002 - SPEC name
        """App records in log order (only those of ``type`` if given).

        Raises:
            StepValueError: ``type`` is neither a string nor None (a TypeError).
        """
        return await self._call(calls.records(self._core, type))

    def events(
        self, after: int | None = None, *, live: bool = False
    ) -> AsyncIterator[LogEntry] | AsyncIterator[LogEntry | LiveEvent]:
        """Committed records of the session, from position ``after`` on, live until closed.

        With ``live=True`` the text deltas of model answers this host streams come too,
        as ``LiveEvent`` objects between the records, as they arrive (never in the log;
        best effort: see ``harness.live``).

        Raises:
            DefinitionError: ``after`` is neither a position (an int) nor None.
        """
        if self._closed:
            raise SessionClosed(self.session_id)
        if after is not None and (isinstance(after, bool) or not isinstance(after, int)):
            raise DefinitionError(
                f"events(after=) takes a position (the seq of the last entry seen) or None, not {after!r}"
            )
        if live:
            return merge_live(self._committed_events(after), self._core.live, after=after)
        return self._committed_events(after)

    async def _committed_events(self, after: int | None) -> AsyncIterator[LogEntry]:
        async for entry in calls.events(self._core, after):
            if self._closed:
                return
            yield entry

    @property
    def usage(self) -> UsageTotals:
        """What the session's completed model calls used, from the log (tokens, cost when known)."""
        return dataclasses.replace(self._core.state.usage)

    async def close(self) -> None:
        """Close this handle; the last handle of a session gives its ownership up at once."""
        if self._closed:
            return
        self._closed = True
        for call in list(self._calls):
            call.cancel()
        if self._on_close is not None:
            await self._on_close(self)
        else:
            await self._core.close()
