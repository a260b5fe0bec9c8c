"""Two workers on one SQLite file; one runs a step that holds the GIL longer than the
lease (its renewals stop with it). The other must not take the session over while that
process lives: the step runs once, and the waiting worker says why it waits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.fleet_helpers import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.skipif(not Path("/proc").is_dir(), reason="Linux (/proc)")]

REPO = Path(__file__).resolve().parents[2]


async def test_a_step_holding_the_gil_past_the_lease_runs_once_with_two_workers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    runs = tmp_path / "runs"
    runs.touch()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HARNESS_TEST_GIL_RUNS": str(runs)}

    def worker(name: str) -> subprocess.Popen[str]:
        with (tmp_path / f"{name}.err").open("w") as stderr:  # the child keeps its own copy
            return subprocess.Popen(
                [sys.executable, "-m", "harness", "worker", "--log", url, "--app", "tests.apps.gil_hold:gil_hold",
                 "--lease", "1"],
                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
            )

    def err(name: str) -> str:
        return (tmp_path / f"{name}.err").read_text()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "harness", *args, "--log", url], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    first = worker("first")
    second = None
    try:
        await wait_until(lambda: "worker ready" in err("first"), timeout=60, what="the first worker")
        sent = cli("send", "g-1", "5", "--harness", "tests/gil-hold", "--no-wait", "--input-id", "in-1")
        assert sent.returncode == 0, sent.stderr
        await wait_until(lambda: runs.read_text() != "", timeout=60, what="the step to start")
        second = worker("second")  # it sees the lease run out while the step holds the GIL
        await wait_until(lambda: "turn 1 of session g-1 completed" in err("first") + err("second"), timeout=60,
                         what="the turn to finish", details=lambda: err("first") + err("second"))
        assert runs.read_text().splitlines() == [str(first.pid)]  # once, never taken over
        assert f"its process {first.pid} is still alive on this machine" in err("second")
        assert "took over" not in err("second")
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=60)
