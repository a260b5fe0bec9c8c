"""The README's first command: ``harness demo`` crashes a real process and recovers."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

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


def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder nobody here may create a file in: read-only by its mode; for root, who
    ignores modes, a sysfs folder (no files can be made there)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys/kernel")):
        try:
            with tempfile.NamedTemporaryFile(dir=candidate):
                pass
        except OSError:
            return candidate
    pytest.skip("no folder here refuses a new file")


def test_demo_in_a_folder_it_cannot_write_says_so_in_one_line(tmp_path: Path) -> None:
    """It printed two tracebacks (sqlite3.OperationalError: unable to open database file),
    one per process, then "process 2 failed"."""
    folder = _unwritable_folder(tmp_path)
    try:
        out = subprocess.run([sys.executable, "-m", "harness.cli", "demo", "--dir", str(folder)],
                             capture_output=True, text=True, timeout=120, check=False)
    finally:
        (tmp_path / "read-only").chmod(0o755)
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.splitlines() == [
        f"harness demo: --dir {folder}: the folder is not writable (Permission denied): give a folder you can "
        "write to, or make this one writable"
    ]


def test_an_empty_dir_is_refused_not_taken_for_no_dir(tmp_path: Path) -> None:
    """`harness demo --dir "$DIR"` with DIR unset ran in a temporary folder, silently, and
    the log the person meant to keep was gone."""
    out = subprocess.run([sys.executable, "-m", "harness.cli", "demo", "--dir", ""],
                         capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.splitlines() == [
        "harness demo: --dir is empty: give a folder (it is made if missing), or leave --dir out for a temporary one"
    ]


def test_a_process_of_the_story_that_fails_is_one_line_and_its_output_with_debug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness import demo

    traceback = "Traceback (most recent call last):\n  ...\nsqlite3.OperationalError: unable to open database file\n"
    monkeypatch.setattr(demo, "_child", lambda *args: (1, traceback))
    assert demo.main([]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "harness demo: process 1 failed with exit code 1: sqlite3.OperationalError: unable to open database file "
        "(--debug shows its output)"
    ]
    assert demo.main(["--debug"]) == 1
    assert capsys.readouterr().err.startswith(traceback)
