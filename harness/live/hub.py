"""In-process fan-out of live events, and merging them with committed records.

* :class:`LiveHub`: every event to every subscriber (one session's handle).
* :class:`LiveRouter`: events routed by session to :class:`LiveSubscription` s, for
  readers of many sessions in one process (the gateway of ``harness serve``; the
  Kafka live tails hand what they read to one).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from typing import Protocol, TypeVar, runtime_checkable

from harness.live.events import LiveEvent
from harness.live.sofar import KEEP_S, AnswersSoFar

__all__ = ["LiveHub", "LiveOrder", "LivePublisher", "LiveRouter", "LiveSource", "LiveSubscription", "merge_live"]

QUEUE_SIZE = 1024
"""Items a subscriber may be behind before its live events are dropped (committed
records are never dropped: their producer waits instead)."""

T = TypeVar("T")


@runtime_checkable
class LivePublisher(Protocol):
    """Sends live events to other processes (the Kafka live topic). Must not block."""

    def publish(self, event: LiveEvent) -> None: ...


class LiveHub:
    """Hands each published event to every current subscriber's queue (never blocks), and
    keeps the answer being streamed so far (``so_far``) for a subscriber that comes late."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[object]] = set()
        self._so_far = AnswersSoFar(max_sessions=1)
        self.dropped = 0

    def so_far(self, after: int | None = None) -> LiveEvent | None:
        """The answer being streamed so far (a hub serves one session), as one delta, or
        None (see ``AnswersSoFar.so_far``)."""
        return self._so_far.latest(after)

    def publish(self, event: LiveEvent) -> None:
        self._so_far.add(event)
        for queue in self._queues:
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                self.dropped += 1  # a slow subscriber misses deltas, never records

    @contextlib.contextmanager
    def subscribe(self, queue: asyncio.Queue[object]) -> Iterator[asyncio.Queue[object]]:
        self._queues.add(queue)
        try:
            yield queue
        finally:
            self._queues.discard(queue)

    @property
    def subscribers(self) -> int:
        return len(self._queues)


class LiveSubscription:
    """The live events of one session from the moment it was made: an async iterator.

    It is registered when made (not at the first ``__anext__``), so no event published
    after that is missed, unless its reader falls ``QUEUE_SIZE`` events behind: then
    the newest are dropped (best effort; the committed response holds the whole text).
    ``close()`` unregisters it and ends the iteration. Used on one event loop.
    """

    def __init__(self, session_id: str, on_close: Callable[[LiveSubscription], None]) -> None:
        self.session_id = session_id
        self._on_close = on_close
        self._queue: collections.deque[LiveEvent] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self.dropped = 0

    def push(self, event: LiveEvent) -> None:
        if self._closed:
            return
        if len(self._queue) >= QUEUE_SIZE:
            self.dropped += 1
        else:
            self._queue.append(event)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> LiveSubscription:
        return self

    async def __anext__(self) -> LiveEvent:
        while not self._queue:
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._queue.popleft()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._on_close(self)
            self._wake()

    async def aclose(self) -> None:
        self.close()


@runtime_checkable
class LiveSource(Protocol):
    """Where a reader gets the live events of a session (see :class:`LiveRouter`)."""

    def subscribe(
        self, session_id: str, *, so_far: bool = False, after: int | None = None, running: bool = False
    ) -> LiveSubscription: ...

    async def close(self) -> None: ...


class LiveRouter:
    """Live events routed to the subscriptions of their session, in one process.

    A :class:`LivePublisher` (give it to ``HarnessHost(live=)``, or set a worker's
    ``host.live``) and a :class:`LiveSource`: every subscription of a session made in
    this process gets the text deltas of the sessions published here. Never blocks;
    used on one event loop (a thread hands events over with ``call_soon_threadsafe``).
    """

    def __init__(self, *, now: Callable[[], float] = time.monotonic) -> None:
        self._subs: dict[str, set[LiveSubscription]] = {}
        self._now = now
        self._so_far = AnswersSoFar(now=now)
        # Sessions whose last subscriber left, until when they are still wanted: a page
        # reloaded comes back within seconds and finds the answer so far.
        self._left: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.published = 0

    def publish(self, event: LiveEvent) -> None:
        self.published += 1
        self._so_far.add(event)
        for sub in list(self._subs.get(event.session_id, ())):
            sub.push(event)

    def publish_many(self, events: Iterable[LiveEvent]) -> None:
        for event in events:
            self.publish(event)

    def subscribe(
        self,
        session_id: str,
        *,
        on_close: Callable[[], None] | None = None,
        so_far: bool = False,
        after: int | None = None,
        running: bool = False,
    ) -> LiveSubscription:
        """The live events of ``session_id`` published from now on (``on_close``: called once
        the subscription is closed). ``so_far``: first the answer being streamed, as far
        as it came (one delta), unless the reader starts past it (``after``: the log
        position the reader's records start after). ``running`` (the reader saw a turn
        running): here every answer published in the process was seen, so it adds nothing."""

        def forget(sub: LiveSubscription) -> None:
            self._forget(sub)
            if on_close is not None:
                on_close()

        sub = LiveSubscription(session_id, forget)
        if so_far and (event := self._so_far.so_far(session_id, after)) is not None:
            sub.push(event)
        self._subs.setdefault(session_id, set()).add(sub)
        self._left.pop(session_id, None)
        return sub

    def so_far(self, session_id: str, after: int | None = None) -> LiveEvent | None:
        """The session's answer being streamed, as far as this router saw it (one delta),
        or None (see ``AnswersSoFar.so_far``)."""
        return self._so_far.so_far(session_id, after)

    def remember(self, events: Iterable[LiveEvent]) -> None:
        """Take deltas read back (not new: nobody is given them) into the answers so far."""
        for event in events:
            self._so_far.add(event)

    def _forget(self, sub: LiveSubscription) -> None:
        subs = self._subs.get(sub.session_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.session_id]
                now = self._now()
                left = self._left
                while left and next(iter(left.values())) <= now:
                    left.popitem(last=False)
                left[sub.session_id] = now + KEEP_S
                left.move_to_end(sub.session_id)

    def wants(self, session_id: str) -> bool:
        """Somebody here follows ``session_id``, or did within ``KEEP_S`` (a reader that
        comes back finds the answer so far). Safe to ask from another thread."""
        if session_id in self._subs:
            return True
        until = self._left.get(session_id)
        return until is not None and until > self._now()

    @property
    def subscribers(self) -> int:
        return sum(len(subs) for subs in self._subs.values())

    async def close(self) -> None:
        for subs in list(self._subs.values()):
            for sub in list(subs):
                sub.close()
        self._left.clear()  # (closed: nobody comes back)


class LiveOrder:
    """Live events held back until the records that precede them were given out.

    Records and live events reach a reader by two paths (the log, read back; live events,
    pushed at once), so a delta can overtake the record committed just before it (its
    turn's ``harness.turn.started``). A publisher stamps each event with the log position
    it follows (``LiveEvent.after``); this gives the event out only once a record at or
    past that position was (or the reader began past it, ``after``). Pure: no I/O.
    """

    def __init__(self, after: int | None = None) -> None:
        self._seen = -1 if after is None else after
        self._held: collections.deque[LiveEvent] = collections.deque()

    def live(self, event: LiveEvent) -> list[LiveEvent]:
        """What to give out now that ``event`` came (it, or nothing: held)."""
        after = getattr(event, "after", None)
        if not self._held and (after is None or after <= self._seen):
            return [event]
        if len(self._held) < QUEUE_SIZE:  # (a reader that far behind misses deltas, never records)
            self._held.append(event)
        return []

    def record(self, seq: int | None) -> list[LiveEvent]:
        """What held events to give out after the record at ``seq`` (in their order)."""
        if seq is not None and seq > self._seen:
            self._seen = seq
        out: list[LiveEvent] = []
        while self._held and ((after := getattr(self._held[0], "after", None)) is None or after <= self._seen):
            out.append(self._held.popleft())
        return out


class _End:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


async def merge_live(
    committed: AsyncIterator[T], live: LiveHub | AsyncIterator[LiveEvent], *, after: int | None = None
) -> AsyncIterator[T | LiveEvent]:
    """Committed items from ``committed`` interleaved with live events as they come.

    ``live`` is an in-process hub (subscribed before the first item is read, so no
    event published after that is missed unless the consumer falls ``QUEUE_SIZE``
    behind) or another process' events (e.g. the Kafka live topic). A live event comes
    after the records it follows (:class:`LiveOrder`; ``after``: the position
    ``committed`` starts after). Ends when ``committed`` ends; its error (or the live
    source's) is raised here.
    """
    queue: asyncio.Queue[object] = asyncio.Queue(QUEUE_SIZE)
    order = LiveOrder(after)
    if isinstance(live, LiveHub):
        with live.subscribe(queue):
            if (so_far := live.so_far(after)) is not None:
                queue.put_nowait(so_far)
            async with contextlib.aclosing(_merged(committed, queue, None, order)) as merged:
                async for item in merged:
                    yield item
    else:
        async with contextlib.aclosing(_merged(committed, queue, live, order)) as merged:
            async for item in merged:
                yield item


async def _merged(
    committed: AsyncIterator[T], queue: asyncio.Queue[object], live: AsyncIterator[LiveEvent] | None,
    order: LiveOrder,
) -> AsyncGenerator[T | LiveEvent, None]:

    async def pump() -> None:
        try:
            async for item in committed:
                await queue.put(item)  # back-pressure: a committed record is never dropped
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put(_End(exc))
            return
        await queue.put(_End())

    async def pump_live(source: AsyncIterator[LiveEvent]) -> None:
        try:
            async for event in source:
                with contextlib.suppress(asyncio.QueueFull):  # a slow consumer misses deltas, never records
                    queue.put_nowait(event)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put(_End(exc))

    tasks = [asyncio.create_task(pump())]
    if live is not None:
        tasks.append(asyncio.create_task(pump_live(live)))
    try:
        while True:
            item = await queue.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            if isinstance(item, LiveEvent):
                for event in order.live(item):
                    yield event
                continue
            yield item  # type: ignore[misc]
            for event in order.record(getattr(item, "seq", None)):
                yield event
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for source in (committed, live):
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(BaseException):
                    await aclose()
