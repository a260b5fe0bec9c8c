"""Ctrl-C while a command waits for a Kafka broker's first answer (the 5-second probe of
its log) ends it at once."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.integration.cli_helpers import cli_env
from tests.integration.fleet_helpers import REPO


@pytest.mark.parametrize("args", [["sessions"], ["send", "s-1", "hi", "--harness", "h"], ["topics", "create"]],
                         ids=["sessions", "send", "topics"])
def test_ctrl_c_while_the_broker_is_probed_ends_the_command_at_once(args: list[str]) -> None:
    """A Ctrl-C at a broker that accepts connections and never answers (a wrong port, a
    hung broker) was obeyed only when the probe gave up, up to 5 s later, in silence: the
    probe ran on asyncio's default thread pool, which asyncio.run waits for at exit. Now
    the probe has a thread of its own and the command ends at once (exit 130)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness", *args, "--log", f"kafka://127.0.0.1:{port}?topic_prefix=t"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=REPO,
            stdin=subprocess.DEVNULL,
        )
        try:
            silent.settimeout(60)
            conn, _ = silent.accept()  # the probe connected: it now waits for an answer
            with conn:
                proc.send_signal(signal.SIGINT)
                sent = time.monotonic()
                _out, err = proc.communicate(timeout=30)
                took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert took < 2.5, f"the command ended {took:.1f} s after the Ctrl-C"
