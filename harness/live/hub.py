"""In-process fan-out of live events, and merging them with committed records."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Protocol, TypeVar, runtime_checkable

from harness.live.events import LiveEvent

__all__ = ["LiveHub", "LivePublisher", "merge_live"]

QUEUE_SIZE = 1024
"""Items a subscriber may be behind before its live events are dropped (committed
records are never dropped: their producer waits instead)."""

T = TypeVar("T")


@runtime_checkable
class LivePublisher(Protocol):
    """Sends live events to other processes (the Kafka live topic). Must not block."""

    def publish(self, event: LiveEvent) -> None: ...


class LiveHub:
    """Hands each published event to every current subscriber's queue (never blocks)."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[object]] = set()
        self.dropped = 0

    def publish(self, event: LiveEvent) -> None:
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


class _End:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


async def merge_live(
    committed: AsyncIterator[T], live: LiveHub | AsyncIterator[LiveEvent]
) -> AsyncIterator[T | LiveEvent]:
    """Committed items from ``committed`` interleaved with live events as they come.

    ``live`` is an in-process hub (subscribed before the first item is read, so no
    event published after that is missed unless the consumer falls ``QUEUE_SIZE``
    behind) or another process' events (e.g. the Kafka live topic). Ends when
    ``committed`` ends; its error (or the live source's) is raised here.
    """
    queue: asyncio.Queue[object] = asyncio.Queue(QUEUE_SIZE)
    if isinstance(live, LiveHub):
        with live.subscribe(queue):
            async with contextlib.aclosing(_merged(committed, queue, None)) as merged:
                async for item in merged:
                    yield item
    else:
        async with contextlib.aclosing(_merged(committed, queue, live)) as merged:
            async for item in merged:
                yield item


async def _merged(
    committed: AsyncIterator[T], queue: asyncio.Queue[object], live: AsyncIterator[LiveEvent] | None
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
            yield item  # type: ignore[misc]
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
