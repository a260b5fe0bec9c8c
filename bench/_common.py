"""What the Kafka benchmarks share: a broker, realistic session records, a bulk
filler, worker processes, and markdown tables.

Not a library: imported by the scripts in ``bench/`` only (run them from the repo
root, e.g. ``python bench/rebuild.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/x.py` puts bench/ first, not the repo root
    sys.path.insert(0, str(ROOT))

from harness.codec import default_codec  # noqa: E402
from harness.ids import RECORD_TYPE_HEADER, message_key  # noqa: E402
from harness.records import (  # noqa: E402
    AskOpened,
    InputMessage,
    InputSettled,
    ModelResponseRecord,
    Record,
    StepResult,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)

APP = "bench.apps:bench"
HARNESS_NAME = "bench/app"
APPROVAL_SCHEMA = {
    "properties": {"approved": {"title": "Approved", "type": "boolean"}},
    "required": ["approved"],
    "title": "Approval",
    "type": "object",
}


# --- numbers and tables ----------------------------------------------------------------


def pct(samples: Sequence[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table; floats get 3 significant decimals, the first column is left aligned."""
    cells = [[str(h) for h in header]]
    for row in rows:
        cells.append([f"{c:,.3f}" if isinstance(c, float) else (f"{c:,}" if isinstance(c, int) else str(c))
                      for c in row])
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = []
    for n, row in enumerate(cells):
        out.append("| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                     for i, (c, w) in enumerate(zip(row, widths, strict=True))) + " |")
        if n == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


# --- a broker ----------------------------------------------------------------------------


def require_broker(bootstrap: str, *, timeout: float = 5.0) -> None:
    """Return once a Kafka broker answers at ``bootstrap``; else stop the run with one line."""
    from harness.errors import LogUnavailable
    from harness.log.kafka.config import KafkaSettings
    from harness.log.kafka.topics import probe

    try:
        probe(KafkaSettings(bootstrap), timeout=timeout)
    except LogUnavailable:
        raise SystemExit(
            f"{Path(sys.argv[0]).name}: no Kafka broker answered at {bootstrap} within {timeout:g} s: "
            "check the address (--bootstrap, HARNESS_KAFKA_BOOTSTRAP or --log), or leave --bootstrap out "
            "to start a local broker"
        ) from None


@contextlib.contextmanager
def broker(bootstrap: str | None, *, timeout: float = 5.0) -> Iterator[str]:
    """``bootstrap`` once a broker answers there (:func:`require_broker`), or a LocalKafka
    started (and warmed up) for the run."""
    if bootstrap:
        require_broker(bootstrap, timeout=timeout)
        yield bootstrap
        return
    from harness.testing.kafka_local import LocalKafka

    t0 = time.perf_counter()
    with LocalKafka(quick_start=False) as kafka:  # the full JIT, as a deployed broker runs
        kafka.warm_up_transactions()
        print(f"(started LocalKafka at {kafka.bootstrap} in {time.perf_counter() - t0:.1f}s)", flush=True)
        yield kafka.bootstrap


def add_bootstrap_option(parser: Any) -> None:
    """``--bootstrap``: a broker of the caller's, else :func:`broker` starts one."""
    parser.add_argument("--bootstrap", default=os.environ.get("HARNESS_KAFKA_BOOTSTRAP"),
                        help="a broker (default: $HARNESS_KAFKA_BOOTSTRAP, else a LocalKafka is started)")


def new_prefix(what: str) -> str:
    return f"bench{what}{uuid.uuid4().hex[:8]}"


def log_url(bootstrap: str, prefix: str, partitions: int) -> str:
    return f"kafka://{bootstrap}?topic_prefix={prefix}&partitions={partitions}"


# --- realistic records -------------------------------------------------------------------


def ended_session(session_id: str, ts: int) -> list[Record]:
    """One session with one finished turn, as a worker writes it (9 records): input,
    turn.started, model.response (a tool call), tool.started, step.result, tool.result,
    model.response (final text), turn.finished, input.settled."""
    input_id = f"in-{session_id}"
    call = {"id": "work", "name": "work", "arguments": {"steps": 1}}
    return [
        InputMessage(session_id, ts, input_id, "steps=1", HARNESS_NAME),
        TurnStarted(session_id, ts, input_id, 1),
        ModelResponseRecord(session_id, ts, 1, 0, "working on it", (call,)),
        ToolStarted(session_id, ts, "work", "work", 1),
        StepResult(session_id, ts, "work", "s0", 1),
        ToolResult(session_id, ts, "work", "work", {"steps": 1}),
        ModelResponseRecord(session_id, ts, 1, 1, "done", ()),
        TurnFinished(session_id, ts, input_id, 1, "completed", "done"),
        InputSettled(session_id, ts, input_id, "completed"),
    ]


def open_ask_session(session_id: str, ts: int) -> list[Record]:
    """One session whose turn is parked on an open ``step.ask`` (5 records): live work."""
    input_id = f"in-{session_id}"
    call = {"id": "approve", "name": "approve", "arguments": {"what": "ask=yes"}}
    return [
        InputMessage(session_id, ts, input_id, "ask=yes", HARNESS_NAME),
        TurnStarted(session_id, ts, input_id, 1),
        ModelResponseRecord(session_id, ts, 1, 0, "working on it", (call,)),
        ToolStarted(session_id, ts, "approve", "approve", 1),
        AskOpened(session_id, ts, "approve", "approval", "Approve ask=yes?", APPROVAL_SCHEMA),
    ]


def history(ended_records: int, live_sessions: int, tag: str) -> Iterator[Record]:
    """About ``ended_records`` records of ended sessions with ``live_sessions`` open-ask
    sessions spread evenly through them (so every part of the history holds live work)."""
    per = len(ended_session("x", 0))
    n_ended = max(1, ended_records // per)
    ts = int(time.time() * 1000)
    every = max(1, n_ended // max(1, live_sessions))
    live = 0
    for i in range(n_ended):
        if live < live_sessions and i % every == 0:
            yield from open_ask_session(f"{tag}-live-{live}", ts)
            live += 1
        yield from ended_session(f"{tag}-done-{i}", ts)
    while live < live_sessions:
        yield from open_ask_session(f"{tag}-live-{live}", ts)
        live += 1


def fill_partition(bootstrap: str, topic: str, partition: int, records: Iterable[Record],
                   *, per_transaction: int = 5000) -> int:
    """Produce ``records`` (encoded by the harness codec, keyed and typed as the log
    writes them) to one partition with a plain transactional producer; returns how many."""
    from confluent_kafka import Producer

    codec = default_codec()
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": f"bench-fill-{uuid.uuid4().hex[:8]}",
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        "enable.idempotence": True,
        "acks": "all",
    })
    producer.init_transactions(30)
    n = 0
    open_txn = False
    for record in records:
        if not open_txn:
            producer.begin_transaction()
            open_txn = True
        producer.produce(topic, value=codec.encode(record), key=message_key(record.session_id),
                         partition=partition, headers=[(RECORD_TYPE_HEADER, record.TYPE.encode())])
        n += 1
        if n % per_transaction == 0:
            producer.commit_transaction(60)
            open_txn = False
    if open_txn:
        producer.commit_transaction(60)
    return n


# --- worker processes ----------------------------------------------------------------------

_OWNING = re.compile(r"owning partition (\d+)")
_GAVE_UP = re.compile(r"gave up partition (\d+)")


def _log_time(line: str) -> float:
    """Epoch seconds of a worker log line (``%(asctime)s``: ``2026-01-02 03:04:05,678``), else now."""
    try:
        stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return time.time()
    return stamp.timestamp()


class WorkerProc:
    """``harness worker`` in a child process; its stderr is parsed for the partitions it owns.

    Its stderr goes to a file, as a deployed worker's does (a container runtime writes it to
    disk), read here by a thread that tails the file: a pipe read line by line by a busy
    bench process would fill up and block the worker's event loop on each log line.
    """

    def __init__(self, url: str, name: str, *, app: str = APP, log_level: str = "INFO",
                 profile: Path | None = None, env: Mapping[str, str] | None = None,
                 root: Path | None = None) -> None:
        """``env``: variables set for this worker only; ``root``: the checkout whose code
        (``harness`` and ``bench.apps``) it runs, this one by default."""
        root = ROOT if root is None else root
        env = {**os.environ, **(env or {}),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        self.name = name
        self.profile = profile
        runner = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
        self.err = tempfile.NamedTemporaryFile(mode="w", prefix=f"bench-{name}-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, *runner, "-m", "harness.cli", "worker", "--log", url, "--app", app,
             "--log-level", log_level],
            cwd=root, env=env, stdout=subprocess.PIPE, stderr=self.err, text=True,
        )
        self.owned: set[int] = set()
        self.events: list[tuple[str, int, float]] = []  # ("own" | "gave_up", partition, epoch s of the log line)
        self.ready = threading.Event()
        self.changed_at = time.monotonic()
        self.lines: list[str] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read_out, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("worker ready"):
                self.ready.set()

    def _err_lines(self) -> Iterator[str]:
        """The worker's stderr lines as they are written, until it exits and all are read."""
        with open(self.err.name, encoding="utf-8", errors="replace") as file:
            partial = ""
            while True:
                chunk = file.readline()
                if chunk:
                    partial += chunk
                    if partial.endswith("\n"):
                        yield partial
                        partial = ""
                elif self.proc.poll() is not None:
                    if partial:
                        yield partial
                    return
                else:
                    time.sleep(0.02)

    def _read_err(self) -> None:
        for line in self._err_lines():
            with self._lock:
                self.lines.append(line.rstrip())
                if len(self.lines) > 2000:
                    del self.lines[:1000]
                m = _OWNING.search(line)
                if m:
                    self.owned.add(int(m.group(1)))
                    self.events.append(("own", int(m.group(1)), _log_time(line)))
                    self.changed_at = time.monotonic()
                m = _GAVE_UP.search(line)
                if m:
                    self.owned.discard(int(m.group(1)))
                    self.events.append(("gave_up", int(m.group(1)), _log_time(line)))
                    self.changed_at = time.monotonic()

    def owns(self) -> set[int]:
        with self._lock:
            return set(self.owned)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 20.0) -> None:
        if self.alive:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait()
        self.err.close()  # (deletes it; the reader thread has it open until it has read all)

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the process used so far (Linux /proc)."""
        return process_cpu_seconds(self.proc.pid)

    def tail(self, n: int = 20) -> str:
        with self._lock:
            return "\n".join(self.lines[-n:])


class HarnessProc:
    """``harness ARGS`` in a child process (``harness serve``, ``harness gateway``...), started by
    :func:`start_harness`; stderr goes to a file (a pipe nobody reads would stall it)."""

    def __init__(self, args: Sequence[str], *, cwd: Path | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.args = list(args)
        self.err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.cli", *args], cwd=cwd or ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.lines: list[str] = []
        self.url = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def stderr(self) -> str:
        if self.err.closed:
            return ""
        self.err.seek(0)
        return str(self.err.read())

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.err.close()
        return self.proc.returncode


def start_harness(args: Sequence[str], *, ready: str, cwd: Path | None = None, timeout: float = 90) -> HarnessProc:
    """Start ``harness ARGS`` and wait for its stdout line starting with ``ready`` (its
    ``url=`` word becomes ``.url``), e.g. ``start_harness(["serve", ...], ready="serve ready")``."""
    out = HarnessProc(args, cwd=cwd)

    def is_ready() -> bool:
        if out.proc.poll() is not None:
            raise RuntimeError(f"harness {' '.join(args)} exited {out.proc.returncode}: {out.stderr()}")
        return any(line.startswith(ready) for line in out.lines)

    wait_until(is_ready, timeout, f"'{ready}' from harness {args[0]}")
    line = next(line for line in out.lines if line.startswith(ready))
    out.url = next((word[4:] for word in line.split() if word.startswith("url=")), "")
    return out


def process_cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this machine (Linux /proc), if visible."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(proc.name)
    return None


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of every CPU since boot (Linux /proc/stat); busy includes steal."""
    values = _cpu_jiffies()
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def machine_stolen() -> tuple[float, float]:
    """(steal, total) jiffies of every CPU since boot: time the hypervisor gave this
    machine's CPUs to another guest (a shared host's noisy neighbour)."""
    values = _cpu_jiffies()
    return (values[7] if len(values) > 7 else 0), sum(values)


def _cpu_jiffies() -> list[int]:
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


_PROBE_CODE = """
import sys, time
def unit():
    d = {}
    for i in range(25000):
        d[i %% 1000] = d.get(i %% 1000, 0) + i
while True:
    c0 = time.process_time(); unit(); c1 = time.process_time()
    print(f"{time.monotonic():.3f} {(c1 - c0) * 1000:.3f}", flush=True)
    time.sleep(%r)
"""


class SpeedProbe:
    """How fast this machine runs Python while a bench runs, to compare two runs.

    A shared machine's speed moves under a bench (on this project's CI kind, a fixed
    piece of work takes from 1x to 2x its fastest time, idle or loaded, in spells of
    a second to a minute; steal stays at 0). A child process does the same piece of
    pure-Python work (~2 ms) every ``period`` seconds and keeps the CPU time it took:
    CPU time, not wall time, so a busy machine's queueing does not count, only how
    fast the CPU ran it. :meth:`mean_ms` over a bench's window is that window's speed
    (higher: slower); two runs' throughputs compare only beside it. It costs ~2% of
    one core.
    """

    def __init__(self, period: float = 0.1) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", _PROBE_CODE % period], stdout=subprocess.PIPE, text=True)
        self._samples: list[tuple[float, float]] = []
        self._reader = threading.Thread(target=self._read, name="speed-probe", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            at, ms = line.split()
            self._samples.append((float(at), float(ms)))

    def mean_ms(self, start: float, end: float) -> float:
        """Mean CPU ms of the work unit between two ``time.monotonic()`` readings."""
        window = [ms for at, ms in list(self._samples) if start <= at <= end]
        return sum(window) / len(window) if window else float("nan")

    def fastest_ms(self) -> float:
        """The unit's 5th percentile CPU ms over the probe's whole life (the machine at speed)."""
        samples = sorted(ms for _at, ms in list(self._samples))
        return samples[len(samples) // 20] if samples else float("nan")

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait()


def jit_seconds(pid: int | None) -> float | None:
    """Seconds a local JVM (the broker) has spent compiling its code (``jstat -compiler``),
    or None where it cannot be read (no pid, no JDK tools, another user's JVM)."""
    if pid is None:
        return None
    try:
        out = subprocess.run(["jstat", "-compiler", str(pid)], capture_output=True, text=True, timeout=10)
        return float(out.stdout.splitlines()[1].split()[3])
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def jit_settled(elapsed: float, least: float, most: float, jit_share: float | None, *,
                below: float = 0.05) -> bool:
    """Whether a warm-up may stop: after ``least`` seconds once the broker's JIT took under
    ``below`` of its CPU in the last window (unknown: at ``least``), and at ``most`` anyway."""
    if elapsed >= most:
        return True
    return elapsed >= least and (jit_share is None or jit_share < below)


async def warm_broker(load: Any, broker_pid: int | None, *, least: float, most: float,
                      window: float = 5.0) -> dict[str, float | None]:
    """Run ``await load(seconds)`` in windows until the broker has compiled its hot code.

    A freshly started broker spends ~35 s of this load's CPU in its JIT (measured on the
    CI machine kind: a third of its CPU at first, under 5% after ~35 s; turns/s rises
    ~1.8x meanwhile), so a fixed warm-up measured a first run on a new broker ~20% below
    the next. Returns the seconds spent and the JIT's share of the broker's CPU in the
    last window (None: not measurable, the warm-up ran ``least`` seconds)."""
    started = time.monotonic()
    share: float | None = None
    while True:
        cpu0, jit0 = process_cpu_seconds(broker_pid) if broker_pid else float("nan"), jit_seconds(broker_pid)
        await load(window)
        cpu1, jit1 = process_cpu_seconds(broker_pid) if broker_pid else float("nan"), jit_seconds(broker_pid)
        share = (jit1 - jit0) / (cpu1 - cpu0) if jit0 is not None and jit1 is not None and cpu1 > cpu0 else None
        elapsed = time.monotonic() - started
        if jit_settled(elapsed, least, most, share):
            return {"seconds": elapsed, "jit_share": share}


def print_profile(path: Path, top: int, title: str) -> None:
    import pstats

    print(f"{title} (cProfile, by own time)")
    pstats.Stats(str(path)).sort_stats("tottime").print_stats(top)


def wait_until(predicate: Any, timeout: float, what: str, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def wait_settled_group(workers: Sequence[WorkerProc], partitions: int, *, quiet: float = 1.0,
                       timeout: float = 60.0) -> None:
    """Until the live workers own every partition between them, each one some, and no
    ownership changed for ``quiet`` seconds (the group finished rebalancing)."""
    def settled() -> bool:
        live = [w for w in workers if w.alive]
        owned = [w.owns() for w in live]
        if any(not o for o in owned) or sorted(p for o in owned for p in o) != list(range(partitions)):
            return False
        return time.monotonic() - max(w.changed_at for w in live) >= quiet
    wait_until(settled, timeout, "the worker group to settle")


# --- following the log -------------------------------------------------------------------


class Follower:
    """Tails every partition of a Kafka log; keeps ``(monotonic s, entry)`` of watched sessions.

    Use as ``async with Follower(klog, partitions) as f:``; ``f.watch(session_id)`` before
    submitting to it. Entries arrive as they commit (read_committed), a few ms late.
    """

    def __init__(self, klog: Any, partitions: int) -> None:
        import asyncio

        self._klog = klog
        self._partitions = partitions
        self._tasks: list[asyncio.Task[None]] = []
        self._watched: set[str] = set()
        self.entries: dict[str, list[tuple[float, Any]]] = {}
        self.settled: dict[str, tuple[float, Any]] = {}  # session -> its first input.settled
        self.changed = asyncio.Event()

    def watch(self, session_id: str) -> None:
        self._watched.add(session_id)
        self.entries.setdefault(session_id, [])

    async def _tail(self, partition: int) -> None:
        async for entry in self._klog.tail_partition(partition, 0):
            sid = entry.session_id
            if sid in self._watched:
                now = time.monotonic()
                self.entries[sid].append((now, entry))
                if entry.type == "harness.input.settled":
                    self.settled.setdefault(sid, (now, entry.record))
                self.changed.set()

    async def __aenter__(self) -> Follower:
        import asyncio

        await self._klog.start()
        self._tasks = [asyncio.create_task(self._tail(p)) for p in range(self._partitions)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        import asyncio

        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def wait_for(self, predicate: Any, timeout: float, what: str) -> Any:
        """Until ``predicate()`` returns something truthy (checked at each new entry); returns it."""
        import asyncio

        deadline = time.monotonic() + timeout
        while True:
            self.changed.clear()
            found = predicate()
            if found:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.5))
