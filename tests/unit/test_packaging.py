"""The built wheel: ``harness`` is its only top-level import name (a user's own ``services``
or ``tests`` package never collides with it), and the ``harness`` command points at the CLI."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_installs_one_top_level_import_name(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)], cwd=ROOT,
                   check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"harness"}
    assert {"harness/py.typed", "harness/cli/__init__.py", "harness/services/worker/main.py",
            "harness/schemas/harness.input.message.avsc", "harness/__main__.py"} <= set(names)
    [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "harness = harness.cli:main" in text
