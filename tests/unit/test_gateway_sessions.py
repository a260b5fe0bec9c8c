"""The gateway's session cache (services/gateway/sessions.py): a session is read whole once,
then caught up from the position it knows; what it holds is always what a fresh read and fold
of the log give; least recently used sessions go first when it is full."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from harness.log import open_log
from harness.log.follow import subscribe
from harness.records import InputMessage, LogEntry
from harness.replay.state import fold
from harness.runtime.catalog import read_session
from harness.services.gateway.sessions import Sessions, entry_bytes
from harness.services.gateway.settings import DEFAULT_SESSION_CACHE_MB, parse_settings


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


async def test_sessions_with_big_records_are_evicted_by_their_size_not_only_their_count() -> None:
    """200,000 records of model answers of a few KB are a GB: the kept records' size is
    bounded too (``--session-cache-mb``), least recently used first."""
    log = open_log("memory:")
    sessions = Sessions(CountingReader(log), max_entries=1000, max_bytes=25_000)
    for sid in ("a", "b", "c"):
        await log.submit(InputMessage(sid, 0, f"{sid}0", "x" * 10_000, "h"))  # one big message each
    small = entry_bytes((await log.read("a"))[0])
    assert 10_000 < small < 10_400  # the text, and a little for the rest
    await sessions.get("a")
    await sessions.get("b")
    assert sessions.kept == (2, 2) and sessions.kept_bytes == 2 * small
    await sessions.get("c")  # over 25,000 bytes with three: a goes, by size (3 records are far under 1000)
    assert sessions.kept == (2, 2) and sessions.kept_bytes == 2 * small
    reads = sessions.full_reads
    await sessions.get("c")
    await sessions.get("b")
    assert sessions.full_reads == reads
    await sessions.get("a")
    assert sessions.full_reads == reads + 1  # a was evicted: read whole again
    await log.submit(InputMessage("a", 1, "a1", "more", "h"))
    await sessions.get("a")  # caught up: its size counts the new record too
    assert sessions.kept_bytes == sum(v.size for v in (sessions.known("a"), sessions.known("b"), sessions.known("c")) if v)
    await log.close()


def test_a_kafka_entry_counts_its_encoded_value() -> None:
    from harness.log.kafka.reader import LazyEntry

    raw = b"\x00" * 1234
    entry = LazyEntry(7, "s", "harness.input.message", raw, decode=lambda b: None)  # (never decoded here)
    assert entry_bytes(entry) == 1234  # type: ignore[arg-type]


class CountingFollower:
    """``subscribe`` on a log, counting the calls (``after`` of each)."""

    def __init__(self, log: Any, *, silent: bool = False) -> None:
        self.log = log
        self.silent = silent
        self.calls: list[int | None] = []

    def __call__(self, session_id: str, *, after: int | None = None) -> Any:
        self.calls.append(after)
        if self.silent:
            return self._never()
        return subscribe(self.log, session_id, after=after)

    @staticmethod
    async def _never() -> Any:
        await asyncio.Event().wait()
        yield  # (an async generator that yields nothing)


async def test_get_through_takes_the_live_records_and_reads_nothing() -> None:
    """A POST's read-back of its own input: from the live subscription (on Kafka the shared
    tail), not a read of its own; the view is the same prefix a read and fold give."""
    log = open_log("memory:")
    reader, follower = CountingReader(log), CountingFollower(log)
    sessions = Sessions(reader, follow=follower)
    for i in range(3):
        await log.submit(InputMessage("s", i, f"m{i}", "hi", "h"))
        await log.submit(InputMessage("other", i, f"o{i}", "hi", "h"))
    view = await sessions.get_through("s", 5)
    assert [e.seq for e in view.entries] == [1, 3, 5] and sessions.kept == (1, 3)
    assert reader.calls == [] and follower.calls == [None]  # a session not kept: its whole history
    await log.submit(InputMessage("other", 9, "o9", "hi", "h"))
    written = await log.submit(InputMessage("s", 9, "m9", "hi", "h"))
    again = await sessions.get_through("s", written.seq)
    assert again is view and [e.seq for e in view.entries] == [1, 3, 5, 8]
    assert follower.calls == [None, 5] and reader.calls == []  # on from the position it knew
    assert await sessions.get_through("s", 3) is view and follower.calls == [None, 5]  # known already
    fresh = fold("s", await log.read("s"))
    assert view.state.inputs.keys() == fresh.inputs.keys() and view.state.last_seq == fresh.last_seq == 8
    await log.close()


async def test_get_through_reads_when_the_live_records_do_not_come_or_there_is_no_follower() -> None:
    log = open_log("memory:")
    written = await log.submit(InputMessage("s", 0, "m0", "hi", "h"))
    reader = CountingReader(log)
    sessions = Sessions(reader, follow=CountingFollower(log, silent=True), follow_timeout=0.05)
    view = await sessions.get_through("s", written.seq)
    assert [e.seq for e in view.entries] == [1] and reader.calls == [("s", None)]
    plain_reader = CountingReader(log)
    plain = await Sessions(plain_reader).get_through("s", written.seq)
    assert [e.seq for e in plain.entries] == [1] and plain_reader.calls == [("s", None)]
    await log.close()


async def test_changes_yield_the_kept_view_at_each_new_record_of_the_session() -> None:
    """What a POST with ?wait= follows: the view now, then the same kept view caught up on
    the live records (other requests see them too), from the position it knew."""
    log = open_log("memory:")
    await log.submit(InputMessage("s", 0, "m0", "hi", "h"))
    reader, watcher = CountingReader(log), CountingFollower(log)
    sessions = Sessions(reader, watch=watcher)
    async with contextlib.aclosing(sessions.changes("s")) as views:
        first = await anext(views)
        assert [e.seq for e in first.entries] == [1] and watcher.calls == []
        await log.submit(InputMessage("other", 1, "o1", "hi", "h"))
        await log.submit(InputMessage("s", 2, "m2", "hi", "h"))
        second = await asyncio.wait_for(anext(views), 5)
        assert second is first and [e.seq for e in second.entries] == [1, 3]
        assert watcher.calls == [1] and reader.calls == [("s", None)]  # on from position 1, no read
        assert sessions.known("s") is second and sessions.kept == (1, 2)
    async with contextlib.aclosing(sessions.changes("s")) as views:  # kept: no read, on from where it is
        kept = await anext(views)
        assert kept is second and reader.calls == [("s", None)]
    with pytest.raises(RuntimeError, match="watch="):
        await anext(Sessions(reader).changes("s"))
    await log.close()


def test_an_event_stream_from_a_known_position_reads_nothing_first() -> None:
    """``GET .../events?after=`` within what the gateway read already (a client streaming
    the answer to the message it just posted) starts on the shared subscription at once;
    so does a session this process does not know (it may have no record yet: it streams from
    its start); a cursor past what it knows is read first (clamping)."""
    from fastapi.testclient import TestClient

    from harness.log.memory import MemoryLog
    from harness.services.gateway.app import create_app
    from harness.services.gateway.settings import GatewaySettings

    app = create_app(GatewaySettings(log="memory:", open_access=True), log=MemoryLog())
    with TestClient(app, base_url="http://localhost") as http:  # (a loopback gateway answers loopback names only)
        gateway = app.state.gateway
        reads: list[int | None] = []
        read = gateway.sessions._read

        async def counting(session_id: str, *, after: int | None = None) -> list[LogEntry]:
            reads.append(after)
            return list(await read(session_id, after=after))

        gateway.sessions._read = counting
        posted = http.post("/v1/sessions/s/messages", json={"text": "hi", "harness": "h", "input_id": "m1"}).json()
        position = posted["position"]
        before = len(reads)
        with http.stream("GET", "/v1/sessions/s/events", params={"after": position - 1}) as events:
            for line in events.iter_lines():
                if line == f"id: {position}":
                    break
        assert len(reads) == before  # nothing read: the stream starts after the cursor at once
        for params, reading in (({}, 0), ({"after": 3}, 1)):
            with http.stream("GET", "/v1/sessions/nobody/events", params=params) as events:
                assert events.status_code == 200
                for line in events.iter_lines():
                    if line.startswith("data:"):  # the hello
                        assert '"after":0' in line
                        break
            # no cursor: nothing to read first; a cursor past what is known: read (and clamped)
            assert len(reads) == before + reading, params


def test_the_session_cache_size_comes_from_a_flag_or_the_environment() -> None:
    assert parse_settings(["--log", "memory:", "--open-access"], {}).session_cache_mb == DEFAULT_SESSION_CACHE_MB
    assert parse_settings(["--log", "memory:", "--open-access", "--session-cache-mb", "16"], {}).session_cache_mb == 16
    env = {"HARNESS_GATEWAY_SESSION_CACHE_MB": "200"}
    assert parse_settings(["--log", "memory:", "--open-access"], env).session_cache_mb == 200
    with pytest.raises(SystemExit):
        parse_settings(["--log", "memory:", "--open-access", "--session-cache-mb", "0"], {})
