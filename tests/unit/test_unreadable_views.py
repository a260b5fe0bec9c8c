"""The views of a session with an unreadable record (``harness show``, ``harness sessions``).

Folded without the record, a session's readable records can say what never happened:
with its ``turn.finished`` unreadable, a turn cancelled while its tool waited for a
person looks ``waiting`` (its ask open), a completed one ``running``. Before the fix the
views said so. Now such a session is ``unreadable`` (its owner parks it: nothing of it
runs, an answer is refused), with no open ask and no wake time, and the rest (turns,
last outcome) is what its readable records say.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from harness import FakeClock, HarnessHost, define_harness, durable_tool, open_log, tool_definition
from harness.cli.sessions import main_show
from harness.runtime.catalog import list_sessions

from .conftest import Args, call, script

S = "s"


class Ok(BaseModel):
    ok: bool


def damage(path: Path, record_type: str) -> None:
    """Flip a byte of the session's (last) record of ``record_type``: it no longer checks."""
    with sqlite3.connect(path) as raw:
        seq, value = raw.execute(
            "SELECT seq, value FROM records WHERE session_id = ? AND type = ? ORDER BY seq DESC", (S, record_type)
        ).fetchone()
        bad = bytearray(value)
        bad[len(bad) // 2] ^= 0xFF
        raw.execute("UPDATE records SET value = ? WHERE seq = ?", (bytes(bad), seq))


async def session_on_file(path: Path, clock: FakeClock, *, cancel: bool) -> None:
    """A turn whose tool asks a person; then cancelled (``aborted``) or answered (``completed``)."""

    async def approve(args: Args, ctx: Any) -> Any:
        return (await ctx.step.ask("approve", message="ok?", schema=Ok)).ok

    t = durable_tool(tool_definition(name="approve", description="d", input_schema=Args), approve)
    h = define_harness(name="shop", model=script([call("c1", "approve")], "done"), tools=[t])
    host = HarnessHost(log=open_log(f"sqlite:///{path}", clock=clock.now), clock=clock)
    session = await host.open(h, session_id=S)
    assert (await session.send("go", input_id="in-1")).outcome == "waiting"
    if cancel:
        assert (await session.cancel("in-1")).outcome == "aborted"
    else:
        assert (await session.answer("c1", "approve", {"ok": True})).outcome == "completed"
    await host.close()


@pytest.mark.parametrize(("cancel", "outcome"), [(True, "aborted"), (False, "completed")])
async def test_a_session_with_an_unreadable_turn_finished_shows_unreadable_not_waiting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cancel: bool, outcome: str
) -> None:
    path, clock = tmp_path / "harness.db", FakeClock()
    await session_on_file(path, clock, cancel=cancel)
    damage(path, "harness.turn.finished")
    now = int(clock.now() * 1000)

    log = open_log(f"sqlite:///{path}")
    try:
        [listed] = await list_sessions(log, now_ms=now)  # harness sessions, the gateway's listing
    finally:
        await log.close()
    assert (listed.state, listed.open_asks, listed.last_outcome) == ("unreadable", (), outcome)

    assert await main_show([S, "--log", f"sqlite:///{path}", "--json"]) == 0
    out = capsys.readouterr()
    summary = json.loads(out.out)["summary"]
    assert (summary["state"], summary["open_asks"], summary["sleeping_until"]) == ("unreadable", [], None)
    assert (summary["last_outcome"], summary["turns"]) == (outcome, 1)  # what the readable records say
    assert "could not be decoded" in out.err

    assert await main_show([S, "--log", f"sqlite:///{path}", "--color", "never"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "parked: a record cannot be read" in header and "waiting" not in header


async def test_a_session_whose_records_all_read_is_shown_as_before(tmp_path: Path) -> None:
    path, clock = tmp_path / "harness.db", FakeClock()
    await session_on_file(path, clock, cancel=True)
    log = open_log(f"sqlite:///{path}")
    try:
        [listed] = await list_sessions(log, now_ms=int(clock.now() * 1000))
    finally:
        await log.close()
    assert (listed.state, listed.last_outcome) == ("idle", "aborted")
