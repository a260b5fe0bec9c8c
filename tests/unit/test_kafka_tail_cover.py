"""How far a shared tail has read a partition (harness.log.kafka.fanout._Tail, no broker):
past its last record to the partition's end, and never on an end event it cannot trust."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from harness.log.kafka.fanout import _Tail


class Msg:
    def __init__(self, offset: int, key: bytes) -> None:
        self._offset, self._key = offset, key

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key


def tail(start: int, end: int) -> tuple[_Tail, list[int]]:
    told: list[int] = []
    fanout: Any = SimpleNamespace(covered=lambda t: told.append(t.covered), stats=SimpleNamespace(add=lambda **kw: None),
                                  decode=None, peek=None, settings=SimpleNamespace(sessions_topic="t"))
    loop = asyncio.new_event_loop()
    t = _Tail(fanout, SimpleNamespace(loop=loop), 0)  # type: ignore[arg-type]
    t.position = t.ring_start = t.covered = start
    t._end_at_start = end
    t.live = True
    loop.close()
    return t, told


def test_a_tail_covers_its_records_then_the_end_past_their_commit_marker() -> None:
    t, told = tail(10, 10)
    t.dispatch([Msg(10, b"a"), Msg(11, b"b")])
    assert (t.position, t.covered) == (12, 12)
    t.reached(13)  # offset 12 is the transaction's commit marker
    assert (t.position, t.covered) == (12, 13)
    t.reached(13)  # told once
    assert told == [12, 13]


def test_a_tail_started_behind_the_end_believes_no_end_event_below_that_end() -> None:
    t, told = tail(5, 20)  # started at its first subscriber's position, 15 behind the end
    t.reached(12)  # an earlier assignment's (records 5..19 have not come yet): not believed
    assert t.covered == 5 and told == []
    t.dispatch([Msg(5, b"a"), Msg(18, b"b")])
    assert t.covered == 19
    t.reached(20)  # offset 19 is the commit marker: the end the tail started at
    assert t.covered == 20 and told == [19, 20]
