"""`harness send SESSION -` reads the message from standard input (a command line caps an
argument at ~128 KB), as the real command run with a pipe."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from harness import open_log


def _send(tmp_path: Path, stdin: bytes, *extra: str) -> subprocess.CompletedProcess[bytes]:
    log = f"sqlite:///{tmp_path / 'h.db'}"
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "send", "s-1", "-", "--harness", "acme/x", "--no-wait",
         "--input-id", "in-1", "--log", log, *extra],
        input=stdin, capture_output=True, timeout=60, check=False,
    )


def _inputs(tmp_path: Path, kind: str = "message", field: str = "text") -> list[object]:
    """``field`` of each ``harness.input.<kind>`` record of session s-1, in log order."""
    async def read() -> list[object]:
        log = open_log(f"sqlite:///{tmp_path / 'h.db'}")
        try:
            return [e.data[field] for e in await log.read("s-1") if e.type == f"harness.input.{kind}"]
        finally:
            await log.close()

    return asyncio.run(read())


def _create_log(tmp_path: Path) -> None:  # (a worker makes the file; send only writes to one)
    asyncio.run(open_log(f"sqlite:///{tmp_path / 'h.db'}").close())


def test_a_dash_sends_standard_input_whole_past_an_argument_s_limit(tmp_path: Path) -> None:
    _create_log(tmp_path)
    text = "line one\n" + "é" * 200_000 + "\nlast line"  # 400 KB: over the 128 KB of one argument
    done = _send(tmp_path, (text + "\n").encode())
    assert done.returncode == 0, done.stderr.decode()
    assert _inputs(tmp_path) == [text]  # the final line break of a pipe dropped, nothing else


def test_standard_input_that_is_not_utf8_is_one_line_and_nothing_is_sent(tmp_path: Path) -> None:
    done = _send(tmp_path, b"caf\xe9\n")
    err = done.stderr.decode()
    assert done.returncode == 2
    assert err.count("\n") == 1 and "not UTF-8 (byte 0xe9 at byte 3)" in err
    assert not (tmp_path / "h.db").exists()


def test_empty_standard_input_is_refused_like_an_empty_text(tmp_path: Path) -> None:
    done = _send(tmp_path, b"\n")
    assert done.returncode == 2
    assert "the message text is empty" in done.stderr.decode()


def test_ctrl_c_while_the_message_is_typed_ends_the_command_at_once(tmp_path: Path) -> None:
    """`harness send s-1 -` at a terminal ("end it with Ctrl-D"): a Ctrl-C did nothing, as
    the read ran inside the event loop, where asyncio's handler only cancelled the task; the
    command ended only once the person also pressed Ctrl-D. Now it ends at the Ctrl-C, exit
    130, nothing sent."""
    import os
    import pty
    import signal

    _create_log(tmp_path)
    main, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness.cli", "send", "s-1", "-", "--harness", "acme/x", "--no-wait",
             "--log", f"sqlite:///{tmp_path / 'h.db'}"],
            stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        try:
            assert proc.stderr is not None
            assert proc.stderr.readline() == b"reading the message from standard input: end it with Ctrl-D\n"
            os.write(main, b"half a mess")  # typed, not ended
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
    finally:
        os.close(main)
        os.close(terminal)
    assert _inputs(tmp_path) == []


def test_an_answer_given_as_a_dash_is_read_from_standard_input(tmp_path: Path) -> None:
    """`harness answer SESSION CALL ASK -`: an answer too large for one argument (a review of
    a long document) had no way in."""
    from harness import HarnessHost
    from tests.apps.cli_app import assistant

    log = f"sqlite:///{tmp_path / 'h.db'}"

    async def open_an_ask() -> None:  # a turn up to its ask ("approve" / "approval"), then no worker
        async with HarnessHost(log=open_log(log)) as host:
            session = await host.open(assistant, session_id="s-1")
            assert (await session.send("ask", input_id="in-1")).outcome == "waiting"

    asyncio.run(open_an_ask())
    notes = "ok " * 60_000  # 180 KB of JSON: over the 128 KB of one argument
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "answer", "s-1", "approve", "approval", "-", "--no-wait", "--log", log],
        input=(json.dumps({"approved": True, "notes": notes}) + "\n").encode(), capture_output=True, timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert _inputs(tmp_path, "answer", "value") == [{"approved": True, "notes": notes}]
    bad = subprocess.run(
        [sys.executable, "-m", "harness.cli", "answer", "s-1", "approve", "approval", "-", "--no-wait", "--log", log],
        input=b"{not json\n", capture_output=True, timeout=60, check=False,
    )
    assert bad.returncode == 2 and bad.stderr.decode().count("\n") == 1
    assert "is not valid JSON" in bad.stderr.decode()
