"""How fast a worker rebuilds a partition it is given, against the floor of reading it.

    python bench/rebuild.py                      # starts its own LocalKafka
    python bench/rebuild.py --bootstrap 127.0.0.1:9092 --records 200000 --profile

Partitions of one-partition logs are filled with realistic session records, encoded
by the harness codec and produced with a plain transactional producer (keyed and
typed as the log writes them). An ended session is one finished turn of 9 records:
input, turn.started, model.response (a tool call), tool.started, step.result,
tool.result, model.response (text), turn.finished, input.settled. A live session is
parked on an open ``step.ask`` (5 records); ``--live`` of them are spread evenly
through the history.

(a) rebuild records/s, on ``--records`` records of ended sessions. The full-read path
    of an assignment by the same library calls (``KafkaLog.read_partition(p, 0)``,
    ``PartitionRuntime.rebuild``, ``go_live``), against in the same run a raw
    baseline: a plain confluent-kafka read_committed consumer reading the partition
    from offset 0, decoding each value with fastavro ``schemaless_reader``. Runs
    alternate, best of 2. Also shown: a real in-process ``Worker`` assigned the
    partition, first with no checkpoint (it reads everything, then writes one), then
    from that checkpoint. Last line: ``ratio=<harness records/s / raw records/s>``
    (target >= 0.8).

(b) history: a real in-process ``Worker`` assigned a partition of ``--history-large``
    vs ``--history-small`` records of ended sessions, each with the same ``--live``
    sessions. Timed from the end of ``own_partition`` (the fencing
    ``init_transactions``, reported apart) to ``worker.ready`` (all rebuilt and live):
    whatever ``run_group_worker`` does on assignment (today: read the latest
    checkpoint of ``<prefix>.snapshots``, read the tail after it, fold, go live). The
    first assignment of a partition finds no checkpoint (its history was produced
    outside any worker) and is reported apart; the ratio uses the median of the later
    ones. Last line: ``history_ratio=<t large / t small>`` (target <= 1.5).

``--profile`` runs the full-read path once more on the main thread under cProfile
(``read_range``, ``rebuild``, the fold of ``go_live``) and prints the top entries.

Every assignment of a (b) partition takes over its live sessions (one
``harness.turn.resumed`` each) and a turn fails after ``Durability.max_attempts`` (10)
takeovers: keep ``--repeat`` small.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import broker, fill_partition, history, new_prefix, table


@dataclass
class Assignment:
    fence_s: float  # own_partition: a new transactional producer's init_transactions
    rebuild_s: float  # fenced -> every session rebuilt and live (worker.ready)
    live: int  # sessions driven after go_live


class _TimedEvent(asyncio.Event):
    """``worker.ready`` that notes when it was set."""

    at: float = 0.0

    def set(self) -> None:
        if not self.is_set():
            self.at = time.perf_counter()
        super().set()


async def worker_assignment(bootstrap: str, prefix: str) -> Assignment:
    """Start a Worker on the one-partition log, time its assignment, stop it."""
    from bench.apps import bench
    from harness.log.kafka.log import KafkaLog
    from harness.runtime.worker import Worker

    klog = KafkaLog(bootstrap=bootstrap, topic_prefix=prefix, partitions=1)
    worker = Worker(log=klog, harnesses=[bench])
    ready = worker.ready = _TimedEvent()
    marks: dict[str, float] = {}
    own = klog.own_partition

    async def timed_own(partition: int) -> None:
        marks.setdefault("fence", time.perf_counter())
        await own(partition)
        marks.setdefault("fenced", time.perf_counter())

    klog.own_partition = timed_own  # type: ignore[method-assign]
    stop = asyncio.Event()
    t0 = time.perf_counter()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(ready.wait(), 300)
        live = sum(len(rt.sessions) for rt in worker.runtimes.values())
    finally:
        stop.set()
        await task
        await klog.close()
    fence = marks.get("fence", t0)
    fenced = marks.get("fenced", fence)
    return Assignment(fenced - fence, ready.at - fenced, live)


@dataclass
class Direct:
    records: int
    read: float
    rebuild: float
    go_live: float

    @property
    def total(self) -> float:
        return self.read + self.rebuild + self.go_live


async def direct_rebuild(bootstrap: str, prefix: str) -> Direct:
    """The full-read path of an assignment, by the same library calls, without the group
    or a checkpoint: ``read_partition(p, 0, lazy=True)``, ``PartitionRuntime.rebuild``, ``go_live``."""
    from bench.apps import bench
    from harness.log.kafka.log import KafkaLog
    from harness.runtime.host import HarnessHost
    from harness.runtime.partition import PartitionRuntime

    klog = KafkaLog(bootstrap=bootstrap, topic_prefix=prefix, partitions=1)
    await klog.start()
    try:
        rt = PartitionRuntime(host=HarnessHost(log=klog), harnesses={bench.name: bench}, partition=0)
        t0 = time.perf_counter()
        entries = await klog.read_partition(0, 0, lazy=True)  # as the worker reads (group.take)
        t1 = time.perf_counter()
        rt.rebuild(entries)
        t2 = time.perf_counter()
        await rt.go_live()
        t3 = time.perf_counter()
        await rt.stop()
    finally:
        await klog.close()
    return Direct(len(entries), t1 - t0, t2 - t1, t3 - t2)


def _raw_schemas() -> dict[bytes, Any]:
    """fingerprint -> parsed schema, straight from the .avsc files (no harness codec)."""
    from fastavro import parse_schema
    from fastavro.schema import to_parsing_canonical_form

    from harness.codec import crc64_avro, schema_dir

    out = {}
    for path in sorted(Path(schema_dir()).glob("*.avsc")):
        parsed = parse_schema(json.loads(path.read_text()))
        out[crc64_avro(to_parsing_canonical_form(parsed).encode())] = parsed
    return out


def raw_read(bootstrap: str, topic: str) -> tuple[int, float]:
    """Records read and seconds: plain read_committed consumer + fastavro schemaless_reader."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    from fastavro import schemaless_reader

    schemas = _raw_schemas()
    t0 = time.perf_counter()
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "bench-raw",  # never joined: assign() only
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        # Tuned as a bounded reader should be (the harness reader does the same): the
        # broker answers the fetch after the last records at once, not after 500 ms.
        "fetch.wait.max.ms": 1,
    })
    tp = TopicPartition(topic, 0)
    low, end = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
    consumer.assign([TopicPartition(topic, 0, low)])
    n = 0
    done = False
    while not done:
        # consume(n, t) waits all of t unless n arrive: take what is there, else wait for one.
        batch = consumer.consume(1000, 0)
        if not batch:
            first = consumer.poll(0.05)
            batch = [] if first is None else [first]
        for msg in batch:
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF and msg.offset() >= end:
                    done = True
                    break
                continue
            value = msg.value()
            buf = io.BytesIO(value)
            buf.seek(10)  # single-object header: magic (2) + fingerprint (8)
            schemaless_reader(buf, schemas[value[2:10]], None)
            n += 1
    seconds = time.perf_counter() - t0
    consumer.close()
    return n, seconds


def profile_rebuild(bootstrap: str, prefix: str, top: int) -> str:
    """cProfile of the full-read path on this thread: ``read_range`` (what read_partition
    runs on a thread), ``PartitionRuntime.rebuild`` and the fold of ``go_live``."""
    from bench.apps import bench
    from harness.codec import default_codec
    from harness.log.kafka.config import KafkaSettings
    from harness.log.kafka.reader import ConsumerPool, read_range
    from harness.log.memory import MemoryLog
    from harness.runtime.host import HarnessHost
    from harness.runtime.partition import PartitionRuntime

    settings = KafkaSettings(bootstrap=bootstrap, topic_prefix=prefix, partitions=1)
    pool = ConsumerPool(settings)
    rt = PartitionRuntime(host=HarnessHost(log=MemoryLog()), harnesses={bench.name: bench}, partition=0)
    codec = default_codec()
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    entries = read_range(  # lazily, as read_partition(lazy=True) does for a worker
        pool, codec.decode, topic=settings.sessions_topic, partition=0, start=0,
        peek=codec.peek_type, fields=codec.decode_fields,
    )
    t1 = time.perf_counter()
    rt.rebuild(entries)  # type: ignore[arg-type]
    t2 = time.perf_counter()
    asyncio.run(rt.forget_ended())
    profiler.disable()
    t3 = time.perf_counter()
    pool.close()
    out = io.StringIO()
    out.write(f"under cProfile: read_range {t1 - t0:.3f}s, rebuild {t2 - t1:.3f}s, fold (forget_ended) "
              f"{t3 - t2:.3f}s, {len(entries):,} records\n")
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="host:port of a broker (default: start a LocalKafka)")
    parser.add_argument("--records", type=int, default=200_000, help="(a) records of ended sessions")
    parser.add_argument("--history-small", type=int, default=2_000)
    parser.add_argument("--history-large", type=int, default=200_000)
    parser.add_argument("--live", type=int, default=20, help="sessions parked on an open ask")
    parser.add_argument("--repeat", type=int, default=3, help="timed assignments per partition (keep <= 4)")
    parser.add_argument("--profile", action="store_true", help="cProfile the read + fold once")
    parser.add_argument("--top", type=int, default=25, help="profile entries to print")
    parser.add_argument("--skip-a", action="store_true")
    parser.add_argument("--skip-b", action="store_true")
    args = parser.parse_args(argv)

    with broker(args.bootstrap) as bootstrap:
        def partition_with(ended: int, live: int) -> str:
            prefix = new_prefix(f"rb{ended}")
            asyncio.run(_create(bootstrap, prefix))
            t0 = time.perf_counter()
            n = fill_partition(bootstrap, f"{prefix}.sessions", 0, history(ended, live, prefix))
            print(f"(filled {prefix}.sessions[0] with {n:,} records in {time.perf_counter() - t0:.1f}s)", flush=True)
            return prefix

        if not args.skip_a:
            prefix = partition_with(args.records, 0)
            topic = f"{prefix}.sessions"
            raws: list[tuple[int, float]] = []
            directs: list[Direct] = []
            for _ in range(2):  # alternate, so neither side gets the warmer cache
                raws.append(raw_read(bootstrap, topic))
                directs.append(asyncio.run(direct_rebuild(bootstrap, prefix)))
            cold = asyncio.run(worker_assignment(bootstrap, prefix))  # no checkpoint yet: reads it all
            warm = asyncio.run(worker_assignment(bootstrap, prefix))  # from the checkpoint cold wrote
            n = max(r[0] for r in raws)
            raw_rate = max(count / s for count, s in raws)
            best = min(directs, key=lambda d: d.total)
            rate = best.records / best.total
            print()
            print(f"(a) rebuild of one partition of {n:,} records (ended sessions only); best of 2")
            print(table(
                ["what", "seconds", "records/s"],
                [
                    ("raw: read_committed consume + fastavro decode", min(s for _, s in raws), raw_rate),
                    ("harness: read_partition + rebuild + go_live", best.total, rate),
                    ("  read_partition (consume + decode)", best.read, best.records / best.read),
                    ("  rebuild (group by session)", best.rebuild, "-"),
                    ("  go_live (fold each session, forget ended)", best.go_live, "-"),
                    ("worker assignment, no checkpoint: fenced -> live", cold.rebuild_s, n / cold.rebuild_s),
                    ("worker assignment, from its checkpoint: fenced -> live", warm.rebuild_s, "-"),
                    ("  own_partition (init_transactions), not in the above", warm.fence_s, "-"),
                ],
            ))
            print(f"ratio={rate / raw_rate:.2f}")
            if args.profile:
                print()
                print(profile_rebuild(bootstrap, prefix, args.top))

        if not args.skip_b:
            rows = []
            medians: dict[int, float] = {}
            colds: dict[int, float] = {}
            for ended in (args.history_small, args.history_large):
                prefix = partition_with(ended, args.live)
                runs = [asyncio.run(worker_assignment(bootstrap, prefix)) for _ in range(args.repeat + 1)]
                cold, warm = runs[0], runs[1:]  # the first owner finds no checkpoint
                medians[ended] = statistics.median(a.rebuild_s for a in warm)
                colds[ended] = cold.rebuild_s
                rows.append((f"{ended:,} ended + {args.live} live", colds[ended], medians[ended],
                             max(a.rebuild_s for a in warm), statistics.median(a.fence_s for a in warm),
                             warm[-1].live))
            print()
            print(f"(b) assignment (fenced -> live) vs history size; {len(warm)} timed assignments each")
            print(table(["history", "first (s)", "p50 (s)", "max (s)", "fence p50 (s)", "live"], rows))
            small, large = medians[args.history_small], medians[args.history_large]
            print(f"t2k={small:.3f}s t200k={large:.3f}s" if (args.history_small, args.history_large) == (2000, 200000)
                  else f"t_small={small:.3f}s t_large={large:.3f}s")
            print(f"history_ratio={large / small:.2f}")
    return 0


async def _create(bootstrap: str, prefix: str) -> None:
    from harness.log.kafka.log import KafkaLog

    klog = KafkaLog(bootstrap=bootstrap, topic_prefix=prefix, partitions=1)
    await klog.start()
    await klog.close()


if __name__ == "__main__":
    raise SystemExit(main())
