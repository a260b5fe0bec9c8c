"""``harness.live.LiveRouter``: live events routed by session to the subscriptions made in this
process (the gateway's streams in ``harness serve``); registered when made, ended by close,
best effort for a reader that falls behind."""

from __future__ import annotations

import asyncio

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
