"""A real single-node Apache Kafka broker (KRaft, combined broker+controller) for tests.

The broker jars come from Maven Central: :func:`ensure_jars` runs
``mvn -q -B -f tools/kafka/pom.xml dependency:copy-dependencies`` once into
``~/.cache/harness/kafka-<KAFKA_VERSION>/libs``; a ``.complete`` marker makes later calls
free. The pom lives in the source tree at ``tools/kafka/pom.xml`` and is found by walking
up from this file (pass ``pom=`` for other layouts).

:class:`LocalKafka` formats a KRaft data dir and runs ``java -cp '<libs>/*' kafka.Kafka``
in its own process group::

    with LocalKafka() as kafka:
        use(kafka.bootstrap)  # "127.0.0.1:<port>"
        kafka.restart()  # same ports, same data dir, data kept

:func:`main` backs ``harness kafka-local [--port N] [--data-dir D]``.

Only the standard library is imported at module level; ``confluent_kafka`` is imported
lazily, when installed, to confirm readiness with a metadata request.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Self

from harness.testing.kafka_jars import KAFKA_VERSION, KafkaLaunchError, ensure_jars, find_pom

__all__ = [
    "KAFKA_VERSION",
    "KafkaLaunchError",
    "LocalKafka",
    "ensure_jars",
    "find_pom",
    "main",
]

# Logged at INFO by kafka.server.KafkaRaftServer once BrokerServer.startup() returned,
# which in KRaft mode happens only after the broker is registered and unfenced.
_READY_LINE = "Kafka Server started"
# Held (flock) by the process that runs a broker on a data dir; see LocalKafka._lock_data_dir.
_DATA_DIR_LOCK = "harness-kafka-local.lock"
_JVM_OPTS = (
    "-Xms256m",
    "-Xmx1g",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
    # Otherwise log4j2 prints "Unable to register Log4j shutdown hook" on SIGTERM.
    "-Dlog4j2.shutdownHookEnabled=false",
)


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def sized_for(cores: int) -> tuple[dict[str, int], tuple[str, ...]]:
    """The broker's thread counts and garbage collector for a machine of ``cores`` cores.

    Kafka's defaults (3 network and 8 I/O threads, G1) suit a broker with cores of its
    own. A local broker shares a few cores with the workers and clients that use it:
    on 2 cores, 1 network and 2 I/O threads and the parallel collector (no concurrent GC
    threads competing for the same cores, cheaper write barriers) cost ~28% less broker
    CPU per turn than 2 + 4 threads and G1 (``bench/e2e.py``'s deployed path, two
    brokers side by side in alternating windows: docs/architecture.md). With more cores
    the counts grow with them and G1 keeps its pauses short on a bigger heap's work.
    """
    cores = max(1, cores)
    threads = {"num.network.threads": max(1, cores // 2), "num.io.threads": max(2, cores)}
    if cores <= 2:
        return threads, ("-XX:+UseParallelGC",)
    return threads, ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20")


_QUICK_START_JVM_OPTS = (
    # C1 only: the broker starts in ~2.5 s instead of ~3.4 s, and a short-lived broker
    # (a test's) never runs long enough to earn back C2's compiling. A broker that runs
    # for minutes under load costs ~40% less CPU per request with C2 once compiled
    # (bench/e2e.py: ~3.5 against ~5.5 ms of broker CPU per turn), as a deployed one runs.
    "-XX:TieredStopAtLevel=1",
)

_LOG4J2 = """\
status = warn
name = harness-kafka-local
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = FILE
logger.raft.name = kafka.server.KafkaRaftServer
logger.raft.level = info
"""



def _free_port(exclude: tuple[int, ...] = ()) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in exclude:
            return port


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _random_cluster_id() -> str:
    # Same text form as org.apache.kafka.common.Uuid; Kafka never issues a leading '-'.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _death_signal_preexec() -> Callable[[], None] | None:
    """Build a preexec_fn that SIGKILLs the broker when its parent dies (Linux only).

    Without it a SIGKILLed pytest leaves a JVM behind. ctypes is loaded here, in the
    parent, so the forked child makes one libc call and touches no lock. Only from the
    main thread, since PR_SET_PDEATHSIG fires when the *thread* that forked exits.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig, sig = 1, int(signal.SIGKILL)

    def _preexec() -> None:  # pragma: no cover - runs in the child
        prctl(pr_set_pdeathsig, sig, 0, 0, 0)

    return _preexec


# --------------------------------------------------------------------------- broker


class LocalKafka:
    """A real single-node KRaft Kafka broker running as a child JVM.

    Args:
        port: PLAINTEXT port on 127.0.0.1; default a free one (kept across restarts).
        data_dir: Holds ``server.properties``, ``kafka-logs/``, ``server.log`` (WARN+) and
            ``broker.out``. Default: a temp dir deleted by :meth:`close`. A given dir is
            kept; starting on an already formatted dir keeps topics and offsets.
        cache_dir: Jar cache root for :func:`ensure_jars`.
        startup_timeout: Seconds to wait for the broker to serve requests.
        overrides: Extra or overriding broker properties.
        jvm_opts: Extra JVM arguments, appended after the defaults.
        quick_start: start fast with the C1 compiler only (tests); False runs the JVM's
            full JIT, as a deployed broker does (``harness kafka-local``, benchmarks).
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: Path | None = None,
        cache_dir: Path | None = None,
        startup_timeout: float = 120.0,
        overrides: Mapping[str, object] | None = None,
        jvm_opts: Sequence[str] = (),
        quick_start: bool = True,
    ) -> None:
        self.port = port
        self.controller_port: int | None = None
        self._own_data_dir = data_dir is None
        self.data_dir = Path(data_dir).expanduser().resolve() if data_dir else None
        self.cache_dir = cache_dir
        self.startup_timeout = startup_timeout
        self.overrides = dict(overrides or {})
        self._threads, gc = sized_for(machine_cores())
        if any(opt.startswith("-XX:+Use") and opt.endswith("GC") for opt in jvm_opts):
            gc = ()  # the caller chose a collector: two would stop the JVM at start
        self.jvm_opts = (*gc, *(_QUICK_START_JVM_OPTS if quick_start else ()), *jvm_opts)
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None
        self._lock_fd: int | None = None

    @property
    def bootstrap(self) -> str:
        """``"127.0.0.1:<port>"`` for ``bootstrap.servers``."""
        if self.port is None:
            raise KafkaLaunchError("broker not started")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID (and process group id) of the broker JVM, if started."""
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        """Whether the broker process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_file(self) -> Path:
        """The broker's log4j2 log (WARN and above, plus the ready line)."""
        if self.data_dir is None:
            raise KafkaLaunchError("broker not started")
        return self.data_dir / "server.log"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _config(self, data_dir: Path) -> dict[str, object]:
        cfg: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": 1,
            # A static voter set (not --standalone) so the controller port may differ
            # between runs on the same data dir (e.g. `kafka-local --data-dir`).
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(data_dir / "kafka-logs"),
            "num.partitions": 1,
            "default.replication.factor": 1,
            "min.insync.replicas": 1,
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": 1,
            # 1 partition instead of 50: the first group join / init_transactions
            # creates these topics, and one partition loads much faster.
            "offsets.topic.num.partitions": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 1,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            **self._threads,
            "num.recovery.threads.per.data.dir": 1,
        }
        cfg.update(self.overrides)
        return cfg

    def _java_cmd(
        self, libs: Path, log4j: Path, main_class: str, *args: str
    ) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise KafkaLaunchError("`java` (17+) not found on PATH")
        return [
            java,
            *_JVM_OPTS,
            *self.jvm_opts,
            f"-Dlog4j2.configurationFile={log4j}",
            f"-Dkafka.logs.dir={log4j.parent}",
            "-cp",
            str(libs / "*"),
            main_class,
            *args,
        ]

    def start(self) -> Self:
        """Format the data dir (first time only), start the broker, wait until ready.

        Returns:
            ``self``.

        Raises:
            KafkaLaunchError: the broker exited or was not ready in ``startup_timeout``;
                the message holds the tail of its logs.
        """
        if self.running:
            return self
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="harness-kafka-"))
        data_dir = self.data_dir
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            reason = "not a directory" if isinstance(exc, (FileExistsError, NotADirectoryError)) else exc.strerror or str(exc)
            raise KafkaLaunchError(f"cannot make the data dir {data_dir}: {exc}",
                                   summary=f"cannot use {data_dir} as the data dir ({reason}): give "
                                   "another --data-dir") from None
        self._lock_data_dir(data_dir)
        try:
            self._start_locked(data_dir)
        except BaseException:
            self.stop()
            raise
        return self

    def _lock_data_dir(self, data_dir: Path) -> None:
        """Hold an exclusive lock on the data dir before touching anything in it.

        Kafka's own ``.lock`` is taken only after the broker has begun reading its
        metadata log, so a second broker on the same dir used to read the first one's
        log mid-write and die on a "corrupt record". The lock's descriptor is inherited by
        the JVM, so it holds while either process lives.
        """
        if self._lock_fd is not None:
            return
        fd = os.open(data_dir / _DATA_DIR_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise KafkaLaunchError(
                f"the data dir {data_dir} is locked ({_DATA_DIR_LOCK})",
                summary=self._dir_in_use(),
            ) from None
        self._lock_fd = fd

    def _start_locked(self, data_dir: Path) -> None:
        libs = ensure_jars(self.cache_dir)
        if self.port is None:
            self.port = _free_port()
        if self.controller_port is None:
            self.controller_port = _free_port(exclude=(self.port,))
        props = data_dir / "server.properties"
        props.write_text(
            "".join(f"{k}={v}\n" for k, v in self._config(data_dir).items())
        )
        log4j = data_dir / "log4j2.properties"
        log4j.write_text(_LOG4J2.format(log=self.log_file))

        if not (data_dir / "kafka-logs" / "meta.properties").is_file():
            fmt = subprocess.run(
                self._java_cmd(
                    libs,
                    log4j,
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    _random_cluster_id(),
                    "-c",
                    str(props),
                    "--ignore-formatted",
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                check=False,
            )
            if fmt.returncode != 0:
                out = fmt.stdout.decode(errors="replace")[-4000:]
                raise KafkaLaunchError(f"kafka storage format failed:\n{out}")

        log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        # Kept open for the broker's lifetime; closed in stop().
        self._out = open(data_dir / "broker.out", "ab")  # noqa: SIM115
        self._proc = subprocess.Popen(
            self._java_cmd(libs, log4j, "kafka.Kafka", str(props)),
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=data_dir,
            start_new_session=True,
            preexec_fn=_death_signal_preexec(),
            pass_fds=(self._lock_fd,) if self._lock_fd is not None else (),
        )
        self._wait_ready(log_offset)

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_file, "rb") as fh:
                fh.seek(offset)
                return fh.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def _failure(self, what: str, log_offset: int) -> KafkaLaunchError:
        out = ""
        with contextlib.suppress(OSError):
            out = self.log_file.with_name("broker.out").read_text(errors="replace")[
                -3000:
            ]
        log = self._log_since(log_offset)[-5000:]
        return KafkaLaunchError(
            f"{what}\n--- server.log ---\n{log}\n--- broker.out ---\n{out}", summary=self._known_cause(log + out)
        )

    def _known_cause(self, text: str) -> str | None:
        """One line for the start failures a user causes (a port or a data dir in use)."""
        if "Address already in use" in text:
            return f"port {self.port} is in use (another broker?): give another --port, or none for a free one"
        if "Failed to acquire lock on file .lock" in text:
            return self._dir_in_use()
        return None

    def _dir_in_use(self) -> str:
        return (f"the data dir {self.data_dir} is in use by another broker: stop that one, or give another "
                "--data-dir")

    def _wait_ready(self, log_offset: int) -> None:
        assert self._proc is not None and self.port is not None
        deadline = time.monotonic() + self.startup_timeout
        while not (
            _READY_LINE in self._log_since(log_offset) and _port_open(self.port)
        ):
            if self._proc.poll() is not None:
                raise self._failure(
                    f"kafka exited with {self._proc.returncode}", log_offset
                )
            if time.monotonic() > deadline:
                raise self._failure(
                    f"kafka not ready in {self.startup_timeout}s", log_offset
                )
            time.sleep(0.1)
        self._confirm_metadata(deadline)

    def _confirm_metadata(self, deadline: float) -> None:
        """When confluent_kafka is installed, require a metadata response naming node 1."""
        try:
            from confluent_kafka import KafkaException
            from confluent_kafka.admin import AdminClient
        except ImportError:
            return
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if 1 in admin.list_topics(timeout=5).brokers:
                    return
            except KafkaException as exc:
                last = exc
            time.sleep(0.2)
        raise KafkaLaunchError(f"kafka metadata not available: {last}")

    def warm_up_transactions(self, timeout: float = 60.0) -> None:
        """Block until the transaction coordinator serves InitProducerId.

        The first ``init_transactions`` after a (re)start otherwise pays for creating or
        loading ``__transaction_state`` (~1 s, "Coordinator load in progress" retries).
        Needs ``confluent_kafka``.
        """
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": f"harness-warmup-{uuid.uuid4().hex}",
                "log_level": 0,
            }
        )
        producer.init_transactions(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the broker's process group; SIGKILL after ``timeout`` seconds.

        The data dir is kept, so :meth:`start` brings the same broker back.
        """
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._out is not None:
            self._out.close()
            self._out = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # the JVM's inherited copy closed when it exited
            self._lock_fd = None

    def kill(self) -> None:
        """SIGKILL the broker (crash); the data dir is kept for a later :meth:`start`."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        self.stop()

    def restart(self, timeout: float = 30.0) -> Self:
        """Stop (see :meth:`stop`) and start again on the same ports and data dir."""
        self.stop(timeout=timeout)
        return self.start()

    def close(self) -> None:
        """Stop; delete the data dir if it is a temp dir this object created."""
        self.stop()
        if self._own_data_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None


# --------------------------------------------------------------------------- CLI


def _port(text: str) -> int:
    """``--port``: a TCP port a broker can listen on."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: give a number from 1 to 65535") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {port}: give a number from 1 to 65535")
    return port


def main(argv: list[str] | None = None) -> int:
    """Run ``harness kafka-local`` until SIGTERM/SIGINT.

    Prints ``bootstrap=127.0.0.1:<port>`` once the broker is ready.

    Returns:
        0 after a clean stop, 1 if the broker failed to start or died.
    """
    # (lazily: this module imports only the stdlib)
    from harness.cli.common import CommandParser, positive_float

    parser = CommandParser(
        prog="harness kafka-local",
        description=f"Run a local single-node Apache Kafka {KAFKA_VERSION} broker (KRaft) until Ctrl-C. "
        "The first run fetches the broker's jars from Maven Central (needs Java 17+ and mvn) into the "
        "cache; it prints bootstrap=127.0.0.1:<port> once the broker serves.",
        example="  harness kafka-local --port 9092 --data-dir ~/.cache/harness/broker",
    )
    parser.add_argument(
        "--port", type=_port, default=None, help="PLAINTEXT port, 1-65535 (default: free)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="data dir, kept across runs (default: temp dir deleted on exit)",
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="jar cache root")
    parser.add_argument(
        "--startup-timeout", type=positive_float("--startup-timeout"), default=120.0, metavar="SECONDS",
        help="give up if the broker does not serve requests within this long (default: 120; the first run's "
        "jar download is not counted)",
    )
    args = parser.parse_args(argv)

    # A plain flag: a signal handler must take no lock. ``threading.Event.set`` takes the
    # event's lock, which the main thread itself holds for a moment in each
    # ``Event.wait``; a signal landing then (likely right after ``bootstrap=`` is printed,
    # when the caller sends SIGTERM) deadlocked the process for good.
    stopping: list[int] = []

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    broker = LocalKafka(
        port=args.port,
        data_dir=args.data_dir,
        cache_dir=args.cache_dir,
        startup_timeout=args.startup_timeout,
        quick_start=False,  # a broker people run for a while: the full JIT
    )
    try:
        try:
            report = _JarReport(sys.stderr)
            report.finish(ensure_jars(args.cache_dir, progress=report))
            print(f"kafka-local: starting Apache Kafka {KAFKA_VERSION} (KRaft) ...", file=sys.stderr, flush=True)
            broker.start()
        except KafkaLaunchError as exc:
            text = exc.summary if exc.summary is not None and not args.debug else str(exc)
            print(f"kafka-local: {text}", file=sys.stderr, flush=True)
            return 1
        if stopping:  # signalled while starting
            return 0
        print(f"bootstrap={broker.bootstrap}", flush=True)
        while not stopping:
            time.sleep(0.2)  # a signal ends the sleep at once and runs the handler
            if not stopping and not broker.running:
                print(
                    "kafka-local: broker exited unexpectedly",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
        return 0
    finally:
        broker.close()
        for sig, handler in old.items():
            signal.signal(sig, handler)


class _JarReport:
    """Reports the first fetch of the jars: one line redrawn on a terminal, else a line
    per change (at most one a second), and the last state once it is done."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._last = 0.0
        self.text = ""

    def __call__(self, text: str) -> None:
        if not self.text:
            print(f"kafka-local: fetching the Apache Kafka {KAFKA_VERSION} jars with Maven (first run only) ...",
                  file=self._stream, flush=True)
        self.text = text
        if self._tty:
            self._stream.write(f"\r\x1b[2Kkafka-local: jars: {text}")
            self._stream.flush()
            return
        now = time.monotonic()
        if now - self._last >= 1.0:
            self._last = now
            print(f"kafka-local: jars: {text}", file=self._stream, flush=True)

    def finish(self, libs: Path) -> None:
        if not self.text:
            return  # cached: nothing was fetched
        if self._tty:
            self._stream.write("\r\x1b[2K")
        print(f"kafka-local: jars: {self.text}; ready in {libs}", file=self._stream, flush=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
