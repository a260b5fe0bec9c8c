"""``harness show`` of a session whose log holds later copies of an input (SPEC 7.2: a
resend has no second effect; producers that race leave copies) and a turn cancelled while
its tool slept: the copies read ``resent``, never "not settled yet" for ever."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from harness.log import open_log
from harness.records import (
    InputMessage,
    InputRecords,
    InputSettled,
    ModelResponseRecord,
    SleepScheduled,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)
from tests.integration.cli_helpers import cli_env
from tests.integration.fleet_helpers import REPO

SID = "dup-1"
NOTES = [{"type": "app.note", "fact": "x"}]


async def write(url: str) -> None:
    """Five copies of one message (one turn ran, cancelled in its tool's sleep), then app
    records sent twice under one id: the log a trial of concurrent POSTs left."""
    log = open_log(url)
    try:
        for _ in range(5):
            await log.submit(InputMessage(SID, 1000, "same-1", "hi", "acme/assistant"))
        writer = await log.claim(SID, owner="test", lease=timedelta(seconds=30))
        calls = ({"id": "nap-1", "name": "nap", "arguments": {}},)
        await writer.append([TurnStarted(SID, 1001, "same-1", 1), ModelResponseRecord(SID, 1002, 1, 0, "nap", calls),
                             ToolStarted(SID, 1003, "nap-1", "nap", 1), SleepScheduled(SID, 1004, "nap-1", "wait", 9000)])
        await writer.append([TurnFinished(SID, 1005, "same-1", 1, "aborted", None, "cancelled", "cancelled"),
                             InputSettled(SID, 1005, "same-1", "aborted", "cancelled", "cancelled")])
        await log.submit(InputRecords(SID, 1006, "rec-same", NOTES))
        await writer.append([InputSettled(SID, 1007, "rec-same", "completed")])
        await log.submit(InputRecords(SID, 1008, "rec-same", NOTES))
    finally:
        await log.close()


def show(url: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "harness", "show", SID, "--log", url, *args], capture_output=True,
                         text=True, timeout=120, env=cli_env(), cwd=REPO, check=False, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_s7_2_show_reads_later_copies_as_resends_of_the_first(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    asyncio.run(write(url))
    text = show(url)
    assert "not settled yet" not in text, text
    assert text.count("same-1  (resent; the first at position 1 counts)") == 4, text
    assert text.count("rec-same  (resent; the first at position") == 1, text
    assert sum("app.note" in line for line in text.splitlines()) == 1, text  # the records once
    data = json.loads(show(url, "--json"))
    assert data["summary"]["state"] == "idle" and data["summary"]["sleeping_until"] is None
    assert [i["status"] for i in data["timeline"] if i["kind"] == "input.message"] == ["aborted"] + ["resent"] * 4
