"""Blocking code in async code holds the event loop, and with it the poller that renews
leases: the loop watchdog keeps them (and says where the loop is stuck), so another
owner cannot take the session over and run the blocking step a second time.

These tests block a real event loop for real seconds (that is the condition under test);
nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness import HarnessHost, define_harness, durable_tool, tool_definition
from harness.errors import SessionBusy
from harness.log.sqlite import SqliteLog
from harness.observability import disable_metrics, enable_metrics
from harness.runtime.watchdog import LoopWatchdog

from .conftest import Args, call, script

LEASE = timedelta(seconds=3)


def claim_from_another_process(path: Path) -> BaseException | None:
    """What another owner's claim of s-1 gets (on its own thread and loop, as another
    process would: this one's loop is blocked)."""
    out: dict[str, BaseException | None] = {}

    def run() -> None:
        async def claim() -> None:
            other = SqliteLog(path)
            try:
                writer = await other.claim("s-1", owner="intruder", lease=LEASE)
                await writer.release()
                out["got"] = None
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                out["got"] = exc
            finally:
                await other.close()

        asyncio.run(claim())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return out["got"]


async def test_a_step_blocking_the_loop_longer_than_the_lease_keeps_it_and_runs_once(tmp_path: Path, caplog):
    path = tmp_path / "h.db"
    runs: list[int] = []
    seen: dict[str, Any] = {}

    async def charge() -> dict[str, str]:
        runs.append(1)
        time.sleep(2.5 * LEASE.total_seconds())  # the mistake: a blocking call in async code
        seen["claim"] = claim_from_another_process(path)  # still blocked, the lease long past
        return {"id": "ch_1"}

    async def execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("charge", charge)

    tool = durable_tool(tool_definition(name="pay", description="d", input_schema=Args), execute)
    harness = define_harness(name="test/blocking", model=script([call("c1", "pay")], "paid"), tools=[tool])
    log = SqliteLog(path)
    host = HarnessHost(log=log, lease=LEASE, poll_interval=timedelta(milliseconds=20))
    sink = enable_metrics()
    try:
        session = await host.open(harness, session_id="s-1")
        with caplog.at_level(logging.WARNING, logger="harness.host"):
            result = await session.send("go")
        assert result.outcome == "completed" and runs == [1]
        stalls = sink.registry.get_sample_value("harness_event_loop_stall_seconds_count")
        longest = sink.registry.get_sample_value("harness_event_loop_stall_seconds_sum")
        assert stalls == 1 and longest is not None and longest >= 2 * LEASE.total_seconds(), (stalls, longest)
        assert isinstance(seen["claim"], SessionBusy), seen["claim"]  # without the watchdog: taken over
        [warning] = [r.getMessage() for r in caplog.records if "event loop has not run" in r.getMessage()]
        assert "test_loop_watchdog.py" in warning and "in charge (time.sleep(" in warning, warning
        assert "asyncio.to_thread" in warning and "leases are kept" in warning
    finally:
        disable_metrics()
        await host.close()
        await log.close()


@dataclass
class _Writer:
    events: list[str]

    def renew_blocking(self) -> None:
        self.events.append("renew")


@dataclass
class _Held:
    writer: _Writer
    session_id: str = "s-1"
    lease: timedelta = timedelta(seconds=0.3)
    next_renewal: float = 0.0
    clock: Any = field(default_factory=lambda: type("C", (), {"now": staticmethod(time.time)})())


async def test_a_loop_stalled_past_the_limit_lets_its_leases_lapse_and_says_so(caplog):
    """A loop stuck for good (a hung call) must not hold its sessions forever: after
    ``keep_leases_for`` the watchdog stops renewing (one ERROR) so other owners take over."""
    events: list[str] = []
    held = [_Held(_Writer(events))]

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                events.append("error")

    recorder = Recorder()
    logging.getLogger("harness.host").addHandler(recorder)
    dog = LoopWatchdog(lambda: held, warn_after=0.2, check_every=0.05, keep_leases_for=1.0)
    dog.start(asyncio.get_running_loop())
    try:
        time.sleep(2.5)  # the loop is stuck
        await asyncio.sleep(0.2)  # it runs again
    finally:
        dog.stop()
        logging.getLogger("harness.host").removeHandler(recorder)
    assert "renew" in events and events.count("error") == 1, events
    assert "renew" not in events[events.index("error"):]  # none after giving up


async def test_a_worker_watches_its_loop_from_the_start_and_says_where_blocking_code_stopped_it(caplog):
    """A worker on Kafka holds no lease and watches no session, so its poller never
    starts: the worker starts the watchdog itself (here on a memory log)."""
    from harness.log.memory import MemoryLog
    from harness.records import InputMessage
    from harness.runtime.worker import Worker

    async def execute(args: Args, ctx: Any) -> Any:
        time.sleep(4.0)  # blocking call in async code (well past the 1 s warning, however the thread is scheduled)
        return "done"

    tool = durable_tool(tool_definition(name="slow", description="d", input_schema=Args), execute)
    harness = define_harness(name="test/slow", model=script([call("c1", "slow")], "ok"), tools=[tool])
    log = MemoryLog()
    worker = Worker(log=log, harnesses=[harness], lease=LEASE)  # a stall of a third of it is worth a warning
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(worker.ready.wait(), 30)
        assert worker.host._poller.watchdog.running  # before any session
        with caplog.at_level(logging.WARNING, logger="harness.host"):
            await log.submit(InputMessage("s-1", 0, "in-1", "go", "test/slow"))
            for _ in range(600):
                if any(e.type == "harness.input.settled" for e in await log.read("s-1")):
                    break
                await asyncio.sleep(0.05)
        [warning] = [r.getMessage() for r in caplog.records if "event loop has not run" in r.getMessage()]
        # the blocking line as written, without its comment
        assert "in execute (time.sleep(4.0)):" in warning and "leases are kept" not in warning, warning
    finally:
        stop.set()
        await task
    assert not worker.host._poller.watchdog.running


def test_the_blocking_line_is_quoted_without_its_comment() -> None:
    from harness.runtime.watchdog import _without_comment

    assert _without_comment("time.sleep(4.0)  # slow on purpose") == "time.sleep(4.0)"
    assert _without_comment('print("a # b")  # c') == 'print("a # b")'
    assert _without_comment('requests.get(url + "#frag")') == 'requests.get(url + "#frag")'
    assert _without_comment("x = (1,  # part of a bracket") == "x = (1,"
    assert _without_comment('s = """unterminated # x') == 's = """unterminated # x'


async def test_a_stall_is_counted_while_it_lasts_not_only_once_it_ends() -> None:
    """A loop hung for good never runs again (the liveness probe restarts the pod first), so
    HarnessEventLoopStalled must see the stall while it lasts: ``harness_event_loop_stalls_total``
    counts it when the WARNING is logged; the histogram takes its length when it ends."""
    sink = enable_metrics()
    dog = LoopWatchdog(list, warn_after=0.2, check_every=0.05)
    dog.start(asyncio.get_running_loop())
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not sink.registry.get_sample_value("harness_event_loop_stalls_total"):
            time.sleep(0.05)  # the loop is stuck
        assert sink.registry.get_sample_value("harness_event_loop_stalls_total") == 1, "counted while stalled"
        assert sink.registry.get_sample_value("harness_event_loop_stall_seconds_count") == 0
        await asyncio.sleep(0.3)  # it runs again
        assert sink.registry.get_sample_value("harness_event_loop_stall_seconds_count") == 1
        assert sink.registry.get_sample_value("harness_event_loop_stalls_total") == 1, "one stall, counted once"
    finally:
        dog.stop()
        disable_metrics()


@contextlib.contextmanager
def lease_watched(path: Path, lapsed: list[float]) -> Iterator[None]:
    """While the block runs, a thread reads the owners table of ``path`` every 10 ms and
    notes in ``lapsed`` by how much session ``s-1``'s lease had run out, when it had."""
    stop = threading.Event()

    def watch() -> None:
        db = sqlite3.connect(path, timeout=5)
        try:
            while not stop.wait(0.01):
                row = db.execute("SELECT lease_until FROM owners WHERE session_id = 's-1'").fetchone()
                if row is not None and row[0] is not None and time.time() > row[0]:
                    lapsed.append(time.time() - row[0])
        finally:
            db.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


async def charge_once(path: Path, charge: Any, **host_options: Any) -> None:
    """One turn whose tool runs the step ``charge`` on a SQLite log at ``path``."""
    async def execute(args: Args, ctx: Any) -> Any:
        return await ctx.step.do("charge", charge)

    tool = durable_tool(tool_definition(name="pay", description="d", input_schema=Args), execute)
    harness = define_harness(name="test/lease", model=script([call("c1", "pay")], "paid"), tools=[tool])
    log = SqliteLog(path)
    host = HarnessHost(log=log, **host_options)
    try:
        session = await host.open(harness, session_id="s-1")
        assert (await session.send("go")).outcome == "completed"
    finally:
        await host.close()
        await log.close()


async def test_a_short_lease_is_kept_through_blocking_code_too(tmp_path: Path):
    """The watchdog looked every 0.5 s whatever the lease, so with a lease of 0.6 s (crash
    drills and tests use such leases) it noticed the stall only after the lease had run
    out: another owner could take the session and run the blocking step again. It looks
    often enough for the lease now: a thread reading the owners table throughout the block
    never sees the lease lapse."""
    path, lapsed = tmp_path / "h.db", []

    async def charge() -> dict[str, str]:
        with lease_watched(path, lapsed):
            time.sleep(2.0)  # the mistake: a blocking call in async code
        return {"id": "ch_1"}

    await charge_once(path, charge, lease=timedelta(seconds=0.6), poll_interval=timedelta(milliseconds=20))
    assert lapsed == [], f"the lease lapsed for up to {max(lapsed):.2f} s while the loop was blocked"


async def test_a_lease_shorter_than_the_poll_interval_is_renewed_in_time(tmp_path: Path):
    """The poller renewed leases once per ``poll_interval`` whatever the lease: with
    ``HarnessHost(lease=0.6, poll_interval=1)`` (or a lease under the default 0.2 s) the
    lease lapsed between two passes while a sync step ran on its thread, the loop free
    (only the /proc holder check, Linux only, kept another process from running the step
    again). The poller looks at least every quarter of the lease now."""
    path, lapsed = tmp_path / "h.db", []

    def charge() -> dict[str, str]:  # a plain def: it runs on the pool, the loop stays free
        with lease_watched(path, lapsed):
            time.sleep(2.5)
        return {"id": "ch_1"}

    await charge_once(path, charge, lease=timedelta(seconds=0.6), poll_interval=timedelta(seconds=1))
    assert lapsed == [], f"the lease lapsed for up to {max(lapsed):.2f} s while a sync step ran"
