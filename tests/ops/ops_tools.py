"""What every ops test needs: the real tools, background processes, polling.

The tools are installed or built by ``.ci/ops-tools.sh`` into ``~/.cache/harness/bin``
(or come from Debian packages on PATH). A missing tool FAILS the test in CI
(``CI=true``) and skips it elsewhere, with the command that installs it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "durable-harness"
CACHE = Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "harness"))
TOOL_BIN = CACHE / "bin"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
KUBE_VERSION = "1.33.0"
INSTALL_HINT = "run .ci/ops-tools.sh (it installs and builds every ops tool, cached under ~/.cache/harness)"
POLL_S = 0.2


def unavailable(why: str) -> None:
    """A real component is missing: fail in CI, skip elsewhere."""
    if IN_CI:
        pytest.fail(f"{why}; {INSTALL_HINT}", pytrace=False)
    pytest.skip(f"{why}; {INSTALL_HINT}")


def tool(name: str) -> str:
    """The path of a tool binary (``~/.cache/harness/bin`` first, then PATH)."""
    cached = TOOL_BIN / name
    if cached.exists() and os.access(cached, os.X_OK):
        return str(cached)
    found = shutil.which(name)
    if found is None:
        unavailable(f"{name} is not installed")
        raise AssertionError("unreachable")
    return found


def python_tool(module_or_script: str) -> list[str]:
    """A console script of a Python package installed in this interpreter's environment."""
    script = Path(sys.executable).parent / module_or_script
    if script.exists():
        return [str(script)]
    found = shutil.which(module_or_script)
    if found is None:
        unavailable(f"{module_or_script} is not installed (pip install -e '.[ops]')")
        raise AssertionError("unreachable")
    return [found]


def run(
    argv: Sequence[str],
    *,
    input: str | None = None,  # noqa: A002 - subprocess's name
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure the assertion shows the command and its output."""
    proc = subprocess.run(
        list(argv), input=input, env=dict(env) if env is not None else None, cwd=cwd,
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], object], *, timeout: float, what: str, details: Callable[[], str] | None = None) -> object:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{details()}" if details is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(POLL_S)


class Proc:
    """A background process of a test, its output in ``workdir/<name>.log``; stopped by its pid."""

    def __init__(self, name: str, argv: Sequence[str], *, workdir: Path, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = workdir / f"{name}.log"
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
            )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def describe(self, lines: int = 30) -> str:
        tail = "\n".join(self.output().splitlines()[-lines:])
        return f"--- {self.name} (pid {self.proc.pid}, rc={self.proc.poll()}): {' '.join(self.argv[:3])} ...\n{tail}"

    def check_alive(self) -> None:
        if not self.alive:
            raise AssertionError(f"{self.name} exited\n{self.describe()}")

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; this process (its own session) only."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(10)
        return None


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """``(status, body)``; ``(0, error)`` when nothing answers."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")
    except OSError as e:
        return 0, str(e)


def harness_env(**extra: str) -> dict[str, str]:
    """The environment of a ``harness`` process run from this checkout (no HARNESS_* leaks in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env
