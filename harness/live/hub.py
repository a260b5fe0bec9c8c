"""In-process fan-out of live events, and merging them with committed records."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
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


async def merge_live(committed: AsyncIterator[T], hub: LiveHub) -> AsyncIterator[T | LiveEvent]:
    """Committed items from ``committed`` interleaved with ``hub``'s live events as they come.

    Subscribed before the first item is read, so no event published after the call
    starts is missed (unless the consumer falls ``QUEUE_SIZE`` behind). Ends when
    ``committed`` ends; its error is raised here.
    """
    queue: asyncio.Queue[object] = asyncio.Queue(QUEUE_SIZE)

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

    with hub.subscribe(queue):
        task = asyncio.create_task(pump())
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return
                yield item  # type: ignore[misc]
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            aclose = getattr(committed, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(BaseException):
                    await aclose()
