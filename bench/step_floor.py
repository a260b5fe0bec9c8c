"""Where a SQLite step's floor is on this machine: ``step.do`` against a step with no checks.

    python bench/step_floor.py /tmp                  # four files in that directory

``bench/step_latency.py`` times a durable no-op ``step.do`` against a raw commit. This
one adds a third thing, the **minimal step**: what no step can skip and nothing more (await
the fn, ``json.dumps`` its value, make and encode the ``StepResult``, ``BEGIN IMMEDIATE``,
``PRAGMA data_version``, the insert and the head's upsert with their checksums, ``COMMIT``)
on a file of the log's own schema. No name or value checks, no fencing, no lease, no
group commit, no fold into a session's state, no wake-ups, no metrics.

All of them run in one tool of one harness process, in alternating blocks of ``--block``
after every file's WAL reached its checkpoint size (as ``step_latency``), so the minimal
step runs with the same process memory and call depth as ``step.do``. What ``step.do``
takes over the minimal step is what the step's contract costs in Python; what the minimal
step takes over the raw commit is the schema's SQL (three pages, not two) and the least
Python a step can have. Prints a table and, last,
``ratio=<step / raw> floor_ratio=<minimal / raw> small_raw_ratio=<raw at PAGE_SIZE / raw>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.step_latency import _harness, pct, sqlite_baseline, wal_full
from harness import HarnessHost
from harness.codec import default_codec
from harness.log.sqlite_schema import INSERT, PAGE_SIZE, SCHEMA, SET_HEAD, head_crc, row_crc
from harness.records import StepResult

SMALL_RAW = f"raw, {PAGE_SIZE} B"
"""The row of the raw commit on a file of the log's page size."""


class MinimalStep:
    """A step with nothing but what every step must do, on a file of the log's schema."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # (as the log makes a file)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        self._cur = self._db.cursor()
        self._codec = default_codec()
        self._last = 0
        self.steps: dict[str, Any] = {}

    async def do(self, name: str, fn: Any) -> Any:
        value = await fn()
        json.dumps(value)  # (the size check's text)
        encoded = self._codec.encode(StepResult("s1", round(time.time() * 1000), "c1", name, value))
        cur, db = self._cur, self._db
        cur.execute("BEGIN IMMEDIATE")
        cur.execute("PRAGMA data_version").fetchone()
        prev, last = self._last, self._last + 1
        kind = StepResult.TYPE
        db.execute(INSERT, (last, "s1", kind, encoded, prev, row_crc(last, prev, "s1", kind, encoded)))
        db.execute(SET_HEAD, ("s1", last, head_crc("s1", last)))
        cur.execute("COMMIT")
        self._last = last
        self.steps[name] = value
        return value


def fresh(path: Path) -> Path:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


async def measure(directory: Path, n: int, block: int, warmup: int) -> dict[str, list[float]]:
    raw_path, small_path, minimal_path, log_path = (
        fresh(directory / f"step-floor-{k}.db") for k in ("raw", "raw-small", "minimal", "log")
    )
    raw = sqlite_baseline(raw_path, 100)
    small_raw = sqlite_baseline(small_path, 100, PAGE_SIZE)
    minimal = MinimalStep(minimal_path)
    times: dict[str, list[float]] = {"step.do": [], "minimal step": [], "raw commit": [], SMALL_RAW: []}

    async def impl(args: Any, ctx: Any) -> dict[str, Any]:
        async def noop() -> str:
            return "x" * 100

        i = 0
        while i < warmup or not all(wal_full(p) for p in (raw_path, small_path, minimal_path, log_path)):
            await ctx.step.do(f"w{i}", noop)
            await minimal.do(f"w{i}", noop)
            raw()
            small_raw()
            i += 1
        clock = time.perf_counter
        for b in range(max(1, n // block)):
            for j in range(block):
                t0 = clock()
                await ctx.step.do(f"a{b}-{j}", noop)
                times["step.do"].append(clock() - t0)
            for j in range(block):
                t0 = clock()
                await minimal.do(f"a{b}-{j}", noop)
                times["minimal step"].append(clock() - t0)
            for _ in range(block):
                t0 = clock()
                raw()
                times["raw commit"].append(clock() - t0)
            for _ in range(block):
                t0 = clock()
                small_raw()
                times[SMALL_RAW].append(clock() - t0)
        return {}

    host = HarnessHost(log=f"sqlite:///{log_path}")
    try:
        session = await host.open(_harness(impl), session_id=f"floor-{uuid.uuid4().hex[:8]}")
        result = await session.send("go")
        if result.outcome != "completed":
            raise SystemExit(f"the bench's turn did not complete: {result.outcome}")
    finally:
        await host.close()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="where the four files go (the disk to measure)")
    parser.add_argument("-n", type=int, default=2000, help="timed operations of each kind")
    parser.add_argument("--block", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=3000, help="rounds before timing (and until every WAL is full size)")
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        parser.error(f"{args.directory} is not a directory")
    times = asyncio.run(measure(args.directory, args.n, args.block, args.warmup))
    print("| operation      |    p50 ms |    p99 ms |     n |")
    print("|----------------|-----------|-----------|-------|")
    for name, samples in times.items():
        print(f"| {name:<14} | {pct(samples, 0.5) * 1000:>9.3f} | {pct(samples, 0.99) * 1000:>9.3f} | {len(samples):>5} |")
    raw = pct(times["raw commit"], 0.5)
    print(
        f"ratio={pct(times['step.do'], 0.5) / raw:.2f} floor_ratio={pct(times['minimal step'], 0.5) / raw:.2f} "
        f"small_raw_ratio={pct(times[SMALL_RAW], 0.5) / raw:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
