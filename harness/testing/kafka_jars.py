"""The Apache Kafka broker jars, resolved from Maven Central once and cached.

:func:`ensure_jars` runs ``mvn -q -B -f <pom> dependency:copy-dependencies`` into
``~/.cache/harness/kafka-<KAFKA_VERSION>/libs``; a ``.complete`` marker makes later calls
free, and a file lock lets concurrent callers (test workers, CI steps) share one fetch.
The pom is ``tools/kafka/pom.xml`` in a source tree, or the copy shipped in the wheel.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KAFKA_VERSION", "JarProgress", "KafkaLaunchError", "ensure_jars", "find_pom"]

#: Apache Kafka version resolved from Maven Central (``org.apache.kafka:kafka_2.13``).
KAFKA_VERSION = "4.1.1"

_MARKER = ".complete"


class KafkaLaunchError(RuntimeError):
    """Resolving the broker jars or starting the broker failed.

    ``summary``: one line saying what went wrong and what to do, when the cause is a
    known one (the message itself carries the broker's logs).
    """

    def __init__(self, message: str, *, summary: str | None = None) -> None:
        super().__init__(message)
        self.summary = summary


# --------------------------------------------------------------------------- jars


def find_pom() -> Path:
    """Locate ``tools/kafka/pom.xml`` in the source tree that holds this package.

    Raises:
        KafkaLaunchError: the package is not inside a source checkout.
    """
    packaged = Path(__file__).resolve().parent / "kafka" / "pom.xml"  # force-included in the wheel
    if packaged.is_file():
        return packaged
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "tools" / "kafka" / "pom.xml"
        if candidate.is_file():
            return candidate
    raise KafkaLaunchError(
        "tools/kafka/pom.xml not found above the harness package; use a source checkout "
        "(editable install) or pass pom= to ensure_jars()"
    )


def _libs_complete(libs: Path) -> bool:
    marker = libs / _MARKER
    if not marker.is_file():
        return False
    names = [n for n in marker.read_text().split() if n.endswith(".jar")]
    return bool(names) and all((libs / n).is_file() for n in names)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_DOWNLOADING = re.compile(r"Downloading from [^:]+: (\S+)")
_DOWNLOADED = re.compile(r"Downloaded from [^:]+: (\S+) \(([\d.,]+) ([kMG]?B)")
_UNITS = {"B": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9}


@dataclass
class JarProgress:
    """What Maven did so far, read from its output lines (``feed``) and the jars copied."""

    downloading: int = 0
    downloaded: int = 0
    bytes: float = 0.0
    copied: int = 0

    def feed(self, line: str) -> bool:
        """Count one line of Maven's output; True if it changed the progress."""
        if m := _DOWNLOADED.search(line):
            self.downloaded += 1
            self.bytes += float(m.group(2).replace(",", "")) * _UNITS.get(m.group(3), 1.0)
            return True
        if _DOWNLOADING.search(line):
            self.downloading += 1
            return True
        return False

    def text(self) -> str:
        parts = []
        if self.downloading or self.downloaded:
            parts.append(f"downloaded {self.downloaded}/{max(self.downloading, self.downloaded)} files "
                         f"({self.bytes / 1e6:.1f} MB)")
        if self.copied:
            parts.append(f"{self.copied} jars in place")
        return ", ".join(parts) or "resolving"


def _run_with_progress(cmd: list[str], out_dir: Path, progress: Callable[[str], None]) -> tuple[int, str]:
    """Run Maven, reporting progress as it downloads and copies; (exit code, output tail)."""
    state = JarProgress()
    lines: list[str] = []
    changed = threading.Event()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            del lines[:-200]
            if state.feed(line):
                changed.set()

    reader = threading.Thread(target=read, name="mvn-output", daemon=True)
    reader.start()
    shown = ""
    while True:
        done = proc.poll() is not None
        copied = sum(1 for _ in out_dir.glob("*.jar"))
        if copied != state.copied:
            state.copied = copied
            changed.set()
        if changed.is_set():
            changed.clear()
            if state.text() != shown:
                shown = state.text()
                progress(shown)
        if done:
            break
        time.sleep(0.2)
    reader.join(10)
    return proc.returncode, "".join(lines)[-4000:]


def ensure_jars(
    cache_dir: Path | None = None,
    *,
    version: str = KAFKA_VERSION,
    pom: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Return the directory holding the broker's runtime jars, fetching them if needed.

    Args:
        cache_dir: Cache root, default ``~/.cache/harness``; jars go to
            ``<cache_dir>/kafka-<version>/libs``.
        version: Kafka version (``-Dkafka.version`` for the pom).
        pom: The resolver pom, default :func:`find_pom`.
        progress: called with a short text (files downloaded, MB, jars in place) as
            Maven works, when the jars are not cached yet.

    Returns:
        The ``libs`` directory. A no-op once its ``.complete`` marker exists; concurrent
        callers serialise on a file lock.

    Raises:
        KafkaLaunchError: ``mvn`` is missing or failed.
    """
    root = (
        Path(cache_dir).expanduser()
        if cache_dir
        else Path.home() / ".cache" / "harness"
    )
    base = root / f"kafka-{version}"
    libs = base / "libs"
    if _libs_complete(libs):
        return libs
    locked = contextlib.ExitStack()
    try:
        base.mkdir(parents=True, exist_ok=True)
        locked.enter_context(_file_lock(base / ".lock"))
    except OSError as exc:  # (a file where the folder goes, a folder this user may not write)
        reason = "not a directory" if isinstance(exc, FileExistsError | NotADirectoryError) else exc.strerror or str(exc)
        raise KafkaLaunchError(f"cannot make the jar cache {base}: {exc}",
                               summary=f"cannot use {root} as the jar cache ({reason}): give another --cache-dir"
                               ) from None
    with locked:
        if _libs_complete(libs):
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise KafkaLaunchError(
                "`mvn` not found on PATH (needed once to fetch Kafka jars)"
            )
        tmp = Path(tempfile.mkdtemp(prefix="libs.", dir=base))
        try:
            cmd = [
                mvn,
                "-q" if progress is None else "-Dstyle.color=never",
                "-B",
                "-f",
                str(pom or find_pom()),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={tmp}",
                f"-Dkafka.version={version}",
            ]
            if progress is None:
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                code, out = proc.returncode, (proc.stdout + proc.stderr)[-4000:]
            else:
                code, out = _run_with_progress(cmd, tmp, progress)
            if code != 0:
                raise KafkaLaunchError(
                    f"{' '.join(cmd)} failed ({code}):\n{out}"
                )
            jars = sorted(p.name for p in tmp.glob("*.jar"))
            if f"kafka_2.13-{version}.jar" not in jars:
                raise KafkaLaunchError(f"maven produced no kafka_2.13-{version}.jar")
            (tmp / _MARKER).write_text("\n".join(jars) + "\n")
            if libs.exists():
                shutil.rmtree(libs)
            tmp.rename(libs)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return libs


# --------------------------------------------------------------------------- helpers


