"""The answer being streamed, so far (``harness.live.sofar``): a reader who subscribes
half-way through an answer (a page reloaded, a stream reconnected) gets its start as one
delta, then the deltas that follow; never an answer its records are already past."""

from __future__ import annotations

import asyncio

from harness.live import LiveEvent, LiveHub, LiveRouter, merge_live
from harness.live.sofar import KEEP_S, AnswersSoFar


def delta(text: str, position: int, *, sid: str = "s", turn: int = 1, index: int = 0, retry: int = 0,
          after: int | None = 3) -> LiveEvent:
    return LiveEvent(session_id=sid, turn=turn, index=index, retry=retry, position=position, text=text,
                     ts=1000 + position, after=after)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_text_so_far_is_one_delta_from_where_it_starts() -> None:
    kept = AnswersSoFar(now=Clock())
    for piece, at in (("Hel", 0), ("lo, ", 3), ("lo, wo", 3), ("wor", 7), ("ld", 10)):  # a repeat, an overlap
        kept.add(delta(piece, at))
    got = kept.so_far("s")
    assert got is not None
    assert (got.text, got.position, got.turn, got.index, got.retry, got.after, got.ts) == (
        "Hello, world", 0, 1, 0, 0, 3, 1010)
    assert kept.so_far("other") is None


def test_a_new_call_a_new_try_or_a_gap_starts_the_answer_over() -> None:
    kept = AnswersSoFar(now=Clock())
    kept.add(delta("first answer", 0))
    kept.add(delta("second", 0, index=1, after=5))
    got = kept.so_far("s")
    assert got is not None and (got.text, got.index, got.after) == ("second", 1, 5)
    kept.add(delta("again", 0, index=1, retry=1, after=5))  # a retry starts the text over
    got = kept.so_far("s")
    assert got is not None and (got.text, got.retry) == ("again", 1)
    kept.add(delta("later", 40, index=1, retry=1, after=5))  # a gap: what came before is not the answer's start
    got = kept.so_far("s")
    assert got is not None and (got.text, got.position) == ("later", 40)


def test_a_reader_past_the_answer_gets_nothing() -> None:
    """A reader whose records start past the position the deltas follow may already have
    the answer's response: the answer so far is not given (it could only repeat it, cut)."""
    kept = AnswersSoFar(now=Clock())
    kept.add(delta("partial", 0, after=7))
    assert kept.so_far("s", after=7) is not None
    assert kept.so_far("s", after=2) is not None
    assert kept.so_far("s", after=None) is not None
    assert kept.so_far("s", after=8) is None


def test_answers_are_kept_a_while_and_bounded() -> None:
    clock = Clock()
    kept = AnswersSoFar(now=clock, max_chars=10, max_sessions=2)
    kept.add(delta("quiet", 0))
    clock.t += KEEP_S + 0.1
    assert kept.so_far("s") is None and len(kept) == 0  # quiet that long: over
    kept.add(delta("0123456789", 0))
    kept.add(delta("X", 10))  # over max_chars: not kept (its late reader sees a gap)
    assert kept.so_far("s") is None
    for sid in ("a", "b", "c"):
        kept.add(delta("t", 0, sid=sid))
    assert [kept.so_far(sid) is not None for sid in ("a", "b", "c")] == [False, True, True]
    kept.add(LiveEvent("c", 1, 0, 0, 1, "x", 0, type="something.else"))  # only text deltas
    got = kept.so_far("c")
    assert got is not None and got.text == "t"


async def test_a_late_subscriber_of_the_router_gets_the_start_then_the_rest() -> None:
    clock = Clock()
    router = LiveRouter(now=clock)
    early = router.subscribe("s")
    router.publish(delta("Hello, ", 0))
    late = router.subscribe("s", so_far=True, after=3)
    plain = router.subscribe("s")  # (not asked for: from now on only)
    router.publish(delta("world", 7))
    assert [(e.position, e.text) for e in [await anext(late), await anext(late)]] == [(0, "Hello, "), (7, "world")]
    assert [(e.position, e.text) for e in [await anext(early), await anext(early)]] == [(0, "Hello, "), (7, "world")]
    assert (await anext(plain)).text == "world"
    past = router.subscribe("s", so_far=True, after=9)
    router.publish(delta("!", 12))
    assert (await anext(past)).text == "!"
    await router.close()


def test_a_session_stays_wanted_a_while_after_its_last_reader_left() -> None:
    """The Kafka live tails decode only the sessions somebody follows: a page reloaded
    comes back within seconds, so its session stays wanted (and its answer kept) meanwhile."""
    clock = Clock()
    router = LiveRouter(now=clock)
    sub = router.subscribe("s")
    sub.close()
    assert router.wants("s") and not router.wants("other")
    clock.t += KEEP_S - 1
    assert router.wants("s")
    clock.t += 2
    assert not router.wants("s")
    router.subscribe("s").close()
    assert router.wants("s")


async def test_session_events_live_given_half_way_through_an_answer_start_with_its_start() -> None:
    hub = LiveHub()
    hub.publish(delta("The answer ", 0, after=1))

    async def records():
        yield type("E", (), {"seq": 1})()
        await asyncio.Event().wait()

    merged = merge_live(records(), hub, after=0)
    first = await anext(merged)
    assert getattr(first, "seq", None) == 1
    hub.publish(delta("so far", 11, after=1))
    got = await anext(merged)  # the start first (before the delta published after the reader came)
    assert isinstance(got, LiveEvent) and (got.position, got.text) == (0, "The answer ")
    got = await anext(merged)
    assert isinstance(got, LiveEvent) and (got.position, got.text) == (11, "so far")
    await merged.aclose()


def test_a_start_read_back_later_joins_what_came_after_it() -> None:
    """A Kafka gateway that was not following a session reads its answer's start back
    while its tail already gave it what followed: the two join (a gap does not)."""
    kept = AnswersSoFar(now=Clock())
    kept.add(delta("world", 7))
    kept.add(delta("Hel", 0))  # ends before the kept text starts: a gap, not joined
    got = kept.so_far("s")
    assert got is not None and (got.position, got.text) == (7, "world")
    for piece, at in (("Hello, ", 0), ("lo, wor", 3)):  # read back: the whole start, then an overlap
        kept.add(delta(piece, at))
    got = kept.so_far("s")
    assert got is not None and (got.position, got.text) == (0, "Hello, world")


def test_a_session_is_answering_while_a_model_call_may_run_not_while_a_tool_waits() -> None:
    """The gateway reads an answer's start back only for a session that may be streaming
    one: a turn whose model has not answered yet, or whose tool calls all finished (the
    next model call). A session whose tool waits on an ask (for days) is not: its streams
    would each pay a read of the live topic for nothing."""
    from harness.records import (
        InputMessage,
        ModelResponseRecord,
        ToolResult,
        ToolStarted,
        TurnFinished,
        TurnStarted,
    )
    from harness.replay import SessionState
    from harness.services.gateway.sse import answering

    state = SessionState("s")
    records = [
        (InputMessage("s", 1, "m1", "hi"), False),
        (TurnStarted("s", 2, "m1", 1), True),  # the first model call
        (ModelResponseRecord("s", 3, 1, 0, None, ({"id": "c1", "name": "review", "arguments": {}},)), False),
        (ToolStarted("s", 4, "c1", "review", 1), False),  # the tool runs (or waits on an ask)
        (ToolResult("s", 5, "c1", "review", {"ok": True}), True),  # the next model call
        (TurnFinished("s", 6, "m1", 1, "completed", "done"), False),
    ]
    for seq, (record, expected) in enumerate(records):
        state.apply(seq, record)
        assert answering(state) is expected, (seq, record)
