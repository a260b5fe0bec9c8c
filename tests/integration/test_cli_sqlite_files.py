"""The CLI on SQLite files that are not (yet) logs, or that this user cannot write, as a
new user meets them: ``harness sessions`` / ``show`` / ``tail`` only read (they never make
or change a file), nothing adopts another application's database, a log that cannot be
written is refused at start with the fix, and a log in a read-only folder (a backup
mounted read-only) can still be read."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
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


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """``path`` (a file or a folder) made unwritable for this user: ``chattr +i`` as root,
    who ignores mode bits (CI runs as root), else its mode without the write bits."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(mode & ~0o222)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    if shutil.which("chattr") is None:
        pytest.skip("running as root, who ignores mode bits, and chattr is missing: nothing makes a file unwritable")
    made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"chattr +i does not work here ({made.stderr.strip()}): nothing makes a file unwritable for root")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


MAKE_LOG = """
import asyncio, sys
from harness import HarnessHost, open_log
from tests.apps.cli_app import assistant

async def main():
    async with HarnessHost(log=open_log("sqlite:///" + sys.argv[1])) as host:
        session = await host.open(assistant, session_id="s-1")
        assert (await session.send("order=1", input_id="in-1")).outcome == "completed"

asyncio.run(main())
"""


def make_log(path: Path) -> None:
    """A log holding session s-1 with one completed turn, made by a process that has
    ended (so its last connection checkpointed the WAL: no -wal or -shm file is left)."""
    subprocess.run([sys.executable, "-c", MAKE_LOG, str(path)], env=cli_env(), cwd=REPO, check=True, timeout=120,
                   stdin=subprocess.DEVNULL)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


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


def test_a_worker_and_send_refuse_a_log_they_cannot_write_and_show_still_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    make_log(path)
    with unwritable(path):
        for command in (["worker", "--app", APP], ["send", "s-1", "order=2", "--harness", HARNESS]):
            out = harness(*command, "--log", f"sqlite:///{path}")
            line = one_line(out)
            assert out.returncode == 1 and line.startswith(
                f"harness {command[0]}: SQLite log '{path}' cannot be written by this process (attempt to write a "
                "readonly database): make the file, and its -wal and -shm files, writable by this user"
            ), line
            assert "'chattr -i' if one is immutable" in line and "mount its filesystem read-write" in line
            assert "worker ready" not in out.stdout
        shown = harness("show", "s-1", "--log", f"sqlite:///{path}", "--color", "never")
        assert shown.returncode == 0 and "settled  in-1 completed" in shown.stdout, shown.stderr
    listed = harness("sessions", "--log", f"sqlite:///{path}")  # nothing was sent meanwhile
    assert listed.returncode == 0 and "s-1" in listed.stdout and "TURNS" in listed.stdout


def test_the_read_commands_read_a_log_in_a_folder_they_cannot_write(tmp_path: Path) -> None:
    folder = tmp_path / "backup"
    folder.mkdir()
    path = folder / "q.db"
    make_log(path)
    before = files_of(folder)
    with unwritable(folder):
        listed = harness("sessions", "--log", f"sqlite:///{path}")
        assert listed.returncode == 0 and "s-1" in listed.stdout, listed.stderr
        note = one_line(listed)
        assert note == (
            f"reading {path} as an unchanging snapshot: SQLite cannot create its -shm file in {folder}, so it reads "
            "the file without locks and does not see changes (nothing may write it meanwhile)"
        )
        shown = harness("show", "s-1", "--log", f"sqlite:///{path}", "--color", "never")
        assert shown.returncode == 0 and "settled  in-1 completed" in shown.stdout, shown.stderr
        sent = harness("send", "s-1", "order=2", "--harness", HARNESS, "--log", f"sqlite:///{path}")
        assert sent.returncode == 1 and f"(its folder {folder} is not writable by this user)" in one_line(sent)
    assert files_of(folder) == before


def test_a_read_only_folder_whose_wal_holds_records_is_refused_with_what_to_do(tmp_path: Path) -> None:
    source, folder = tmp_path / "live", tmp_path / "backup"
    source.mkdir()
    folder.mkdir()
    make_log(source / "q.db")
    with contextlib.closing(sqlite3.connect(source / "q.db")) as raw:  # a write still in the WAL when copied
        raw.execute("PRAGMA wal_autocheckpoint = 0")
        with raw:
            raw.execute("INSERT INTO owners (session_id, owner, epoch) VALUES ('s-2', NULL, 1)")
        for name in ("q.db", "q.db-wal"):
            shutil.copyfile(source / name, folder / name)
    assert (folder / "q.db-wal").stat().st_size > 0
    before = files_of(folder)
    with unwritable(folder):
        out = harness("show", "s-1", "--log", f"sqlite:///{folder / 'q.db'}")
    line = one_line(out)
    assert out.returncode == 1 and line.startswith(
        f"harness show: SQLite log '{folder / 'q.db'}' cannot be read here: its -wal file holds records"
    ), line
    assert line.endswith("copy q.db and q.db-wal to a folder you may write and read the copy")
    assert files_of(folder) == before


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_file_that_is_not_a_database_is_refused_saying_what_it_is_and_stays_as_it_was(
    tmp_path: Path, command: list[str]
) -> None:
    """`--log sqlite:///notes.txt` (a path mistyped onto another file): "SQLite log
    'notes.txt': file is not a database", SQLite's words with no way out. Now it says what
    the file is not and what to check."""
    path = tmp_path / "notes.txt"
    path.write_text("not a database, just some text that is long enough to hold a header\n" * 4)
    before = files_of(tmp_path)
    out = harness(*command, "--log", f"sqlite:///{path}")
    assert out.returncode == 1 and one_line(out) == (
        f"harness {command[0]}: {path} is not a SQLite database (file is not a database): check the path; "
        "if it was a log, it is damaged beyond reading: restore it from a backup"
    )
    assert files_of(tmp_path) == before


def test_a_worker_on_a_path_under_a_file_says_that_file_is_no_folder(tmp_path: Path) -> None:
    """`--log sqlite:///harness.db/x.db`: "its folder .../harness.db does not exist", though it
    does, as a file."""
    (tmp_path / "harness.db").write_text("")
    out = harness("worker", "--app", APP, "--log", f"sqlite:///{tmp_path / 'harness.db' / 'x.db'}")
    assert out.returncode == 1 and one_line(out).endswith(
        f"(its folder {tmp_path / 'harness.db'} is a file, not a folder: fix the path)"
    ), out.stderr


@pytest.mark.parametrize("command", [["worker", "--app", APP], ["sessions"], ["send", "s-1", "hi", "--harness", HARNESS],
                                     ["gateway", "--open-access", "--port", "0"]],
                         ids=["worker", "sessions", "send", "gateway"])
@pytest.mark.parametrize("blank", ["\n", " "], ids=["line-break", "space"])
def test_a_log_url_with_a_blank_at_its_end_is_refused_in_one_line_and_makes_no_file(
    tmp_path: Path, command: list[str], blank: str
) -> None:
    """HARNESS_LOG read from a file or a Secret keeps its last line break: the worker made a
    second log named 'harness.db\\n' beside harness.db (its sessions invisible to every
    command given the clean URL), and `harness sessions` said "no SQLite log at harness.db
    (/.../harness.db )"."""
    make_log(tmp_path / "harness.db")
    before = files_of(tmp_path)
    env = cli_env({"HARNESS_LOG": f"sqlite:///{tmp_path / 'harness.db'}{blank}"})
    out = subprocess.run([sys.executable, "-m", "harness", *command], capture_output=True, text=True, timeout=120,
                         env=env, cwd=REPO, check=False, stdin=subprocess.DEVNULL)
    assert out.returncode == 2, out.stderr
    url = f"sqlite:///{tmp_path / 'harness.db'}{blank}"
    assert one_line(out) == (
        f"harness {command[0]}: the log URL {url!r} has a space or a line break at its end: remove it (a value "
        "read from a file or a Secret often keeps its last line break)"
    )
    assert files_of(tmp_path) == before
