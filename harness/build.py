"""Which build a process runs: the package version and, when known, the source commit.

Two releases of one version (``0.1.0`` from two commits) are told apart by the commit.
It comes from, in order:

1. ``harness/_build_commit.txt``, written by the image build (the Containerfile's
   ``REVISION`` build argument, also its ``org.opencontainers.image.revision`` label) and
   installed with the package;
2. a git checkout the package is imported from (an editable install): ``.git/HEAD`` and
   the ref it names are read as files, never by running git, so a command's start pays a
   few small reads, and only when something asks (``--version``, ``/metrics``, ``/healthz``);
3. nothing: the plain version.

Only a commit id (hex) is ever read or shown: never a branch name nor a remote's URL
(which may hold a token). A value that is not a commit id is ignored.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BUILD_COMMIT_FILE", "BuildInfo", "build_info", "read_build_info"]

BUILD_COMMIT_FILE = "_build_commit.txt"
"""Its name in the package directory (the Containerfile writes it; .gitignore keeps it out of git)."""

PACKAGE_DIR = Path(__file__).resolve().parent
_COMMIT = re.compile(r"[0-9a-f]{7,64}")  # SHA-1 or SHA-256 object names, abbreviated or full
SHORT = 7


@dataclass(frozen=True)
class BuildInfo:
    """A build's identity: ``version`` (the package's) and ``commit`` (full hex, or None)."""

    version: str
    commit: str | None = None

    def describe(self) -> str:
        """``0.1.0 (commit 69414ae)``, or ``0.1.0`` when the commit is unknown."""
        if self.commit is None:
            return self.version
        return f"{self.version} (commit {self.commit[:SHORT]})"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("durable-harness")
    except PackageNotFoundError:  # pragma: no cover - a source tree that is not installed
        return "unknown"


def _commit_id(text: str) -> str | None:
    text = text.strip().lower()
    return text if _COMMIT.fullmatch(text) else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def _git_dir(checkout: Path) -> Path | None:
    """The git directory of ``checkout``: ``.git`` itself, or where a worktree's ``.git`` file points."""
    dot_git = checkout / ".git"
    if dot_git.is_dir():
        return dot_git
    text = _read(dot_git)
    if text is None or not text.startswith("gitdir:"):
        return None
    target = Path(text[len("gitdir:"):].strip())
    return target if target.is_absolute() else (checkout / target)


def git_commit(checkout: Path) -> str | None:
    """The commit checked out in ``checkout`` (a directory holding ``.git``), read from files.

    Follows ``HEAD`` (a commit id, or ``ref: refs/heads/...``) to the loose ref file, then to
    ``packed-refs``; a worktree's refs live in its ``commondir``. None when anything is missing.
    """
    git_dir = _git_dir(checkout)
    if git_dir is None:
        return None
    head = _read(git_dir / "HEAD")
    if head is None:
        return None
    head = head.strip()
    if not head.startswith("ref:"):
        return _commit_id(head)  # a detached HEAD
    ref = head[len("ref:"):].strip()
    if not ref.startswith("refs/") or ".." in ref.split("/"):
        return None
    common = _read(git_dir / "commondir")
    dirs = [git_dir]
    if common is not None:
        base = Path(common.strip())
        dirs.append(base if base.is_absolute() else git_dir / base)
    for d in dirs:
        loose = _read(d / ref)
        if loose is not None:
            return _commit_id(loose)
    for d in dirs:
        packed = _read(d / "packed-refs")
        for line in (packed or "").splitlines():
            sha, _, name = line.partition(" ")
            if name.strip() == ref:
                return _commit_id(sha)
    return None


def read_build_info(package_dir: Path = PACKAGE_DIR, *, version: str | None = None) -> BuildInfo:
    """The build of the package in ``package_dir`` (uncached; :func:`build_info` caches it)."""
    version = _version() if version is None else version
    baked = _read(package_dir / BUILD_COMMIT_FILE)
    if baked is not None and _commit_id(baked) is not None:
        return BuildInfo(version, _commit_id(baked))
    # Only the package's own checkout: no search upwards, which could name another repository's
    # commit (a virtualenv inside some project's tree).
    return BuildInfo(version, git_commit(package_dir.parent))


@functools.cache
def build_info() -> BuildInfo:
    """This process's build (read once)."""
    return read_build_info()
