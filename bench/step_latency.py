"""Latency of a durable no-op ``step.do`` against the physical floor of its log.

    python bench/step_latency.py --log sqlite:////tmp/bench.db      # (four slashes: an absolute path)
    python bench/step_latency.py --log kafka://127.0.0.1:9092 --concurrency 64

One durable tool runs sequential no-op steps, timed one by one, of two kinds: an
``async def`` no-op fn (it runs on the event loop) and a sync no-op fn (a ``lambda``: it
runs on the host's thread pool, one thread hop there and back per step, the price of
keeping blocking code off the loop). The baseline, in the same run and interleaved with
both kinds of steps in blocks of ``--block`` (so that disk or broker drift hits all
alike):

* SQLite: a raw commit of a record of the same size with the same settings (WAL,
  ``synchronous=FULL``), on its own file beside the log: BEGIN IMMEDIATE, INSERT, COMMIT.
  On SQLite's default 4 KiB pages (``ratio``), and, timed as a block of its own, on a
  file of the log's page size (1 KiB, ``PAGE_SIZE``: a commit's pages are whole in the
  WAL's fsync; ``page_matched_ratio``), so what the log's smaller pages save a commit
  is not counted as the step's.
  Both files are timed in their steady state: the warm-up goes on until each WAL has
  reached its checkpoint size. A commit that still grows the WAL file costs about twice
  one that rewrites it (the fsync also writes the file's new size), and a new log's WAL
  and the raw file's fill at different speeds (their commits write 3 and 2 pages), so
  timing them while they grow compares a mix of the two costs, not the commits.
* Kafka: a bare confluent-kafka transaction: begin, produce one record of the same size,
  commit (``linger.ms=0``, ``retry.backoff.ms=10`` like the harness's producer).

With ``--concurrency N`` (Kafka) it also measures steps/s of N sessions at once (group
commit: their steps share transactions) against bare transactions/s one after another.
Prints tables, ``sync_ratio=<p50 sync step / p50 baseline>``, (SQLite)
``page_matched_ratio=<p50 async step / p50 raw commit at the log's page size>`` and,
last, ``ratio=<p50 async step / p50 baseline>``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import require_broker
from harness import HarnessHost, define_harness, durable_tool, tool_definition
from harness.codec import default_codec
from harness.log.sqlite_schema import PAGE_SIZE
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import StepResult


class NoArgs(BaseModel):
    pass


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def record_bytes(size: int) -> bytes:
    return default_codec().encode(StepResult("bench-session", 0, "c1", "s0", "x" * size))


# -- baselines: one operation each, blocking --------------------------------------------


def wal_full(path: Path) -> bool:
    """Whether ``path``'s WAL has reached its checkpoint size (its later commits rewrite it)."""
    db = sqlite3.connect(path)
    try:
        pages = db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
    finally:
        db.close()
    wal = Path(f"{path}-wal")
    return wal.exists() and wal.stat().st_size >= 32 + pages * (page_size + 24)


def sqlite_baseline(path: Path, size: int, page_size: int | None = None) -> Callable[[], None]:
    """A raw commit on ``path`` (made with ``page_size`` pages when given, else SQLite's default)."""
    db = sqlite3.connect(path, isolation_level=None)
    if page_size is not None:
        db.execute(f"PRAGMA page_size={page_size}")  # (before the file's first write)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, type TEXT, value BLOB)"
    )
    value = record_bytes(size)

    def commit() -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO records (session_id, type, value) VALUES (?, ?, ?)", ("s", "harness.step.result", value))
        db.execute("COMMIT")

    return commit


def kafka_baseline(bootstrap: str, topic: str, size: int) -> Callable[[], None]:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
        "linger.ms": 0,
        "retry.backoff.ms": 10,
        "transaction.timeout.ms": 10000,
    })
    producer.init_transactions(30)
    value = record_bytes(size)

    def transaction() -> None:
        producer.begin_transaction()
        producer.produce(topic, value=value, key=b"bench-session", partition=0)
        producer.commit_transaction(30)

    return transaction


# -- the harness --------------------------------------------------------------------------


def _harness(steps_impl: Any) -> Any:
    tool = durable_tool(tool_definition(name="steps", description="no-op steps", input_schema=NoArgs), steps_impl)
    return define_harness(
        name="bench/steps",
        model=ScriptedModel(
            [ModelResponse(tool_calls=[ToolCall(id="c1", name="steps", arguments={})]), ModelResponse(text="done")]
        ),
        tools=[tool],
    )


async def interleaved(
    log_url: str,
    baseline: Callable[[], None],
    n: int,
    size: int,
    warmup: int,
    block: int,
    warm: Callable[[], bool] = lambda: True,
    second: Callable[[], None] | None = None,
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Async-fn step, sync-fn step, baseline and ``second`` baseline latencies, measured in
    alternating blocks after ``warmup`` rounds and, further, until ``warm()`` says the files
    are in their steady state."""
    steps: list[float] = []
    sync_steps: list[float] = []
    base: list[float] = []
    base2: list[float] = []

    async def steps_impl(args: NoArgs, ctx: Any) -> dict[str, int]:
        value = "x" * size

        async def noop() -> str:
            return value

        i = 0
        while i < warmup or (i % 50 != 0 or not warm()):
            await ctx.step.do(f"w{i}", noop)
            await ctx.step.do(f"v{i}", lambda: value)
            baseline()
            if second is not None:
                second()
            i += 1
        while len(steps) < n:
            for _ in range(block):
                t0 = time.perf_counter()
                await ctx.step.do(f"a{i}", noop)
                steps.append(time.perf_counter() - t0)
                i += 1
            for _ in range(block):
                t0 = time.perf_counter()
                await ctx.step.do(f"s{i}", lambda: value)
                sync_steps.append(time.perf_counter() - t0)
                i += 1
            for _ in range(block):
                t0 = time.perf_counter()
                baseline()
                base.append(time.perf_counter() - t0)
            for _ in range(block if second is not None else 0):
                t0 = time.perf_counter()
                second()  # type: ignore[misc]
                base2.append(time.perf_counter() - t0)
        return {"steps": len(steps) + len(sync_steps)}

    host = HarnessHost(log=log_url)  # (a URL: the host opens the log and closes it)
    try:
        session = await host.open(_harness(steps_impl), session_id=f"bench-{uuid.uuid4().hex[:8]}")
        result = await session.send("go")
        assert result.outcome == "completed", result
    finally:
        await host.close()
    return steps, sync_steps, base, base2


async def concurrent_steps(log_url: str, sessions: int, per_session: int, size: int) -> float:
    """Steps/s of ``sessions`` sessions doing ``per_session`` steps each, at once."""

    async def steps_impl(args: NoArgs, ctx: Any) -> dict[str, int]:
        value = "x" * size
        for i in range(per_session):
            await ctx.step.do(f"s{i}", lambda: value)
        return {"steps": per_session}

    harness = _harness(steps_impl)
    host = HarnessHost(log=log_url)  # (a URL: the host opens the log and closes it)
    try:
        handles = [await host.open(harness, session_id=f"bench-{uuid.uuid4().hex[:8]}-{k}") for k in range(sessions)]
        t0 = time.perf_counter()
        results = await asyncio.gather(*(h.send("go") for h in handles))
        wall = time.perf_counter() - t0
        assert all(r.outcome == "completed" for r in results), results
    finally:
        await host.close()
    return sessions * per_session / wall


def table(rows: list[tuple[str, list[float]]]) -> str:
    out = [
        f"| {'what':<42} | {'p50 (ms)':>9} | {'p99 (ms)':>9} | {'n':>5} |",
        f"|{'-' * 44}|{'-' * 11}|{'-' * 11}|{'-' * 7}|",
    ]
    for name, s in rows:
        out.append(f"| {name:<42} | {pct(s, 0.5) * 1000:>9.3f} | {pct(s, 0.99) * 1000:>9.3f} | {len(s):>5} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", required=True, help="sqlite:///<file> or kafka://host:port")
    parser.add_argument("-n", type=int, default=1000, help="timed steps of each kind (and as many baseline operations)")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--block", type=int, default=25, help="steps, then baseline operations, per block")
    parser.add_argument("--size", type=int, default=100, help="bytes of the step value")
    parser.add_argument("--concurrency", type=int, default=0, help="Kafka: also run N sessions at once")
    parser.add_argument("--partitions", type=int, default=12, help="Kafka: partitions of the sessions topic")
    args = parser.parse_args(argv)

    url = urlparse(args.log)
    if url.scheme == "sqlite":
        base_path = Path(args.log[len("sqlite:///"):])
        for p in (base_path, Path(f"{base_path}-wal"), Path(f"{base_path}-shm")):
            p.unlink(missing_ok=True)
        raw_path = base_path.parent / f"{base_path.name}.raw"
        small_path = base_path.parent / f"{base_path.name}.raw-small"
        for p in (raw_path, small_path):
            for q in (p, Path(f"{p}-wal"), Path(f"{p}-shm")):
                q.unlink(missing_ok=True)
        baseline = sqlite_baseline(raw_path, args.size)
        steps, sync_steps, base, matched = asyncio.run(
            interleaved(
                args.log,
                baseline,
                args.n,
                args.size,
                args.warmup,
                args.block,
                warm=lambda: wal_full(base_path) and wal_full(raw_path) and wal_full(small_path),
                second=sqlite_baseline(small_path, args.size, PAGE_SIZE),
            )
        )
        label = "raw sqlite commit (WAL, synchronous=FULL)"
        print(f"SQLite log, value {args.size} B, record {len(record_bytes(args.size))} B, {os.cpu_count()} cores")
    elif url.scheme == "kafka":
        bootstrap = url.netloc
        require_broker(bootstrap)
        prefix = parse_qs(url.query).get("topic_prefix", [f"bench{uuid.uuid4().hex[:6]}"])[0]
        log_url = f"kafka://{bootstrap}?topic_prefix={prefix}&partitions={args.partitions}"
        baseline = kafka_baseline(bootstrap, f"{prefix}.raw", args.size)
        steps, sync_steps, base, matched = asyncio.run(
            interleaved(log_url, baseline, args.n, args.size, args.warmup, args.block)
        )
        label = "bare Kafka transaction (1 record)"
        print(f"Kafka log, value {args.size} B, record {len(record_bytes(args.size))} B, {os.cpu_count()} cores")
        if args.concurrency:
            c = args.concurrency
            rate = asyncio.run(concurrent_steps(log_url, c, max(20, args.n // c), args.size))
            bare_rate = 1 / statistics.mean(base)
            print()
            print(f"| {'what':<46} | {'ops/s':>9} |")
            print(f"|{'-' * 48}|{'-' * 11}|")
            what = f"step.do, {c} sessions on {args.partitions} partitions"
            print(f"| {what:<46} | {rate:>9.0f} |")
            print(f"| {'bare Kafka transactions, one after another':<46} | {bare_rate:>9.0f} |")
            print(f"throughput_ratio={rate / bare_rate:.2f}")
            print()
    else:
        print("--log must be sqlite:///... or kafka://...", file=sys.stderr)
        return 2
    rows = [
        ("step.do, async no-op fn (on the loop)", steps),
        ("step.do, sync no-op fn (thread pool hop)", sync_steps),
        (label, base),
    ]
    if matched:
        rows.append((f"the same, {PAGE_SIZE} B pages (the log's)", matched))
    print(table(rows))
    print(f"sync_ratio={pct(sync_steps, 0.5) / pct(base, 0.5):.2f}")
    if matched:
        print(f"page_matched_ratio={pct(steps, 0.5) / pct(matched, 0.5):.2f}")
    print(f"ratio={pct(steps, 0.5) / pct(base, 0.5):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
