"""The gateway's session cache (services/gateway/sessions.py): a session is read whole once,
then caught up from the position it knows; what it holds is always what a fresh read and fold
of the log give; least recently used sessions go first when it is full."""

from __future__ import annotations

from typing import Any

from harness.log import open_log
from harness.records import InputMessage, LogEntry
from harness.replay.state import fold
from harness.runtime.catalog import read_session
from harness.services.gateway.sessions import Sessions


class CountingReader:
    def __init__(self, log: Any) -> None:
        self.log = log
        self.calls: list[tuple[str, int | None]] = []

    async def __call__(self, session_id: str, *, after: int | None = None) -> list[LogEntry]:
        self.calls.append((session_id, after))
        return await read_session(self.log, session_id, after=after)


async def test_read_once_then_caught_up_and_equal_to_a_fresh_fold() -> None:
    log = open_log("memory:")
    reader = CountingReader(log)
    sessions = Sessions(reader)
    empty = await sessions.get("s")
    assert empty.entries == [] and sessions.kept == (0, 0)  # no such session: nothing kept
    for i in range(3):
        await log.submit(InputMessage("s", i, f"m{i}", "hi", "h"))
        await log.submit(InputMessage("other", i, f"o{i}", "hi", "h"))
    view = await sessions.get("s")
    assert [e.seq for e in view.entries] == [1, 3, 5]
    for i in range(3, 5):
        await log.submit(InputMessage("s", i, f"m{i}", "hi", "h"))
    again = await sessions.get("s")
    assert again is view and [e.seq for e in view.entries] == [1, 3, 5, 7, 8]
    assert reader.calls[-1] == ("s", 5)  # only what came after the position it knew
    assert sessions.full_reads == 2  # the empty probe, then the first real read
    fresh = fold("s", await log.read("s"))
    assert view.state.inputs.keys() == fresh.inputs.keys() and view.state.last_seq == fresh.last_seq == 8
    assert view.state.read_upto == 8
    await log.close()


async def test_least_recently_used_sessions_are_evicted_first() -> None:
    log = open_log("memory:")
    sessions = Sessions(CountingReader(log), max_entries=4)
    for sid in ("a", "b", "c"):
        for i in range(2):
            await log.submit(InputMessage(sid, i, f"{sid}{i}", "hi", "h"))
    await sessions.get("a")
    await sessions.get("b")
    assert sessions.kept == (2, 4)
    await sessions.get("a")  # a is used again: b is now the oldest
    await sessions.get("c")
    assert sessions.kept == (2, 4)
    reads = sessions.full_reads
    await sessions.get("a")
    assert sessions.full_reads == reads  # still kept
    await sessions.get("b")
    assert sessions.full_reads == reads + 1  # b was evicted: read whole again
    await log.close()
