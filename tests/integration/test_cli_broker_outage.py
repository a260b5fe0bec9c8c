"""A session command against a Kafka broker that is down, or goes down mid-command: one
line of our own on stderr (the servers and the fix), exit 1, in bounded time, and none of
librdkafka's own lines (``%3|...|FAIL|rdkafka#producer-1| ...`` / ``FAIL [rdkafka#...]``)."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI
from tests.integration.cli_helpers import cli_env
from tests.integration.fleet_helpers import REPO

BROKER_LOST_S = 15.0


def _closed_port() -> int:
    with socket.socket() as sock:  # bound then closed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _line_with(proc: subprocess.Popen[str], text: str, deadline: float) -> str:
    """The first line ``proc`` prints that holds ``text`` (its stdout read up to it)."""
    assert proc.stdout is not None
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            break  # (it ended)
        if text in line:
            return line
    raise AssertionError(f"{proc.args!r} printed no line with {text!r}")


def _noise(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "rdkafka" in line or "%3|" in line or "|FAIL|" in line]


def _harness(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness", *args]


@pytest.mark.parametrize("command", [
    ("send", "s-1", "hi", "--harness", "a/b"),
    ("send", "s-1", "hi", "--harness", "a/b", "--no-wait"),
    ("answer", "s-1", "call-1", "approval", '{"approved": true}'),
    ("tail", "s-1"),
    ("sessions",),
    ("show", "s-1"),
], ids=lambda c: "-".join(a for a in c if not a.startswith(("{", "-"))))
def test_no_broker_is_one_line(command: tuple[str, ...]) -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    out = subprocess.run(_harness(*command, "--log", f"kafka://{bootstrap}?topic_prefix=nobroker"),
                         capture_output=True, text=True, timeout=60, env=cli_env(), cwd=REPO, stdin=subprocess.DEVNULL)
    lines = out.stderr.splitlines()
    assert out.returncode == 1, out.stderr
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"harness {command[0]}: cannot reach Kafka at {bootstrap} ")
    assert "check the address in --log (or HARNESS_LOG) and that the broker is up" in lines[0]
    assert not _noise(out.stderr)
    assert out.stdout == ""


def _own_broker() -> Any:
    """A broker of this test's own (it is stopped mid-test): fails in CI when none can
    start, skips elsewhere (no Java or jars)."""
    from harness.testing.kafka_local import LocalKafka

    try:
        return LocalKafka().start()
    except Exception as exc:  # noqa: BLE001 - no Java / jars here: fail in CI, skip locally
        if IN_CI:
            pytest.fail(f"no Kafka broker could be started in CI: {exc}", pytrace=False)
        pytest.skip(f"no local Kafka broker: {exc}")


@pytest.mark.kafka
def test_broker_stopped_mid_command(tmp_path: object) -> None:
    """``send`` (waiting for a settlement no worker gives) and ``tail`` while the broker
    stops: each ends with one line saying the cluster is lost, how to fix it and where the
    input is; no librdkafka line."""
    broker = _own_broker()
    url = f"kafka://{broker.bootstrap}?topic_prefix=outage&partitions=1"
    env = cli_env()
    try:
        made = subprocess.run(_harness("topics", "create", "--log", url), capture_output=True, text=True,
                              timeout=120, env=env, cwd=REPO)
        assert made.returncode == 0, made.stderr
        send = subprocess.Popen(_harness("send", "s-1", "hi", "--harness", "a/b", "--input-id", "in-1",
                                         "--timeout", "120", "--log", url),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                                stdin=subprocess.DEVNULL)
        tail = subprocess.Popen(_harness("tail", "s-1", "--log", url), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        shown = subprocess.run(_harness("show", "s-1", "--log", url), capture_output=True, text=True, env=env,
                               cwd=REPO, timeout=60)
        while shown.returncode != 0 and time.monotonic() < deadline:  # until the input is in the log
            time.sleep(0.5)
            shown = subprocess.run(_harness("show", "s-1", "--log", url), capture_output=True, text=True,
                                   env=env, cwd=REPO, timeout=60)
        assert "in-1" in shown.stdout, shown.stderr
        _line_with(tail, "in-1", deadline)  # the tail shows the input: it is following
        broker.stop()
        send_out, send_err = send.communicate(timeout=BROKER_LOST_S + 60)
        tail_out, tail_err = tail.communicate(timeout=BROKER_LOST_S + 60)
    finally:
        for proc in ("send", "tail"):
            p = locals().get(proc)
            if p is not None and p.poll() is None:
                p.kill()
        broker.close()
    assert send.returncode == 1, send_err
    assert not _noise(send_err), send_err
    assert send_err.splitlines() == [send_err.strip()], send_err
    assert send_err.startswith(f"harness send: lost the Kafka cluster at {broker.bootstrap}: no broker answered")
    assert "check that the broker is up and that --log (or HARNESS_LOG) names it" in send_err
    assert "in-1 is in the log" in send_err
    assert tail.returncode == 1, tail_err
    assert not _noise(tail_err), tail_err
    assert tail_err.splitlines()[-1].startswith(f"harness tail: lost the Kafka cluster at {broker.bootstrap}")
    assert len([line for line in tail_err.splitlines() if not line.startswith("(no records")]) == 1, tail_err


@pytest.mark.kafka
def test_a_worker_whose_broker_stops_says_so_once_not_every_probe(tmp_path: Path) -> None:
    """A worker printed `WARNING harness.worker the broker did not answer a log-end query:
    KafkaError{code=...}` every 5 s while its broker was down: now one line with the reason,
    then at most one a minute (harness.runtime.broker_silence)."""
    from harness.runtime.group import PROBE_EVERY_S
    broker = _own_broker()
    url = f"kafka://{broker.bootstrap}?topic_prefix=quiet&partitions=1"
    out_path = tmp_path / "worker.log"
    with out_path.open("w") as out:
        worker = subprocess.Popen(_harness("worker", "--app", "tests.apps.cli_app:assistant", "--log", url),
                                  stdout=out, stderr=subprocess.STDOUT, text=True, env=cli_env(), cwd=REPO,
                                  stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while "worker ready" not in out_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "worker ready" in out_path.read_text(), out_path.read_text()
        broker.stop()
        first = f"the broker at {broker.bootstrap} did not answer ("
        deadline = time.monotonic() + 60
        while first not in out_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first in out_path.read_text(), out_path.read_text()
        time.sleep(4 * PROBE_EVERY_S)  # (what must not happen: a line each probe; nothing to poll for)
    finally:
        worker.kill()
        worker.wait(timeout=30)
        broker.close()
    text = out_path.read_text()
    ours = [line for line in text.splitlines() if f"the broker at {broker.bootstrap}" in line]
    assert len(ours) == 1 and ours[0].endswith("; waiting for it") and "KafkaError{" not in ours[0], text
    assert "log-end query" not in text
