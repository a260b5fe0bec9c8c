"""The README's first command: ``harness demo`` crashes a real process and recovers."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.crash


def test_harness_demo_charges_once_after_a_crash() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "harness.cli", "demo"], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert "process 1: exited with SIGKILL" in lines
    assert lines[-1] == "charges=1 invoices=1 notify_reruns=0 app_records=1"
