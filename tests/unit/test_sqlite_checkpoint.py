"""A SQLite worker restarts from the file's checkpoint plus the records after it
(``harness.log.sqlite_checkpoint``), to the same state as a read of the whole file.

Real SQLite files and real workers; the checkpoint is written by the worker's own sweep
(``CHECKPOINT_EVERY_RECORDS`` made small so a few records are enough).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.client import HarnessClient
from harness.clock import FakeClock
from harness.log.sqlite import SqliteLog
from harness.log.sqlite_checkpoint import NoCheckpoint
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import InputSettled, StepResult
from harness.runtime import worker as worker_module
from harness.runtime.host import HarnessHost
from harness.runtime.partition import PartitionRuntime
from harness.runtime.worker import Worker

from .conftest import eventually

LEASE = timedelta(seconds=30)


class NoArgs(BaseModel):
    pass


class Ok(BaseModel):
    ok: bool


async def ask(args: NoArgs, ctx: Any) -> dict[str, bool]:
    answer = await ctx.step.ask("approve", message="ok?", schema=Ok)
    return {"ok": answer.ok}


async def nap(args: NoArgs, ctx: Any) -> str:
    await ctx.step.sleep("nap", timedelta(hours=1))
    return "rested"


async def work(args: NoArgs, ctx: Any) -> int:
    return await ctx.step.do("one", lambda: 1)


def respond(messages: list[dict[str, Any]]) -> ModelResponse:
    """A message names the tool to call ('ask', 'nap', 'work'); after its result: 'done'."""
    last = messages[-1]
    if last.get("role") != "user" or not isinstance(last.get("content"), str):
        return ModelResponse(text="done")
    name = last["content"]
    return ModelResponse(tool_calls=[ToolCall(id="c1", name=name, arguments={})])


def tool(name: str, fn: Any) -> Any:
    return durable_tool(tool_definition(name=name, description=name, input_schema=NoArgs), fn)


HARNESS = define_harness(
    name="ck", model=ScriptedModel(respond), tools=[tool("ask", ask), tool("nap", nap), tool("work", work)]
)


@pytest.fixture
def often(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint after every record (the worker's cadence, made small)."""
    monkeypatch.setattr(worker_module, "CHECKPOINT_EVERY_RECORDS", 1)


async def settled(log: SqliteLog, sid: str, input_id: str) -> str | None:
    for entry in await log.read(sid):
        if isinstance(entry.record, InputSettled) and entry.record.input_id == input_id:
            return entry.record.outcome
    return None


async def run_worker(log: SqliteLog, clock: FakeClock, until: Any, caplog: Any) -> Worker:
    """A worker on ``log`` until ``until()`` holds; its INFO lines in ``caplog``."""
    worker = Worker(log=log, harnesses=[HARNESS], clock=clock, lease=LEASE, drain_timeout=0,
                    owner_id=f"w-{id(log)}-{clock.now()}")
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="harness.worker"):
        run = asyncio.create_task(worker.run(stop))
        try:
            await worker.ready.wait()
            await eventually(until, tries=20000)
        finally:
            stop.set()
            await run
    return worker


async def first_life(path: Path, clock: FakeClock, caplog: Any) -> None:
    """Sessions in every state, driven by a worker that writes checkpoints, then stopped:
    'done' ended, 'asking' waits for an answer, 'napping' sleeps, 'back' ended (it comes
    back after the checkpoint)."""
    log = SqliteLog(path, clock=clock.now)
    client = HarnessClient(log=log)
    for sid, text in (("done", "work"), ("asking", "ask"), ("napping", "nap"), ("back", "work")):
        await client.send(sid, text, harness="ck", input_id="in-1")

    async def all_there() -> bool:
        types = {sid: [e.type for e in await log.read(sid)] for sid in ("asking", "napping")}
        return (await settled(log, "done", "in-1") == "completed" and await settled(log, "back", "in-1") == "completed"
                and "harness.ask.opened" in types["asking"] and "harness.sleep.scheduled" in types["napping"])

    async def checkpointed() -> bool:  # the sweep forgot the ended ones, then wrote a checkpoint
        found = await log.read_checkpoint() if await all_there() else None
        return isinstance(found, tuple) and set(found[0].sessions) == {"asking", "napping"}

    await run_worker(log, clock, checkpointed, caplog)
    await log.close()
    clock.advance(LEASE.total_seconds() + 1)


async def rebuilt(log: SqliteLog, clock: FakeClock, *, from_checkpoint: bool) -> tuple[dict[str, Any], set[str]]:
    """What a restart folds before it drives anything: the live sessions' states, the ended ids."""
    host = HarnessHost(log=log, clock=clock, lease=LEASE)
    rt = PartitionRuntime(host=host, harnesses={"ck": HARNESS})
    if from_checkpoint:
        found = await log.read_checkpoint()
        assert not isinstance(found, NoCheckpoint), found
        checkpoint, corrupt = found
        assert corrupt == []
        rt.load_checkpoint(checkpoint)
        assert rt.position > 0
    rt.rebuild(await log.read_all(after=rt.position))
    live = await rt.forget_ended()
    await host.close()
    # (a session that ended once and is live again may stay named in _ended: live wins)
    return {sid: (state.turns, state.inputs, state.calls) for sid, state in live.items()}, set(rt._ended) - set(live)


async def test_a_restart_from_the_checkpoint_folds_what_a_full_read_folds_and_drives_it(
    tmp_path: Path, clock: FakeClock, caplog: Any, often: None
):
    path = tmp_path / "log.db"
    await first_life(path, clock, caplog)
    log = SqliteLog(path, clock=clock.now)
    found = await log.read_checkpoint()
    assert not isinstance(found, NoCheckpoint), found
    assert set(found[0].sessions) == {"asking", "napping"}  # the live ones, read from the file
    assert set(found[0].ended) == {"done", "back"}
    # The tail, after the checkpoint: an answer, a returning session, a new one.
    client = HarnessClient(log=log)
    await client.answer("asking", "c1", "approve", {"ok": True}, input_id="a-1")
    await client.send("back", "work", harness="ck", input_id="in-2")
    await client.send("fresh", "work", harness="ck", input_id="in-1")

    from_checkpoint = await rebuilt(log, clock, from_checkpoint=True)
    assert set(from_checkpoint[0]) == {"asking", "napping", "back", "fresh"} and from_checkpoint[1] == {"done"}
    assert from_checkpoint == await rebuilt(log, clock, from_checkpoint=False)

    async def driven() -> bool:
        return (await settled(log, "asking", "in-1") == "completed" and await settled(log, "back", "in-2") == "completed"
                and await settled(log, "fresh", "in-1") == "completed")

    caplog.clear()
    worker = await run_worker(log, clock, driven, caplog)
    assert any("after its checkpoint at position" in r.getMessage() for r in caplog.records)
    back = [e.record for e in await log.read("back") if e.type == "harness.turn.started"]
    assert [t.turn for t in back] == [1, 2]  # its history was read: its second turn is turn 2
    assert worker.stats.corrupt_records == 0
    napping = [e.type for e in await log.read("napping")]
    assert "harness.turn.finished" not in napping  # still asleep (the fake clock did not pass the hour)
    await log.close()


async def test_a_damaged_checkpoint_is_not_used_the_whole_file_is_read(
    tmp_path: Path, clock: FakeClock, caplog: Any, often: None
):
    path = tmp_path / "log.db"
    await first_life(path, clock, caplog)
    with sqlite3.connect(path) as raw:  # a changed byte in the live list ("asking" -> "askinh")
        (live,) = raw.execute("SELECT live FROM checkpoint").fetchone()
        assert b"asking" in live
        raw.execute("UPDATE checkpoint SET live = ?", (live.replace(b"asking", b"askinh"),))
    log = SqliteLog(path, clock=clock.now)
    found = await log.read_checkpoint()
    assert isinstance(found, NoCheckpoint) and found.damaged
    await HarnessClient(log=log).answer("asking", "c1", "approve", {"ok": True}, input_id="a-1")
    caplog.clear()
    await run_worker(log, clock, lambda: settled(log, "asking", "in-1"), caplog)
    assert await settled(log, "asking", "in-1") == "completed"
    warned = [r for r in caplog.records if "not starting from a checkpoint" in r.getMessage()]
    assert warned and warned[0].levelno == logging.WARNING and "checksum" in warned[0].getMessage()
    assert any("records from its start" in r.getMessage() for r in caplog.records)
    await log.close()


async def test_a_damaged_checkpoint_is_replaced_by_the_next_one_even_when_it_covers_more(
    tmp_path: Path, clock: FakeClock, caplog: Any, often: None
):
    """A changed byte in the row's ``covers`` (a far higher position): the row is never used,
    and the next checkpoint replaces it, so only one restart reads the whole file."""
    path = tmp_path / "log.db"
    await first_life(path, clock, caplog)
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE checkpoint SET covers = covers + ?", (1 << 40,))
    log = SqliteLog(path, clock=clock.now)
    caplog.clear()
    await run_worker(log, clock, lambda: True, caplog)  # reads it all, then writes a checkpoint
    assert any("not starting from a checkpoint" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
    found = await log.read_checkpoint()
    assert not isinstance(found, NoCheckpoint), found.why
    assert set(found[0].sessions) == {"asking", "napping"}
    # The restart after it starts from the new checkpoint, and the waiting session goes on.
    await HarnessClient(log=log).answer("asking", "c1", "approve", {"ok": True}, input_id="a-1")
    caplog.clear()
    await run_worker(log, clock, lambda: settled(log, "asking", "in-1"), caplog)
    assert await settled(log, "asking", "in-1") == "completed"
    assert not any("not starting from a checkpoint" in r.getMessage() for r in caplog.records)
    assert any(f"after its checkpoint at position {found[0].covers}" in r.getMessage() for r in caplog.records)
    await log.close()


async def test_a_checkpoint_that_covers_more_than_the_file_is_not_used(tmp_path: Path, clock: FakeClock, often: None):
    """A file put back from a copy older than its checkpoint row (or a row from elsewhere)."""
    path = tmp_path / "log.db"
    log = SqliteLog(path, clock=clock.now)
    await HarnessClient(log=log).send("s", "work", harness="ck", input_id="in-1")
    assert await log.write_checkpoint(50, [])
    found = await log.read_checkpoint()
    assert isinstance(found, NoCheckpoint) and found.damaged and "covers position 50" in found.why
    await log.close()


async def test_a_crash_between_checkpoint_and_tail_loses_nothing(
    tmp_path: Path, clock: FakeClock, caplog: Any, often: None
):
    """A worker killed after its checkpoint, with records after it (an answer taken and a
    step's result logged, the turn not finished): the next one reads the tail and goes on."""
    path = tmp_path / "log.db"
    await first_life(path, clock, caplog)
    log = SqliteLog(path, clock=clock.now)
    (checkpoint, _) = await log.read_checkpoint()  # type: ignore[misc]
    covers = checkpoint.covers
    # What a worker wrote after its checkpoint before it died: a new session's turn, cut
    # after its step's result (its tool call is logged, the turn is not finished).
    copy = tmp_path / "copy.db"
    await HarnessClient(log=log).send("cut", "work", harness="ck", input_id="in-1")
    shutil.copy(path, copy)

    async def stepped() -> bool:
        return any(isinstance(e.record, StepResult) for e in await log.read("cut"))

    await run_worker(log, clock, stepped, caplog)
    await log.close()
    clock.advance(LEASE.total_seconds() + 1)
    # (the worker that stopped wrote a newer checkpoint: put the old one back, as if it
    # had died before writing it)
    with sqlite3.connect(path) as raw:
        raw.execute("DELETE FROM checkpoint")
    log = SqliteLog(path, clock=clock.now)
    assert await log.write_checkpoint(covers, checkpoint.sessions.keys())
    caplog.clear()
    await run_worker(log, clock, lambda: settled(log, "cut", "in-1"), caplog)
    assert await settled(log, "cut", "in-1") == "completed"
    assert any(f"after its checkpoint at position {covers}" in r.getMessage() for r in caplog.records)
    steps = [e for e in await log.read("cut") if isinstance(e.record, StepResult)]
    assert len(steps) == 1  # the step ran once: its logged result was read from the tail
    await log.close()


async def test_a_live_sessions_unreadable_record_parks_it_as_a_full_read_does(
    tmp_path: Path, clock: FakeClock, caplog: Any, often: None
):
    """The checkpoint holds no record: a live session is read from the file, CRCs checked."""
    path = tmp_path / "log.db"
    await first_life(path, clock, caplog)
    with sqlite3.connect(path) as raw:
        (seq, value) = raw.execute(
            "SELECT seq, value FROM records WHERE session_id = 'asking' AND type = 'harness.ask.opened'"
        ).fetchone()
        raw.execute("UPDATE records SET value = ? WHERE seq = ?", (value.replace(b"ok?", b"no?"), seq))
        (covers,) = raw.execute("SELECT covers FROM checkpoint").fetchone()
    assert seq <= covers  # the damaged record is one the checkpoint covers
    log = SqliteLog(path, clock=clock.now)
    caplog.clear()
    worker = await run_worker(log, clock, lambda: True, caplog)
    assert any("after its checkpoint" in r.getMessage() for r in caplog.records)
    assert worker.stats.parked_sessions == 1
    assert worker.stats.corrupt_records == 1
    assert any("session asking is parked" in r.getMessage() for r in caplog.records)
    await log.close()


async def test_two_processes_keep_the_checkpoint_that_covers_most(tmp_path: Path, clock: FakeClock):
    path = tmp_path / "log.db"
    one, two = SqliteLog(path, clock=clock.now), SqliteLog(path, clock=clock.now)
    client = HarnessClient(log=one)
    for i in range(3):
        await client.send(f"s{i}", "work", harness="ck", input_id="in-1")
    assert await one.write_checkpoint(3, ["s0"])
    assert not await two.write_checkpoint(2, ["s0", "s1"])  # an older one does not replace it
    found = await two.read_checkpoint()
    assert not isinstance(found, NoCheckpoint)
    assert found[0].covers == 3 and set(found[0].sessions) == {"s0"}
    await one.close()
    await two.close()


async def test_a_file_made_before_checkpoints_is_read_whole_then_gets_one(
    tmp_path: Path, clock: FakeClock, caplog: Any, often: None
):
    """A schema-3 file without the checkpoint table (as the previous version made it)."""
    path = tmp_path / "log.db"
    log = SqliteLog(path, clock=clock.now)
    await HarnessClient(log=log).send("s", "work", harness="ck", input_id="in-1")
    await log.close()
    with sqlite3.connect(path) as raw:
        raw.execute("DROP TABLE checkpoint")
    reader = SqliteLog(path, clock=clock.now, read_only=True)  # makes nothing
    found = await reader.read_checkpoint()
    assert isinstance(found, NoCheckpoint) and not found.damaged and "no checkpoint table" in found.why
    await reader.close()
    log = SqliteLog(path, clock=clock.now)
    caplog.clear()
    await run_worker(log, clock, lambda: settled(log, "s", "in-1"), caplog)
    said = [r for r in caplog.records if "not starting from a checkpoint" in r.getMessage()]
    assert said and said[0].levelno == logging.INFO
    assert not isinstance(await log.read_checkpoint(), NoCheckpoint)  # the worker wrote one
    await log.close()


async def test_a_worker_that_stops_before_its_first_cadence_leaves_a_checkpoint(
    tmp_path: Path, clock: FakeClock, caplog: Any
):
    """No checkpoint is due yet (2,000 records or 30 s, the default cadence), but a
    stopping worker writes one: the next start reads only what came after it."""
    path = tmp_path / "log.db"
    log = SqliteLog(path, clock=clock.now)
    await HarnessClient(log=log).send("s", "work", harness="ck", input_id="in-1")
    await run_worker(log, clock, lambda: settled(log, "s", "in-1"), caplog)
    found = await log.read_checkpoint()
    assert isinstance(found, tuple), found
    covers = found[0].covers  # what the worker had read when it stopped (its last records may be after)
    assert covers > 0
    await log.close()
    clock.advance(LEASE.total_seconds() + 1)
    log = SqliteLog(path, clock=clock.now)
    await HarnessClient(log=log).send("t", "work", harness="ck", input_id="in-1")
    tail = len(await log.read_all(after=covers))
    caplog.clear()
    await run_worker(log, clock, lambda: settled(log, "t", "in-1"), caplog)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("log read:")]
    assert said == [f"log read: {tail} records after its checkpoint at position {covers}, 1 live sessions"], said
    await log.close()
