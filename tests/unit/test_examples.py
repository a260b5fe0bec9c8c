"""The README's code runs as written: its first example is ``examples/quickstart.py``
(checked word for word), and that file runs, twice, with the same result."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"


def _body(path: Path) -> str:
    """The file without its module docstring."""
    text = path.read_text()
    return text.split('"""', 2)[2].strip() + "\n"


def test_readme_shows_the_quickstart_word_for_word() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks and blocks[0] == _body(QUICKSTART)


def test_quickstart_runs_and_a_second_run_reads_the_log(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    runs = [
        subprocess.run([sys.executable, str(QUICKSTART)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120, check=False)
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr
        assert run.stdout.splitlines() == [
            "completed: Order 42 is paid and invoiced.",
            "app records: [{'type': 'order.paid', 'order_id': '42'}]",
        ]
    shown = subprocess.run([sys.executable, "-m", "harness", "show", "s-1", "--log", "sqlite:///quickstart.db"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("step     charge:42 = ") == 1  # charged once, over two runs


async def test_the_agents_example_checks_out_and_asks(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from harness import FakeClock, HarnessHost, open_log
    from harness.services.worker.apps import load_harnesses

    monkeypatch.chdir(ROOT / "examples")
    monkeypatch.setattr(sys, "path", list(sys.path))
    [assistant] = load_harnesses(["agents:assistant"])  # found from the current folder, as the worker does
    clock = FakeClock()
    async with HarnessHost(log=open_log("memory:"), clock=clock, poll_interval=timedelta(milliseconds=1)) as host:
        s1 = await host.open(assistant, session_id="s-1")
        assert (await s1.send("check out order 42")).text == 'Done: {"charge_id":"ch_42"}'
        s2 = await host.open(assistant, session_id="s-2")
        waiting = await s2.send("refund order 42")
        assert waiting.outcome == "waiting" and waiting.waiting[0].message == "Refund order 42?"
        done = await s2.answer("refund-42", "approval", {"approved": True})
        assert done is not None and done.text == 'Done: {"refunded":true,"refund_id":"re_42"}'
