"""The project's image built and run with podman (rootful, host network: podman's own
bridge is a private range, never a target here)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from pathlib import Path

from ops_tools import REPO, Proc, run, tool, unavailable

BASE_IMAGE = "localhost/debian-py:bookworm"
IMAGE = "localhost/durable-harness:test"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def podman() -> str:
    return tool("podman")


def source_commit() -> str:
    """The checkout's HEAD commit (what a release build passes as the image's REVISION); "" outside git."""
    return run(["git", "rev-parse", "HEAD"], cwd=REPO, check=False).stdout.strip()


def build_image(tag: str = IMAGE) -> str:
    """``podman build`` of the Containerfile (layers cached by podman between runs)."""
    exe = podman()
    if run([exe, "image", "exists", BASE_IMAGE], check=False).returncode != 0:
        unavailable(f"the base image {BASE_IMAGE} is missing")
    argv = [exe, "build", "--network", "host", "-f", str(REPO / "Containerfile"), "-t", tag,
            "--build-arg", f"REVISION={source_commit()}"]
    if HOST_CA.exists():  # a TLS-intercepting proxy's CA for pip during the build; not kept in the image
        argv += ["--volume", f"{HOST_CA}:{HOST_CA}:ro"]
    run([*argv, str(REPO)], timeout=900)
    # Each change of the code leaves the previous build's layers untagged: drop old ones
    # (a day's worth stays, as the build cache of the next runs).
    run([exe, "image", "prune", "-f", "--filter", "until=24h"], check=False, timeout=300)
    return tag


class Container:
    """One detached container; ``podman logs`` for its output, removed at ``stop``."""

    def __init__(self, image: str, args: Sequence[str], *, workdir: Path, options: Sequence[str] = ()) -> None:
        self.name = f"harness-test-{uuid.uuid4().hex[:8]}"
        self.exe = podman()
        run([self.exe, "run", "-d", "--name", self.name, *options, image, *args], timeout=120)
        # ``podman logs -f`` follows the container's output into a file the test can read.
        self.follower = Proc(f"logs-{self.name}", [self.exe, "logs", "-f", self.name], workdir=workdir)

    def output(self) -> str:
        return self.follower.output()

    def running(self) -> bool:
        out = run([self.exe, "inspect", "-f", "{{.State.Running}}", self.name], check=False).stdout.strip()
        return out == "true"

    def describe(self) -> str:
        tail = "\n".join(self.output().splitlines()[-30:])
        return f"--- container {self.name}:\n{tail}"

    def stop(self, timeout: int = 30) -> int:
        """SIGTERM (``podman stop``), then its exit code."""
        run([self.exe, "stop", "-t", str(timeout), self.name], check=False, timeout=timeout + 30)
        code = run([self.exe, "inspect", "-f", "{{.State.ExitCode}}", self.name], check=False).stdout.strip()
        return int(code) if code.lstrip("-").isdigit() else -1

    def remove(self) -> None:
        with contextlib.suppress(AssertionError):
            run([self.exe, "rm", "-f", self.name], check=False, timeout=60)
        self.follower.stop()
