"""A worker on a memory or SQLite log picks up a new input as its commit is signalled,
not at its next poll: with an hour-long poll interval it still settles inputs, and it
reads the log only after a change (harness.runtime.worker, harness.log.follow)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio

from harness import define_harness
from harness.client import HarnessClient
from harness.log.follow import watch_changes
from harness.log.memory import MemoryLog
from harness.log.sqlite import SqliteLog
from harness.models import ModelResponse, ScriptedModel
from harness.runtime import worker as worker_module
from harness.runtime.worker import Worker

HARNESS = define_harness(name="pickup", model=ScriptedModel(lambda messages: ModelResponse(text="hi")), tools=[])
AN_HOUR = timedelta(hours=1)


@pytest.fixture(autouse=True)
def no_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's periodic sweep once an hour too: only a change can wake it."""
    monkeypatch.setattr(worker_module, "SWEEP_EVERY_S", AN_HOUR.total_seconds())


@pytest_asyncio.fixture(params=["memory", "sqlite"])
async def worker_and_client(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Worker, HarnessClient]]:
    """A worker polling once an hour, and a client; on SQLite each with its own handle on
    the file (the client's commits are another connection's)."""
    if request.param == "memory":
        log = MemoryLog()
        worker_log, client_log = log, log
    else:
        worker_log, client_log = SqliteLog(tmp_path / "log.db"), SqliteLog(tmp_path / "log.db")
    worker = Worker(log=worker_log, harnesses=[HARNESS], poll_interval=AN_HOUR)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    async with asyncio.timeout(30):
        await worker.ready.wait()
    client = HarnessClient(log=client_log)
    try:
        yield worker, client
    finally:
        stop.set()
        await run
        await worker_log.close()
        await client_log.close()


async def test_inputs_are_picked_up_on_commit_not_on_a_poll_interval(worker_and_client):
    worker, client = worker_and_client
    scans = worker.stats.scans
    for i in range(5):
        receipt = await client.send(f"s{i}", "hello", harness="pickup", input_id="in-1")
        settled = await client.wait_settled(f"s{i}", receipt, timeout=30)
        assert settled.outcome == "completed"
    assert worker.stats.scans > scans


async def test_the_worker_reads_the_log_only_after_a_change():
    log = MemoryLog()
    worker = Worker(log=log, harnesses=[HARNESS], poll_interval=AN_HOUR)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    await worker.ready.wait()
    changes = watch_changes(log)
    assert changes is not None
    client = HarnessClient(log=log)
    for i in range(10):
        receipt = await client.send(f"s{i}", "hello", harness="pickup")
        await client.wait_settled(f"s{i}", receipt, timeout=30)
    stop.set()
    await run

    # One read to rebuild the empty log, then at most one per commit (commits that land
    # while a read runs share the next one): nothing is read on a timer.
    assert 1 < worker.stats.scans <= 1 + changes.version
