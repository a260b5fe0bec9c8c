"""BlockingReads: reads on threads are counted until their thread is done with them, so a
stopping service can tell that only reads (which change nothing) are left."""

from __future__ import annotations

import asyncio
import threading

from harness.log.kafka.blocking import BlockingReads


async def _until(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


async def test_a_read_counts_from_its_submission_to_its_threads_end_whoever_waits() -> None:
    reads = BlockingReads(max_workers=1)  # a second read queues
    release = threading.Event()
    started = threading.Event()

    def blocked() -> str:
        started.set()
        release.wait(30)
        return "read"

    try:
        assert await reads.run(lambda x: x * 2, 21) == 42
        assert reads.running == 0

        running = asyncio.create_task(reads.run(blocked))
        queued = asyncio.create_task(reads.run(lambda: "never"))
        await _until(started.is_set, "the first read runs")
        await _until(lambda: reads.running == 2, "both reads counted")

        queued.cancel()  # never started: uncounted at once, and never runs
        await _until(lambda: reads.running == 1, "the queued read uncounted")
        running.cancel()  # its caller is gone, its thread still reads: still counted
        await asyncio.wait([running])
        assert running.cancelled() and not release.is_set()
        assert reads.running == 1
        release.set()
        await _until(lambda: reads.running == 0, "the read's thread is done")
        assert queued.cancelled() and running.cancelled()
        assert await reads.run(lambda: "after") == "after"
    finally:
        release.set()
        reads.close()


async def test_closed_reads_leave_the_running_ones_and_drop_the_queued_ones() -> None:
    """A closed log's reads: the one still waiting for a broker is not waited for, one queued
    behind it never starts (it is uncounted), and the loop's own executor stays free."""
    reads = BlockingReads(max_workers=1)
    release = threading.Event()
    started = threading.Event()
    ran: list[str] = []

    def blocked() -> None:
        started.set()
        release.wait(30)

    try:
        running = asyncio.create_task(reads.run(blocked))
        queued = asyncio.create_task(reads.run(lambda: ran.append("queued")))
        await _until(started.is_set, "the first read runs")
        assert reads.running == 2
        reads.close()
        await _until(lambda: reads.running == 1, "the queued read dropped")
        assert await asyncio.to_thread(lambda: "free") == "free"  # the default executor is not theirs
        release.set()
        await running
        assert reads.running == 0 and ran == [] and queued.done()
    finally:
        release.set()
