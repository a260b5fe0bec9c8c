"""Ctrl-C (or SIGTERM) given to `harness serve` / `harness gateway` while it starts."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.gateway.helpers import child_env, harness_command, wait_for


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_while_serve_loads_its_app_stops_it_quietly(tmp_path: Path, sig: signal.Signals) -> None:
    """A Ctrl-C while `harness serve` loaded its app (before it served) cancelled the
    start inside uvicorn's startup: uvicorn printed a 60-line traceback ("ERROR:
    Traceback ... CancelledError ... KeyboardInterrupt") and the worker logged that "the
    log's checkpoint cannot be read (the SQLite log ... is closed)". Now it stops as a
    running serve does: nothing on stderr, exit 0, and it never says it is ready."""
    gates = tmp_path / "gates"
    gates.mkdir()
    err_path = tmp_path / "serve.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            harness_command("serve", "--log", "sqlite:///h.db", "--app", "tests.apps.slow_import:assistant",
                            "--open-access", "--port", "0"),
            stdout=subprocess.PIPE, stderr=err, text=True, cwd=tmp_path,
            env=child_env(HARNESS_TEST_GATE_DIR=str(gates)),
        )
        try:
            wait_for(lambda: (gates / "importing").exists() or proc.poll() is not None, timeout=60,
                     what="serve to load its app")
            proc.send_signal(sig)
            (gates / "imported").write_text("")
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    stderr = err_path.read_text()
    assert proc.returncode == 0, stderr
    assert stderr == "", stderr
    assert "serve ready" not in out
