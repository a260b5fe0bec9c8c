"""Helpers for the gateway tests: a real uvicorn server on 127.0.0.1 (in a thread, or the
real ``harness`` command in a subprocess), an SSE reader, and polling with a deadline.

Nothing here sleeps to wait for a condition: :func:`wait_for` polls with a deadline
and fails saying what it waited for.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from harness.definition import Harness
from harness.log.base import SessionLog
from harness.services.gateway.app import create_app
from harness.services.gateway.settings import GatewaySettings
from harness.services.gateway.state import GatewayState

REPO = Path(__file__).resolve().parents[2]
APP = "tests.apps.approvals:approvals"
HARNESS = "tests/approvals"
ARTIFACTS = Path(os.environ.get("HARNESS_TEST_ARTIFACTS", REPO / "build" / "test-artifacts"))


def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


class ServerThread:
    """The gateway app on a real uvicorn server (127.0.0.1, a free port) in its own thread.

    With ``worker=True`` a :class:`~harness.runtime.worker.Worker` drives the sessions in
    the same event loop, as ``harness serve`` does (on SQLite its sessions' live deltas
    go to the gateway's streams through an in-process router, as there).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        harnesses: Sequence[Harness] = (),
        worker: bool = False,
        log: SessionLog | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.secrets = dict(secrets or {})  # the worker's, for every session (as --secrets-dir)
        self.harnesses = list(harnesses)
        self.worker = worker
        self.given_log = log
        self.metrics: Any = None  # a metrics sink instead of the default one
        self.clock: Callable[[], float] | None = None  # the rate limit's clock instead of time.monotonic
        self.url = ""
        self.state: GatewayState | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> ServerThread:
        import uvicorn

        from harness.live import LiveRouter
        from harness.services.gateway.app import default_live, open_gateway_log

        stop = asyncio.Event()
        task: list[asyncio.Task[None]] = []
        live: Any = None

        async def on_startup(state: GatewayState) -> None:
            self.state = state
            self._loop = asyncio.get_running_loop()
            if self.worker:
                from harness.runtime.worker import Worker

                w = Worker(log=state.log, harnesses=self.harnesses, lease=timedelta(seconds=30),
                           poll_interval=timedelta(milliseconds=20),
                           secrets_for=(lambda sid, name: self.secrets) if self.secrets else None)
                if isinstance(live, LiveRouter):
                    w.host.live = live
                task.append(asyncio.create_task(w.run(stop)))
                await w.ready.wait()

        async def on_shutdown(state: GatewayState) -> None:
            stop.set()
            for t in task:
                await t

        def run() -> None:
            try:
                nonlocal live
                log = self.given_log or open_gateway_log(self.settings, client=not self.worker)
                live = default_live(log)
                app = create_app(self.settings, log=log, harnesses=self.harnesses, live=live, metrics=self.metrics,
                                 clock=self.clock, on_startup=on_startup, on_shutdown=on_shutdown)
                config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False,
                                        lifespan="on", timeout_graceful_shutdown=2,
                                        proxy_headers=False)  # (as harness gateway: the app's ForwardedClient)
                self._server = uvicorn.Server(config)

                async def main() -> None:
                    try:
                        await self._server.serve()
                    finally:
                        if self.given_log is None:
                            await log.close()

                asyncio.run(main())
            except BaseException as exc:  # noqa: BLE001 - reported by start()
                self._error = exc

        self._thread = threading.Thread(target=run, name="gateway-test-server", daemon=True)
        self._thread.start()
        wait_for(lambda: self._error is not None or (self._server is not None and self._server.started),
                 timeout=60, what="the gateway to start")
        if self._error is not None:
            raise self._error
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self.state is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.state.begin_shutdown)  # as harness gateway's signal handler
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def open_settings(log_url: str, **kw: Any) -> GatewaySettings:
    return GatewaySettings(log=log_url, open_access=True, heartbeat_s=kw.pop("heartbeat_s", 0.3), **kw)


# --------------------------------------------------------------------------- subprocesses


def harness_command(*args: str) -> list[str]:
    """``harness ARGS`` with this worktree's code (the installed package may point elsewhere)."""
    return [sys.executable, "-m", "harness.cli", *args]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


@dataclass
class Process:
    proc: subprocess.Popen[str]
    url: str = ""
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None
    err: Any = None
    last_stderr: str = ""

    def stderr(self) -> str:
        """What the process wrote to stderr (after ``stop``: all of it)."""
        if self.err is None or self.err.closed:
            return self.last_stderr
        self.err.seek(0)
        text: str = self.err.read()
        return text

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.reader is not None:
            self.reader.join(timeout=10)
        self.last_stderr = self.stderr()
        for pipe in (self.proc.stdout, self.err):
            if pipe is not None:
                pipe.close()
        return self.proc.returncode


def start_process(args: Sequence[str], *, ready: str, cwd: Path | None = None, timeout: float = 90,
                  env: dict[str, str] | None = None) -> Process:
    """Start ``harness ARGS`` (``env``: more environment); wait for the stdout line starting with
    ``ready`` (its url= is kept)."""
    # stderr goes to a file, never a pipe nobody reads (a full pipe would stall the server)
    err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by Process.stop
    proc = subprocess.Popen(harness_command(*args), stdout=subprocess.PIPE, stderr=err, text=True,
                            env=child_env(**(env or {})), cwd=str(cwd or REPO))
    out = Process(proc, err=err)
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    out.reader = threading.Thread(target=read, daemon=True)
    out.reader.start()

    def is_ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"harness {' '.join(args)} exited {proc.returncode}: {out.stderr()}")
        return any(line.startswith(ready) for line in lines)

    wait_for(is_ready, timeout=timeout, what=f"'{ready}' from harness {args[0]}")
    line = next(line for line in lines if line.startswith(ready))
    for word in line.split():
        if word.startswith("url="):
            out.url = word[4:]
    out.lines = lines
    return out


# --------------------------------------------------------------------------- SSE


@dataclass
class Event:
    event: str
    data: Any
    id: int | None = None


def read_events(response: httpx.Response, *, until: Callable[[list[Event]], bool],
                comments: list[str] | None = None) -> list[Event]:
    """Parse an open ``text/event-stream`` response until ``until(events)`` holds."""
    return read_events_from(response.iter_lines(), until=until, comments=comments)


def read_events_from(lines: Iterator[str], *, until: Callable[[list[Event]], bool],
                     comments: list[str] | None = None, timeout: float = 90) -> list[Event]:
    """Parse ``text/event-stream`` lines until ``until(events)`` holds (the rest stays in
    ``lines``, to read on with another call). Fails after ``timeout`` seconds (checked at
    each line: the server's heartbeats keep lines coming on an idle stream)."""
    events: list[Event] = []
    fields: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    for line in lines:
        if time.monotonic() > deadline:
            raise AssertionError(f"the stream did not get there in {timeout:.0f}s; events: {events}")
        if line == "":
            if "data" in fields:
                ev = Event(fields.get("event", "message"), json.loads(fields["data"]),
                           int(fields["id"]) if "id" in fields else None)
                events.append(ev)
                if until(events):
                    return events
            fields = {}
            continue
        if line.startswith(":"):
            if comments is not None:
                comments.append(line)
                if until(events):
                    return events
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        fields[name] = fields[name] + "\n" + value if name == "data" and name in fields else value
    return events


def settled(events: list[Event], input_id: str) -> bool:
    return any(e.event == "harness.input.settled" and e.data["data"]["input_id"] == input_id for e in events)
