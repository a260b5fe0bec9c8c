"""Latency of a durable no-op ``step.do`` against the physical floor of its log.

    python bench/step_latency.py --log sqlite:///tmp/bench.db
    python bench/step_latency.py --log kafka://127.0.0.1:9092

Sequential steps inside one durable tool, timed one by one, against in the same
run: a raw SQLite commit of a record of the same size with the same settings
(WAL, synchronous=FULL), or a bare confluent-kafka transaction (begin, produce
one record of the same size, commit). With --concurrency N (Kafka) it also
measures steps/s of N sessions at once (group commit) against N bare
transactional producers... no: against one bare producer committing N records
per transaction is not the baseline; the baseline is sequential bare
transactions/s, the floor of one transaction after another. Prints a table and,
last, ``ratio=<p50 step / p50 baseline>``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from pydantic import BaseModel

from harness import HarnessHost, define_harness, durable_tool, open_log, tool_definition
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import StepResult
from harness.codec import default_codec


class NoArgs(BaseModel):
    pass


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def _value(size: int) -> str:
    return "x" * size


async def measure_steps(log_url: str, n: int, size: int, warmup: int, sessions: int = 1) -> tuple[list[float], float]:
    """Per-step latencies (seconds) of ``sessions`` concurrent sessions, and total wall time."""
    samples: list[float] = []

    async def steps_impl(args: NoArgs, ctx: Any) -> dict[str, int]:
        value = _value(size)
        for i in range(warmup + n):
            t0 = time.perf_counter()
            await ctx.step.do(f"s{i}", lambda: value)
            if i >= warmup:
                samples.append(time.perf_counter() - t0)
        return {"steps": n}

    tool = durable_tool(tool_definition(name="steps", description="no-op steps", input_schema=NoArgs), steps_impl)
    harness = define_harness(
        name="bench/steps",
        model=ScriptedModel([ModelResponse(tool_calls=[ToolCall(id="c1", name="steps", arguments={})]),
                             ModelResponse(text="done")]),
        tools=[tool],
    )
    host = HarnessHost(log=open_log(log_url))
    try:
        handles = [await host.open(harness, session_id=f"bench-{uuid.uuid4().hex[:8]}-{k}") for k in range(sessions)]
        # Claim and warm each session (ownership, producers) before timing.
        t0 = time.perf_counter()
        results = await asyncio.gather(*(h.send("go") for h in handles))
        wall = time.perf_counter() - t0
        assert all(r.outcome == "completed" for r in results), results
    finally:
        await host.close()
    return samples, wall


def record_bytes(size: int) -> bytes:
    return default_codec().encode(StepResult("bench-session", 0, "c1", "s0", _value(size)))


def measure_raw_sqlite(path: Path, n: int, size: int, warmup: int) -> list[float]:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, type TEXT, value BLOB)")
    value = record_bytes(size)
    samples = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO records (session_id, type, value) VALUES (?, ?, ?)", ("s", "harness.step.result", value))
        db.execute("COMMIT")
        if i >= warmup:
            samples.append(time.perf_counter() - t0)
    db.close()
    return samples


def measure_raw_kafka(bootstrap: str, topic: str, n: int, size: int, warmup: int) -> list[float]:
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
    samples = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        producer.begin_transaction()
        producer.produce(topic, value=value, key=b"bench-session", partition=0)
        producer.commit_transaction(30)
        if i >= warmup:
            samples.append(time.perf_counter() - t0)
    return samples


def table(rows: list[tuple[str, list[float]]]) -> str:
    out = [f"| {'what':<40} | {'p50 (ms)':>9} | {'p99 (ms)':>9} | {'n':>5} |", f"|{'-' * 42}|{'-' * 11}|{'-' * 11}|{'-' * 7}|"]
    for name, s in rows:
        out.append(f"| {name:<40} | {pct(s, 0.5) * 1000:>9.3f} | {pct(s, 0.99) * 1000:>9.3f} | {len(s):>5} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", required=True, help="sqlite:///<file> or kafka://host:port")
    parser.add_argument("-n", type=int, default=1000, help="timed steps")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--size", type=int, default=100, help="bytes of the step value")
    parser.add_argument("--concurrency", type=int, default=0, help="also run N concurrent sessions (throughput)")
    args = parser.parse_args(argv)

    url = urlparse(args.log)
    rows: list[tuple[str, list[float]]] = []
    if url.scheme == "sqlite":
        base = Path(args.log[len("sqlite:///"):])
        for p in (base, Path(f"{base}-wal"), Path(f"{base}-shm")):
            p.unlink(missing_ok=True)
        raw_path = Path(tempfile.mkdtemp(prefix="bench-raw-")) / "raw.db"
        raw = measure_raw_sqlite(raw_path, args.n, args.size, args.warmup)
        steps, _ = asyncio.run(measure_steps(args.log, args.n, args.size, args.warmup))
        raw2 = measure_raw_sqlite(raw_path, args.n, args.size, args.warmup)  # again: drift check
        raw = raw + raw2
        rows = [("step.do (durable, sequential)", steps), ("raw sqlite commit (WAL, synchronous=FULL)", raw)]
        print(f"SQLite log, value {args.size} B, record {len(record_bytes(args.size))} B, {os.cpu_count()} cores")
    elif url.scheme == "kafka":
        bootstrap = url.netloc
        prefix = parse_qs(url.query).get("topic_prefix", [f"bench{uuid.uuid4().hex[:6]}"])[0]
        log_url = f"kafka://{bootstrap}?topic_prefix={prefix}&partitions=12"
        raw = measure_raw_kafka(bootstrap, f"{prefix}.raw", args.n, args.size, args.warmup)
        steps, _ = asyncio.run(measure_steps(log_url, args.n, args.size, args.warmup))
        rows = [("step.do (durable, sequential)", steps), ("bare Kafka transaction (1 record)", raw)]
        print(f"Kafka log, value {args.size} B, record {len(record_bytes(args.size))} B, {os.cpu_count()} cores")
        if args.concurrency:
            c = args.concurrency
            per = max(20, args.n // c)
            csteps, wall = asyncio.run(measure_steps(log_url, per, args.size, 5, sessions=c))
            total = c * (per + 5)
            raw_rate = 1 / statistics.mean(raw)
            print()
            print(f"| {'what':<44} | {'ops/s':>9} |")
            print(f"|{'-' * 46}|{'-' * 11}|")
            print(f"| {f'step.do, {c} sessions at once (group commit)':<44} | {total / wall:>9.0f} |")
            print(f"| {'bare Kafka transactions, one after another':<44} | {raw_rate:>9.0f} |")
            print(f"throughput_ratio={total / wall / raw_rate:.2f}")
            print()
    else:
        print("--log must be sqlite:///... or kafka://...", file=sys.stderr)
        return 2
    print(table(rows))
    print(f"ratio={pct(rows[0][1], 0.5) / pct(rows[1][1], 0.5):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
