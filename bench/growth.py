"""Turns/s on a log whose partitions have served many sessions, against a fresh log, in one run.

    python bench/growth.py --bootstrap 127.0.0.1:9092 [--sessions 600000]

Two Kafka logs of ``--partitions`` (6) partitions side by side: FRESH (empty) and GROWN,
first filled with ``--sessions`` ended sessions (each an input and its settlement, as a
rejected input leaves it: every one of them is in its partition's directory of ended
sessions, which the partition's owner keeps and checkpoints). One ``harness worker`` per
log. The same turns as ``bench/e2e.py`` (a): ``HarnessClient.send`` + ``wait_settled``,
a new session per turn, one tool call of 3 no-op steps, ``--clients`` (32) closed-loop
clients, in alternating windows of ``--window`` (10) seconds: fresh, grown, fresh, grown
... (``--rounds`` (3) of each), so the machine's drift hits both logs alike. First an
untimed load on both, at least ``--warmup`` (10) s and on while a local broker's JIT still
compiles (``bench._common.warm_broker``).

Prints, per log: turns/s, CPU ms per turn of its worker and of the broker, and the
bytes its worker wrote to the snapshots topic per turn (checkpoints). Last line:
``growth_ratio=<grown turns/s / fresh turns/s>`` (the target: >= 0.9, the turn's cost
does not grow with what the log has served).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import (
    HARNESS_NAME,
    WorkerProc,
    add_bootstrap_option,
    broker,
    fill_partition,
    listening_pid,
    log_url,
    new_prefix,
    process_cpu_seconds,
    table,
    wait_settled_group,
    warm_broker,
)
from bench.e2e import closed_loop


def fill(bootstrap: str, prefix: str, partitions: int, sessions: int) -> int:
    """``sessions`` ended sessions (input + settlement) in the sessions partitions they hash to."""
    from harness.log.kafka.partitioner import partition_for
    from harness.records import InputMessage, InputSettled

    ts = int(time.time() * 1000)
    by_partition: list[list[str]] = [[] for _ in range(partitions)]
    for i in range(sessions):
        sid = f"old-{i:07d}"
        by_partition[partition_for(sid, partitions)].append(sid)
    n = 0
    for p, sids in enumerate(by_partition):
        n += fill_partition(bootstrap, f"{prefix}.sessions", p, (
            record for sid in sids for record in (
                InputMessage(sid, ts, "in-1", "hello", HARNESS_NAME),
                InputSettled(sid, ts, "in-1", "rejected", "unknown_harness", "no harness of that name runs here"),
            )
        ), per_transaction=20_000)
    return n


def snapshot_bytes(bootstrap: str, prefix: str, partitions: int) -> int:
    """Bytes of every record in ``<prefix>.snapshots`` (what the worker's checkpoints wrote)."""
    from confluent_kafka import Consumer, TopicPartition

    topic = f"{prefix}.snapshots"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-growth", "enable.partition.eof": True,
                         "fetch.max.bytes": 52_428_800})
    try:
        total = 0
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            seen = low
            while seen < high:
                msg = consumer.poll(10)
                if msg is None:
                    break
                if msg.error() is None:
                    total += len(msg.value() or b"")
                    seen = msg.offset() + 1
                elif msg.error().code() == msg.error()._PARTITION_EOF:
                    break
        return total
    finally:
        consumer.close()


class Deployed:
    """A log with its worker and a client sending turns to it."""

    def __init__(self, bootstrap: str, prefix: str, args: argparse.Namespace) -> None:
        self.bootstrap, self.prefix, self.args = bootstrap, prefix, args
        self.turns = 0
        self.seconds = 0.0
        self.worker_cpu = 0.0
        self.broker_cpu = 0.0
        self.client: Any = None
        self.worker: WorkerProc | None = None

    async def start(self) -> None:
        from harness.client import HarnessClient
        from harness.log.kafka.log import KafkaLog

        admin = KafkaLog(bootstrap=self.bootstrap, topic_prefix=self.prefix, partitions=self.args.partitions)
        await admin.start()
        await admin.close()
        self.client = HarnessClient(bootstrap=self.bootstrap, topic_prefix=self.prefix, partitions=self.args.partitions)
        await self.client.log.start()

    def start_worker(self, env: dict[str, str] | None = None, root: Path | None = None) -> None:
        self.worker = WorkerProc(log_url(self.bootstrap, self.prefix, self.args.partitions), self.prefix,
                                 env=env, root=root)

    async def ready(self) -> None:
        assert self.worker is not None
        await asyncio.to_thread(wait_settled_group, [self.worker], self.args.partitions, timeout=900)
        for k in range(20):  # warm up the worker's sessions and this client's tail
            await self.turn(f"warm-{k}-{uuid.uuid4().hex[:6]}")

    async def turn(self, sid: str) -> None:
        receipt = await self.client.send(sid, f"steps={self.args.steps}", harness=HARNESS_NAME, input_id=f"in-{sid}")
        settled = await self.client.wait_settled(sid, receipt, timeout=60)
        assert settled.outcome == "completed", settled

    async def window(self, broker_pid: int | None) -> float:
        assert self.worker is not None
        w0 = self.worker.cpu_seconds()
        b0 = process_cpu_seconds(broker_pid) if broker_pid else 0.0
        t0 = time.monotonic()
        rate, latencies = await closed_loop(self.turn, self.args.clients, self.args.window, self.prefix[-6:])
        self.seconds += time.monotonic() - t0
        self.turns += len(latencies)
        self.worker_cpu += self.worker.cpu_seconds() - w0
        self.broker_cpu += (process_cpu_seconds(broker_pid) if broker_pid else 0.0) - b0
        return rate

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.worker is not None:
            self.worker.stop()


async def run(bootstrap: str, args: argparse.Namespace) -> None:
    stem = new_prefix("growth")
    fresh = Deployed(bootstrap, f"{stem}f", args)
    grown = Deployed(bootstrap, f"{stem}g", args)
    print(f"topics: {stem}f.* (fresh), {stem}g.* (grown); {os.cpu_count()} cores; {args.partitions} partitions; "
          f"{args.clients} clients; windows of {args.window:g} s", flush=True)
    try:
        await fresh.start()
        await grown.start()
        t0 = time.monotonic()
        records = await asyncio.to_thread(fill, bootstrap, grown.prefix, args.partitions, args.sessions)
        print(f"grown: {args.sessions:,} ended sessions ({records:,} records) written in "
              f"{time.monotonic() - t0:.0f} s", flush=True)
        fresh.start_worker()
        grown.start_worker()
        t0 = time.monotonic()
        await fresh.ready()
        await grown.ready()
        print(f"workers ready in {time.monotonic() - t0:.0f} s (the grown one rebuilt its partitions)", flush=True)
        bytes0 = {d.prefix: await asyncio.to_thread(snapshot_bytes, bootstrap, d.prefix, args.partitions)
                  for d in (fresh, grown)}
        broker_pid = listening_pid(int(bootstrap.rsplit(":", 1)[1]))

        async def load(seconds: float) -> None:  # untimed: both logs, and the broker's JIT
            for d in (fresh, grown):
                await closed_loop(d.turn, args.clients, seconds / 2, "warm")

        warm = await warm_broker(load, broker_pid, least=args.warmup, most=args.warmup_max)
        print(f"warmed up in {warm['seconds']:.0f} s", flush=True)
        rates: dict[str, list[float]] = {fresh.prefix: [], grown.prefix: []}
        for r in range(args.rounds):
            for d in ((fresh, grown) if r % 2 == 0 else (grown, fresh)):
                rates[d.prefix].append(await d.window(broker_pid))
            print(f"round {r + 1}: fresh {rates[fresh.prefix][-1]:.0f}, grown {rates[grown.prefix][-1]:.0f} turns/s",
                  flush=True)
        written = {d.prefix: await asyncio.to_thread(snapshot_bytes, bootstrap, d.prefix, args.partitions)
                   - bytes0[d.prefix] for d in (fresh, grown)}
    finally:
        await fresh.close()
        await grown.close()

    def row(name: str, d: Deployed) -> tuple[Any, ...]:
        turns = max(1, d.turns)
        return (name, d.turns / d.seconds, d.worker_cpu * 1000 / turns, d.broker_cpu * 1000 / turns,
                written[d.prefix] / turns)

    print()
    print(table(["log", "turns/s", "worker CPU ms / turn", "broker CPU ms / turn", "checkpoint bytes / turn"], [
        row("fresh (empty)", fresh),
        row(f"grown ({args.sessions:,} ended sessions)", grown),
    ]))
    print(f"growth_ratio={(grown.turns / grown.seconds) / (fresh.turns / fresh.seconds):.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bootstrap_option(parser)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--sessions", type=int, default=600_000, help="ended sessions the grown log holds first")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--window", type=float, default=10.0, help="seconds of one closed-loop window")
    parser.add_argument("--rounds", type=int, default=3, help="windows per log")
    parser.add_argument("--warmup", type=float, default=10.0,
                        help="least seconds of untimed load first (both logs); it goes on while a local "
                             "broker's JIT still compiles (jstat), up to --warmup-max")
    parser.add_argument("--warmup-max", type=float, default=120.0, help="most seconds of that warm-up")
    args = parser.parse_args(argv)
    with broker(args.bootstrap) as bootstrap:
        asyncio.run(run(bootstrap, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
