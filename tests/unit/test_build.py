"""The build identity (harness.build): the commit from the image's file, else from the git
checkout's files (no git process), else the plain version; shown by ``harness --version``
and as ``harness_build_info`` on /metrics."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from harness.build import BUILD_COMMIT_FILE, BuildInfo, build_info, git_commit, read_build_info
from harness.observability import PrometheusSink

REPO = Path(__file__).resolve().parents[2]
SHA = "69414ae0c0ffee0123456789abcdef0123456789"


def git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": str(cwd), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def checkout(tmp_path: Path) -> tuple[Path, Path]:
    """A real git repository with one commit and a package directory in it."""
    repo = tmp_path / "repo"
    (repo / "harness").mkdir(parents=True)
    (repo / "harness" / "x.py").write_text("")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    return repo, repo / "harness"


def test_describe_shows_the_short_commit_or_the_plain_version() -> None:
    assert BuildInfo("0.1.0", SHA).describe() == "0.1.0 (commit 69414ae)"
    assert BuildInfo("0.1.0").describe() == "0.1.0"


def test_the_image_file_names_the_commit(tmp_path: Path) -> None:
    (tmp_path / BUILD_COMMIT_FILE).write_text(SHA + "\n")
    assert read_build_info(tmp_path, version="0.1.0") == BuildInfo("0.1.0", SHA)


@pytest.mark.parametrize("text", ["", "\n", "unknown", "ghp_abcdefABCDEF0123456789", "69414ae; rm -rf /", "abc"])
def test_a_file_that_holds_no_commit_id_is_ignored(tmp_path: Path, text: str) -> None:
    """An image built without REVISION writes an empty file; anything but hex is never shown."""
    (tmp_path / BUILD_COMMIT_FILE).write_text(text)
    assert read_build_info(tmp_path, version="0.1.0") == BuildInfo("0.1.0", None)


def test_a_git_checkout_gives_its_head_read_from_files(tmp_path: Path) -> None:
    repo, package = checkout(tmp_path)
    head = git(repo, "rev-parse", "HEAD")
    assert read_build_info(package, version="0.1.0") == BuildInfo("0.1.0", head)
    git(repo, "pack-refs", "--all")  # the branch only in packed-refs now
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert git_commit(repo) == head
    git(repo, "checkout", "-q", "--detach")
    assert git_commit(repo) == head
    # A worktree: .git is a file naming its git directory; the branch lives in the common one.
    git(repo, "checkout", "-q", "main")
    git(repo, "worktree", "add", "-q", "-b", "other", str(tmp_path / "wt"))
    (tmp_path / "wt" / "y").write_text("")
    git(tmp_path / "wt", "add", "y")
    git(tmp_path / "wt", "commit", "-q", "-m", "two")
    assert git_commit(tmp_path / "wt") == git(tmp_path / "wt", "rev-parse", "HEAD") != head
    # The image's file wins over git.
    (package / BUILD_COMMIT_FILE).write_text(SHA)
    assert read_build_info(package, version="0.1.0").commit == SHA


def test_no_git_no_file_is_the_plain_version(tmp_path: Path) -> None:
    """A site-packages install: no file, no .git beside the package; nothing searched above it."""
    outer = tmp_path / "project"
    (outer / "venv" / "site-packages" / "harness").mkdir(parents=True)
    (outer / ".git").mkdir()
    (outer / ".git" / "HEAD").write_text(SHA + "\n")
    assert read_build_info(outer / "venv" / "site-packages" / "harness", version="0.1.0") == BuildInfo("0.1.0")


def test_a_branch_name_or_remote_never_shows(tmp_path: Path) -> None:
    repo, package = checkout(tmp_path)
    git(repo, "checkout", "-q", "-b", "secret-token-branch")
    git(repo, "remote", "add", "origin", "https://user:tok3n@example.com/r.git")
    info = read_build_info(package, version="0.1.0")
    assert info.commit == git(repo, "rev-parse", "HEAD")
    assert "secret" not in repr(info) and "tok3n" not in repr(info)


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="the tests do not run from a git checkout")
def test_this_checkout_and_the_version_command_name_the_head_commit(tmp_path: Path) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    assert build_info().commit == head
    # `harness --version` reads files only: a git on PATH that leaves a mark is never run.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(f"#!/bin/sh\ntouch {tmp_path}/git-ran\nexit 1\n")
    (bin_dir / "git").chmod(0o755)
    out = subprocess.run([sys.executable, "-m", "harness", "--version"], cwd=tmp_path, capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(REPO), "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert out.stdout == f"harness {build_info().version} (commit {head[:7]})\n"
    assert not (tmp_path / "git-ran").exists()


def test_prometheus_exposes_build_info() -> None:
    sink = PrometheusSink()
    text = generate_latest(sink.registry).decode()
    [sample] = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "harness_build_info"]
    assert sample.value == 1.0
    assert sample.labels == {"version": build_info().version, "commit": build_info().commit or ""}
