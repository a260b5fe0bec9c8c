"""Helpers of the CLI tests: run ``python -m harness ...`` in a subprocess, workers of
``tests.apps.cli_app``, a log URL per backend. Nothing sleeps to wait: ``wait_until``
polls with a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fleet_helpers import REPO, WorkerProcess, wait_until

__all__ = [
    "ANSI", "APP", "HARNESS", "Backend", "backend_params", "cli_env", "closed_pipe", "make_backend", "wait_until",
]

APP = "tests.apps.cli_app:assistant"
HARNESS = "tests/cli"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@contextlib.contextmanager
def closed_pipe() -> Iterator[int]:
    """The write end of a pipe whose reader has gone (as after ``| head -1`` read its line):
    every write to it fails with EPIPE, whatever the timing."""
    read, write = os.pipe()
    os.close(read)
    try:
        yield write
    finally:
        os.close(write)


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_SECRET_", "HARNESS_KAFKA_CONFIG_"))}
    for name in ("HARNESS_LOG", "HARNESS_APPS", "HARNESS_SECRETS_DIR", "HARNESS_MAX_SESSIONS", "HARNESS_SYNC_THREADS", "HARNESS_DRAIN_TIMEOUT_SECONDS",
                 "HARNESS_LOG_FORMAT",
                 "HARNESS_LOG_LEVEL", "HARNESS_INSTANCE_ID", "NO_COLOR"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@dataclass
class Backend:
    """One log for one test: its URL and where its workers keep their files."""

    name: str
    url: str
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    workers: list[WorkerProcess] = field(default_factory=list)

    def cli(self, *args: str, timeout: float = 90.0, env: Mapping[str, str] | None = None,
            cwd: Path | None = None, log: bool = True) -> subprocess.CompletedProcess[str]:
        """``python -m harness ARGS --log URL`` (no ``--log`` with ``log=False``)."""
        argv = [sys.executable, "-m", "harness", *args]
        if log:
            argv += ["--log", self.url]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              env=cli_env({**self.env, **(env or {})}), cwd=cwd or REPO, stdin=subprocess.DEVNULL)

    def popen(self, *args: str, stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE,
              env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "harness", *args, "--log", self.url]
        return subprocess.Popen(argv, stdout=stdout, stderr=stderr, text=True, env=cli_env({**self.env, **(env or {})}),
                                cwd=REPO, stdin=subprocess.DEVNULL)

    def worker(self, *extra: str, apps: Iterable[str] = (APP,), env: Mapping[str, str] | None = None,
               name: str | None = None) -> WorkerProcess:
        worker = WorkerProcess(
            name=name or f"{self.name}-w{len(self.workers)}", log_url=self.url, apps=apps,
            env=cli_env({**self.env, **(env or {})}), workdir=self.workdir, extra_args=extra,
        )
        self.workers.append(worker)
        return worker

    async def ready(self, worker: WorkerProcess, timeout: float = 90.0) -> None:
        def check() -> bool:
            if not worker.alive:
                raise AssertionError(f"worker died before it was ready\n{worker.describe()}")
            return worker.ready

        await wait_until(check, timeout=timeout, what="the worker to be ready", details=worker.describe)

    def json(self, *args: str) -> Any:
        out = self.cli(*args, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def cleanup(self) -> None:
        for worker in self.workers:
            worker.cleanup()


backend_params = [pytest.param("sqlite", id="sqlite"), pytest.param("kafka", id="kafka", marks=pytest.mark.kafka)]


def make_backend(request: pytest.FixtureRequest, name: str, workdir: Path, *, partitions: int = 2) -> Iterator[Backend]:
    if name == "sqlite":
        backend = Backend(name, f"sqlite:///{workdir / 'log.db'}", workdir)
    else:
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        prefix = request.getfixturevalue("unique_prefix")
        backend = Backend(name, f"kafka://{bootstrap}?topic_prefix={prefix}&partitions={partitions}", workdir)
    try:
        yield backend
    finally:
        backend.cleanup()
