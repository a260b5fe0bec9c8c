"""The Apache Kafka broker jars, resolved from Maven Central once and cached.

:func:`ensure_jars` runs ``mvn -q -B -f <pom> dependency:copy-dependencies`` into
``~/.cache/harness/kafka-<KAFKA_VERSION>/libs``; a ``.complete`` marker makes later calls
free, and a file lock lets concurrent callers (test workers, CI steps) share one fetch.
The pom is ``tools/kafka/pom.xml`` in a source tree, or the copy shipped in the wheel.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["KAFKA_VERSION", "KafkaLaunchError", "ensure_jars", "find_pom"]

#: Apache Kafka version resolved from Maven Central (``org.apache.kafka:kafka_2.13``).
KAFKA_VERSION = "4.1.1"

_MARKER = ".complete"


class KafkaLaunchError(RuntimeError):
    """Resolving the broker jars or starting the broker failed."""


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


def ensure_jars(
    cache_dir: Path | None = None,
    *,
    version: str = KAFKA_VERSION,
    pom: Path | None = None,
) -> Path:
    """Return the directory holding the broker's runtime jars, fetching them if needed.

    Args:
        cache_dir: Cache root, default ``~/.cache/harness``; jars go to
            ``<cache_dir>/kafka-<version>/libs``.
        version: Kafka version (``-Dkafka.version`` for the pom).
        pom: The resolver pom, default :func:`find_pom`.

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
    base.mkdir(parents=True, exist_ok=True)
    with _file_lock(base / ".lock"):
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
                "-q",
                "-B",
                "-f",
                str(pom or find_pom()),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={tmp}",
                f"-Dkafka.version={version}",
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                out = (proc.stdout + proc.stderr)[-4000:]
                raise KafkaLaunchError(
                    f"{' '.join(cmd)} failed ({proc.returncode}):\n{out}"
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


