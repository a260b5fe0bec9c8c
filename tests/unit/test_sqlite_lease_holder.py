"""A lapsed SQLite lease whose holder process still lives on this machine (a step holding
the GIL stops its renewals): the session is not taken over, so the step runs once
(harness.log.holder). Real child processes stand for the holder."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from harness.errors import SessionBusy
from harness.log.holder import HOLDER_GRACE_S, owner_pid, running_holder
from harness.log.sqlite import SqliteLog
from harness.logs import lease_wait_message

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="the holder check reads /proc (Linux)")

HOST = socket.gethostname()


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGSTOP ``proc`` and wait until the kernel shows it stopped (the signal is asynchronous)."""
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{proc.pid}/stat").read_bytes()
        if stat[stat.rfind(b")") + 1 :].split()[0] in (b"T", b"t"):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {proc.pid} did not stop")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_owner_pid_reads_the_ids_hosts_and_workers_make() -> None:
    assert owner_pid(f"worker:{HOST}:123:ab12cd", HOST) == 123
    assert owner_pid(f"{HOST}:45:ab12cd34", HOST) == 45
    assert owner_pid("worker:elsewhere:123:ab12cd", HOST) is None  # another machine: not ours to ask
    assert owner_pid("parent", HOST) is None
    assert owner_pid(f"{HOST}:x:ab", HOST) is None


def test_a_live_holder_counts_a_stopped_or_dead_one_does_not(child: subprocess.Popen[bytes]) -> None:
    owner = f"worker:{HOST}:{child.pid}:ab12cd"
    assert running_holder(owner) == child.pid
    stop(child)  # frozen: taken over at its lease's end, as before
    try:
        assert running_holder(owner) is None
    finally:
        child.send_signal(signal.SIGCONT)
    child.kill()
    child.wait()
    assert running_holder(owner) is None
    assert running_holder(f"worker:{HOST}:{os.getpid()}:ab12cd") is None  # this process runs


async def test_a_lapsed_lease_of_a_live_holder_is_kept_for_the_grace_then_taken(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    now = [1_000.0]
    log = SqliteLog(tmp_path / "log.db", clock=lambda: now[0])
    try:
        holder = f"worker:{HOST}:{child.pid}:ab12cd"
        await log.claim("s", owner=holder, lease=timedelta(seconds=2))
        now[0] += 3  # the lease ran out while the holder's threads could not run
        with pytest.raises(SessionBusy) as busy:
            await log.claim("s", owner="taker", lease=timedelta(seconds=2))
        assert busy.value.holder_pid == child.pid
        assert busy.value.keep_until == 1_002.0 + HOLDER_GRACE_S
        line = lease_wait_message("s", holder, busy.value.lease_until, now[0], holder_pid=child.pid,
                                  keep_until=busy.value.keep_until)
        assert f"its process {child.pid} is still alive" in line and f"stop process {child.pid}" in line
        assert (await log.lease_info("s")).owner == holder  # nothing was written

        stop(child)  # a frozen holder is taken over at once
        writer = await log.claim("s", owner="taker", lease=timedelta(seconds=2))
        assert writer.epoch == 2
        child.send_signal(signal.SIGCONT)

        await log.claim("s2", owner=holder, lease=timedelta(seconds=2))
        now[0] += 2 + HOLDER_GRACE_S  # stuck past the grace: taken to be hung
        assert (await log.claim("s2", owner="taker", lease=timedelta(seconds=2))).epoch == 2
    finally:
        await log.close()
