"""``harness.live.LiveRouter``: live events routed by session to the subscriptions made in this
process (the gateway's streams in ``harness serve``); registered when made, ended by close,
best effort for a reader that falls behind."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

from harness.live import LiveEvent, LivePublisher, LiveRouter, LiveSource
from harness.live.hub import QUEUE_SIZE


def delta(session_id: str, n: int) -> LiveEvent:
    return LiveEvent(session_id=session_id, turn=1, index=0, retry=0, position=n, text=f"d{n}", ts=n)


async def test_events_reach_the_subscriptions_of_their_session_only() -> None:
    router = LiveRouter()
    assert isinstance(router, LivePublisher) and isinstance(router, LiveSource)
    router.publish(delta("a", 0))  # nobody subscribed yet: not kept
    a1, a2, b = router.subscribe("a"), router.subscribe("a"), router.subscribe("b")
    assert router.subscribers == 3 and router.wants("a") and not router.wants("c")
    router.publish_many([delta("a", 1), delta("b", 1), delta("a", 2)])
    assert [e.text for e in [await anext(a1), await anext(a1)]] == ["d1", "d2"]
    assert [e.text for e in [await anext(a2), await anext(a2)]] == ["d1", "d2"]
    assert (await anext(b)).text == "d1"
    closed: list[str] = []
    c = LiveRouter().subscribe("x", on_close=lambda: closed.append("x"))
    c.close()
    c.close()
    assert closed == ["x"]
    a1.close()
    assert router.subscribers == 2
    waiting = asyncio.create_task(anext(a2))
    await asyncio.sleep(0)
    await router.close()  # ends every subscription: a waiting reader stops
    [ended] = await asyncio.gather(waiting, return_exceptions=True)
    assert isinstance(ended, StopAsyncIteration)
    assert router.subscribers == 0 and not router.wants("a")


async def test_a_reader_far_behind_misses_the_newest_deltas_never_blocks_the_publisher() -> None:
    router = LiveRouter()
    sub = router.subscribe("a")
    for n in range(QUEUE_SIZE + 5):
        router.publish(delta("a", n))
    assert sub.dropped == 5
    got = [(await anext(sub)).position for _ in range(QUEUE_SIZE)]
    assert got == list(range(QUEUE_SIZE))
    sub.close()
    assert [e async for e in sub] == []


async def test_merge_live_gives_a_live_event_after_the_record_it_follows():
    """Records are read back later than live events are pushed: an event stamped with the
    position it follows waits for that record (an unstamped one comes as it comes), and a
    reader that starts past the position gets it at once."""
    from harness.live import LiveHub, LiveOrder, merge_live

    hub = LiveHub()
    gate = asyncio.Event()

    async def committed():
        yield SimpleNamespace(seq=4, type="harness.input.message")
        await gate.wait()
        yield SimpleNamespace(seq=5, type="harness.turn.started")

    got: list[str] = []
    async for item in merge_live(committed(), hub):
        got.append(item.text if isinstance(item, LiveEvent) else item.type)
        if got == ["harness.input.message"]:
            hub.publish(dataclasses.replace(delta("s-1", 0), after=5))
            await asyncio.sleep(0)
            gate.set()
    assert got == ["harness.input.message", "harness.turn.started", "d0"]

    order = LiveOrder(after=7)
    assert order.live(dataclasses.replace(delta("s-1", 1), after=5)) == [dataclasses.replace(delta("s-1", 1), after=5)]
    assert LiveOrder().live(delta("s-1", 2)) == [delta("s-1", 2)]  # no stamp (an older publisher): as it comes
