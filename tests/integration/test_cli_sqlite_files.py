"""The CLI on SQLite files that are not (yet) logs, as a new user meets them:
``harness sessions`` / ``show`` / ``tail`` only read (they never make or change a file),
and nothing adopts another application's database."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.cli_helpers import APP, HARNESS, cli_env, wait_until
from tests.integration.fleet_helpers import REPO, WorkerProcess


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    # The timeout only guards against a hang (a worker that never gives up); nothing is timed.
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=120,
                          env=cli_env(), cwd=REPO, check=False, stdin=subprocess.DEVNULL)


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def files_of(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


COMMANDS = [
    ["sessions"],
    ["show", "s-1"],
    ["tail", "s-1"],
    ["send", "s-1", "hello", "--harness", HARNESS],
    ["answer", "s-1", "call-1", "approval", '{"approved": true}'],
    ["worker", "--app", APP],
]


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_no_command_adopts_an_app_database_and_none_changes_it(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE foo (x)")
        raw.execute("CREATE TABLE bar (y)")
    before = files_of(tmp_path)
    out = harness(*command, "--log", f"sqlite:///{path}")
    assert out.returncode == 1 and one_line(out) == (
        f"harness {command[0]}: {path} is not a harness log: it holds the tables bar, foo and no harness meta table; "
        "check the path (a log needs a file of its own)"
    )
    assert files_of(tmp_path) == before


@pytest.mark.parametrize("command", COMMANDS[:5], ids=[c[0] for c in COMMANDS[:5]])
def test_an_empty_file_is_no_log_for_the_session_commands_and_stays_empty(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    out = harness(*command, "--log", f"sqlite:///{path}")
    assert out.returncode == 1 and one_line(out) == (
        f"harness {command[0]}: no SQLite log at {path}: the file is empty (it holds no tables); a worker (or "
        "HarnessHost) makes it a log when it first opens it"
    )
    assert files_of(tmp_path) == {"empty.db": hashlib.sha256(b"").hexdigest()}


async def test_a_worker_still_makes_a_log_of_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    worker = WorkerProcess(name="w", log_url=f"sqlite:///{path}", apps=[APP], env=cli_env(), workdir=tmp_path)
    try:
        await wait_until(lambda: worker.ready or not worker.alive, timeout=90, what="the worker to be ready",
                         details=worker.describe)
        assert worker.ready, worker.describe()
        listed = harness("sessions", "--log", f"sqlite:///{path}")
        assert listed.returncode == 0 and listed.stderr.strip() == "no sessions in this log", listed.stderr
    finally:
        worker.terminate()
        worker.cleanup()
