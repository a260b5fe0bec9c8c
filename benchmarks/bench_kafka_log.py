"""Kafka session log vs bare confluent-kafka transactions, on the same broker, same run.

    python benchmarks/bench_kafka_log.py [--bootstrap HOST:PORT] [--n 300] [--sessions 64]

Without ``--bootstrap`` a local broker is started (harness.testing.kafka_local).
Reports, as ratios against the raw baseline measured in the same run:

* latency of one sequential ``append`` of a ~200-byte record vs one bare transaction
  (begin, produce one record, commit) with a raw transactional producer;
* appends/s of ``--sessions`` concurrent sessions of one partition (group commit) vs
  bare sequential transactions/s.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import timedelta

from confluent_kafka import Producer

from harness.codec import default_codec
from harness.ids import message_key
from harness.log.kafka import KafkaLog
from harness.records import StepResult

LEASE = timedelta(seconds=60)


def record(session: str, n: int) -> StepResult:
    return StepResult(
        session_id=session, ts=n, tool_call_id="call-1", name=f"step-{n}", value={"pad": "x" * 150}
    )


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def bare_transactions(bootstrap: str, topic: str, partition: int, n: int) -> list[float]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"bench-bare-{uuid.uuid4().hex}",
            "linger.ms": 0,
            "socket.nagle.disable": True,
            "transaction.timeout.ms": 10000,
            "message.timeout.ms": 10000,
        }
    )
    producer.init_transactions(30)
    value = default_codec().encode(record("bare", 0))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        producer.begin_transaction()
        producer.produce(topic, key=message_key("bare"), value=value, partition=partition)
        producer.commit_transaction(30)
        times.append(time.perf_counter() - t0)
    producer.close()
    return times


async def main(bootstrap: str, n: int, sessions: int) -> None:
    log = KafkaLog(bootstrap=bootstrap, topic_prefix=f"bench{uuid.uuid4().hex[:8]}", partitions=1)
    await log.start()
    print(f"record size: {len(default_codec().encode(record('s', 0)))} bytes")
    writer = await log.claim("s", owner="bench", lease=LEASE)
    for i in range(20):  # warm up
        await writer.append([record("s", i)])
    bare_transactions(bootstrap, log.settings.sessions_topic, 0, 20)

    lat: list[float] = []
    for i in range(n):
        t0 = time.perf_counter()
        await writer.append([record("s", i)])
        lat.append(time.perf_counter() - t0)
    bare = await asyncio.to_thread(bare_transactions, bootstrap, log.settings.sessions_topic, 0, n)
    print(
        f"sequential append   p50 {pct(lat, 0.5):6.2f} ms  p99 {pct(lat, 0.99):6.2f} ms\n"
        f"bare transaction    p50 {pct(bare, 0.5):6.2f} ms  p99 {pct(bare, 0.99):6.2f} ms\n"
        f"ratio (append/bare) p50 {pct(lat, 0.5) / pct(bare, 0.5):.2f}x  p99 {pct(lat, 0.99) / pct(bare, 0.99):.2f}x"
    )

    writers = await asyncio.gather(
        *(log.claim(f"c-{k}", owner="bench", lease=LEASE) for k in range(sessions))
    )
    per_session = max(1, n // 10)
    before = log.stats.snapshot()

    async def drive(w: object) -> None:
        for i in range(per_session):
            await w.append([record(w.session_id, i)])  # type: ignore[attr-defined]

    t0 = time.perf_counter()
    await asyncio.gather(*(drive(w) for w in writers))
    elapsed = time.perf_counter() - t0
    after = log.stats.snapshot()
    appends = after["appends"] - before["appends"]
    txns = after["transactions"] - before["transactions"]
    bare_rate = n / sum(bare)
    rate = appends / elapsed
    print(
        f"{sessions} concurrent sessions: {rate:8.0f} appends/s ({appends} appends in {txns} transactions, "
        f"{appends / txns:.1f} per transaction)\n"
        f"bare sequential:      {bare_rate:8.0f} transactions/s\n"
        f"ratio: {rate / bare_rate:.1f}x"
    )
    await log.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--sessions", type=int, default=64)
    args = parser.parse_args()
    if args.bootstrap:
        asyncio.run(main(args.bootstrap, args.n, args.sessions))
    else:
        from harness.testing.kafka_local import LocalKafka

        with LocalKafka() as kafka:
            kafka.warm_up_transactions()
            asyncio.run(main(kafka.bootstrap, args.n, args.sessions))
