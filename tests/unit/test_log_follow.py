"""Following memory and SQLite logs (harness.log.follow): one shared reader per log,
woken by changes (in-process signal / PRAGMA data_version), no gap, no duplicate."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio

from harness.log.base import LogEntry
from harness.log.follow import DataVersionWatch, shared_reader, subscribe, watch_changes
from harness.log.memory import MemoryLog
from harness.log.sqlite import SqliteLog
from harness.records import InputMessage, StepResult

LEASE = timedelta(seconds=30)


def step(session: str, n: int) -> StepResult:
    return StepResult(session_id=session, ts=n, tool_call_id="call", name=f"step-{n}", value={"n": n})


async def take(entries: AsyncIterator[LogEntry], n: int) -> list[LogEntry]:
    out: list[LogEntry] = []
    async with asyncio.timeout(30):
        async for entry in entries:
            out.append(entry)
            if len(out) == n:
                break
    return out


async def write(log: MemoryLog | SqliteLog, session: str, first: int, count: int) -> list[LogEntry]:
    writer = await log.claim(session, owner="w", lease=LEASE)
    out: list[LogEntry] = []
    for n in range(first, first + count):
        out += await writer.append([step(session, n)])
    await writer.release()
    return out


@pytest_asyncio.fixture(params=["memory", "sqlite"])
async def logs(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[object, object]]:
    """(the followed log, a log to write with): on SQLite two handles on one file, so the
    writes are another connection's commits."""
    if request.param == "memory":
        log = MemoryLog()
        yield log, log
        return
    path = tmp_path / "log.db"
    followed, writer = SqliteLog(path), SqliteLog(path)
    yield followed, writer
    await followed.close()
    await writer.close()


async def test_many_subscribers_share_one_reader(logs):
    followed, writer = logs
    sessions = [f"s{i}" for i in range(200)]
    subs = [subscribe(followed, sid, after=0) for sid in sessions]
    firsts = [asyncio.ensure_future(take(sub, 1)) for sub in subs]
    reader = shared_reader(followed)
    assert reader is not None
    await asyncio.sleep(0)
    for sid in sessions:
        await writer.submit(InputMessage(sid, 1, "in-1", "hi", None))

    got = await asyncio.gather(*firsts)

    assert [[e.session_id for e in g] for g in got] == [[sid] for sid in sessions]
    # One read per change at most (changes coalesce), never one per subscriber.
    assert reader.reads <= len(sessions) + 2
    for sub in subs:
        await sub.aclose()


async def test_a_late_subscriber_gets_what_it_missed_then_live_without_gap_or_duplicate(logs):
    followed, writer = logs
    early = subscribe(followed, "other", after=0)
    started = asyncio.ensure_future(take(early, 1))
    await asyncio.sleep(0)
    written = await write(writer, "s", 1, 10)
    await write(writer, "other", 1, 1)
    await started  # the shared reader is past every record of s

    late = subscribe(followed, "s", after=written[2].seq)
    more = asyncio.ensure_future(write(writer, "s", 11, 10))
    got = await take(late, 17)
    written += await more

    assert got == written[3:]
    await early.aclose()
    await late.aclose()


async def test_whole_history_then_live(logs):
    followed, writer = logs
    before = await write(writer, "s", 1, 3)
    sub = subscribe(followed, "s")
    got = asyncio.ensure_future(take(sub, 5))
    await asyncio.sleep(0)
    after = await write(writer, "s", 4, 2)
    assert await got == before + after
    await sub.aclose()


async def test_sqlite_data_version_sees_commits_of_another_connection(tmp_path: Path):
    path = tmp_path / "log.db"
    mine, other = SqliteLog(path), SqliteLog(path)
    await write(mine, "s", 1, 1)  # the file and its table exist
    watch = watch_changes(mine)
    assert isinstance(watch, DataVersionWatch)
    watch.acquire()
    try:
        while watch.checks == 0:  # the watching thread took its first look
            await asyncio.sleep(0.001)
        seen = watch.version
        await write(other, "s", 2, 1)
        async with asyncio.timeout(30):
            assert await watch.wait(seen) > seen
        seen = watch.version
        await write(mine, "s", 3, 1)  # this process's own log connection: a commit all the same
        async with asyncio.timeout(30):
            assert await watch.wait(seen) > seen
        assert await watch.end() == 3
    finally:
        watch.release()
        await mine.close()
        await other.close()


async def test_memory_log_signals_its_commits():
    log = MemoryLog()
    changes = watch_changes(log)
    assert changes is log.changes
    seen = changes.version
    await log.submit(InputMessage("s", 1, "in-1", "hi", None))
    assert await changes.wait(seen) == seen + 1
    assert await changes.end() == 1


async def test_a_stalled_subscriber_holds_a_bounded_queue_and_reads_the_rest_back(logs, monkeypatch):
    import harness.log.follow as follow

    monkeypatch.setattr(follow, "MAX_QUEUED", 5)
    followed, writer = logs
    sub = subscribe(followed, "s", after=0)
    first = await asyncio.gather(take(sub, 1), write(writer, "s", 1, 1))
    reader = shared_reader(followed)
    assert reader is not None

    written = first[1] + await write(writer, "s", 2, 40)  # nobody takes these for now
    await asyncio.sleep(0)
    [held] = reader._subs["s"]
    while reader.position < written[-1].seq:  # the shared reader saw all of them
        await asyncio.sleep(0.001)
    assert len(held.queue) <= 5  # memory stays bounded for a stalled reader

    got = await take(sub, 40)
    assert got == written[1:]  # read back from the log: no gap, no duplicate, in order
    await sub.aclose()


async def test_a_log_closed_under_its_subscribers_ends_them_quietly(logs, caplog):
    """A process stopping closes its log under the gateway's streams: they end with
    ``LogClosed`` and the log says nothing at warning level (a clean SIGTERM logged
    "following the log failed: ... is closed")."""
    from harness.errors import LogClosed

    followed, writer = logs
    sub = subscribe(followed, "s", after=0)
    first = asyncio.ensure_future(take(sub, 2))
    await asyncio.sleep(0)
    await write(writer, "s", 1, 1)
    with caplog.at_level("DEBUG", logger="harness"):
        await followed.close()
        with pytest.raises(LogClosed):
            await first
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
    assert "following the log failed" in caplog.text  # (at debug level)
