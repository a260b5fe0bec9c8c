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


def test_demo_refuses_a_folder_of_an_earlier_demo_and_a_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`harness demo --dir d` a second time ran on the old log: nothing crashed ("process 1:
    exited with 0") and the transcript held both runs; a file as --dir was a FileExistsError."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "sessions.db").write_bytes(b"")
    (tmp_path / "f").write_text("x")
    for folder, says in (("d", "holds an earlier demo's sessions.db"), ("f", "is a file, not a folder")):
        out = subprocess.run([sys.executable, "-m", "harness.cli", "demo", "--dir", str(tmp_path / folder)],
                             capture_output=True, text=True, timeout=120, check=False)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and says in lines[0], out.stderr
        assert lines[0].startswith("harness demo: --dir ") and out.stdout == ""
