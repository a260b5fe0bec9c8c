"""How fast a worker rebuilds a partition it is given, against the floor of reading it.

    python bench/rebuild.py                      # starts its own LocalKafka
    python bench/rebuild.py --bootstrap 127.0.0.1:9092 --records 200000 --profile

A one-partition log is filled with realistic session records (each ended session is
one finished turn of 9 records: input, turn.started, model.response, tool.started,
step.result, tool.result, model.response, turn.finished, input.settled) produced
encoded by the harness codec with a plain transactional producer, with ``--live``
sessions parked on an open ``step.ask`` spread through the history.

(a) rebuild records/s: a real in-process ``Worker`` joins the group and is assigned
    the partition; what ``run_group_worker`` does on assignment is timed from the end
    of ``own_partition`` (the fencing ``init_transactions``, reported apart) to
    ``worker.ready`` (every session rebuilt and live), so the bench follows whatever
    the assignment path does (a snapshot read once snapshots land). Against, in the
    same run, a raw baseline: a plain confluent-kafka read_committed consumer reading
    the same partition from the start and decoding each value with fastavro
    ``schemaless_reader``. Last line of (a): ``ratio=<harness records/s / raw
    records/s>`` (target >= 0.8).

(b) history: the same assignment timed on a partition with ``--history-large``
    records of ended sessions vs ``--history-small``, both with the same ``--live``
    open-ask sessions. The first assignment of each partition is reported apart
    (cold: no worker ever owned it, so no snapshot can exist); the ratio uses the
    median of the later ones. Last line: ``history_ratio=<t large / t small>``
    (target <= 1.5). While rebuild reads the partition from offset 0 this ratio
    follows the history size.

``--profile`` runs the read and the fold once more on the main thread under cProfile
(``read_range`` then ``PartitionRuntime.rebuild``) and prints the top entries.

Every assignment takes over the live sessions (a ``harness.turn.resumed`` each) and
a turn fails after ``Durability.max_attempts`` (10) takeovers: keep ``--repeat`` small.
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

from bench._common import broker, fill_partition, history, new_prefix, table  # noqa: E402


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
    from harness.log.kafka import KafkaLog
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
        "group.id": "bench-raw",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    })
    tp = TopicPartition(topic, 0)
    low, end = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
    consumer.assign([TopicPartition(topic, 0, low)])
    n = 0
    done = False
    while not done:
        for msg in consumer.consume(1000, 0.1):
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
    """cProfile of one read (``read_range``, as read_partition runs it) and fold, on this thread."""
    from bench.apps import bench
    from harness.codec import default_codec
    from harness.log.kafka_config import KafkaSettings
    from harness.log.kafka_reader import ConsumerPool, read_range
    from harness.runtime.host import HarnessHost
    from harness.runtime.partition import PartitionRuntime

    settings = KafkaSettings(bootstrap=bootstrap, topic_prefix=prefix, partitions=1)
    pool = ConsumerPool(settings)
    host = HarnessHost(log=None)  # type: ignore[arg-type]  # rebuild never touches the log
    rt = PartitionRuntime(host=host, harnesses={bench.name: bench}, partition=0)
    decode = default_codec().decode
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    entries = read_range(pool, decode, topic=settings.sessions_topic, partition=0, start=0)
    t1 = time.perf_counter()
    rt.rebuild(entries)  # type: ignore[arg-type]
    profiler.disable()
    t2 = time.perf_counter()
    pool.close()
    out = io.StringIO()
    out.write(f"read_range {t1 - t0:.3f}s + rebuild {t2 - t1:.3f}s for {len(entries)} records (under cProfile)\n")
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
        filled: dict[int, str] = {}  # ended records -> prefix (same --live everywhere)

        def partition_with(ended: int) -> str:
            if ended not in filled:
                prefix = new_prefix(f"rb{ended}")
                asyncio.run(_create(bootstrap, prefix))
                t0 = time.perf_counter()
                n = fill_partition(bootstrap, f"{prefix}.sessions", 0, history(ended, args.live, prefix))
                print(f"(filled {prefix}.sessions[0] with {n:,} records in {time.perf_counter() - t0:.1f}s)",
                      flush=True)
                filled[ended] = prefix
            return filled[ended]

        if not args.skip_a:
            prefix = partition_with(args.records)
            topic = f"{prefix}.sessions"
            raws: list[tuple[int, float]] = []
            runs: list[Assignment] = []
            for _ in range(2):  # alternate, so neither side gets the warmer cache
                raws.append(raw_read(bootstrap, topic))
                runs.append(asyncio.run(worker_assignment(bootstrap, prefix)))
            n = max(r[0] for r in raws)
            raw_rate = max(count / s for count, s in raws)
            best = min(runs, key=lambda a: a.rebuild_s)
            rate = n / best.rebuild_s
            print()
            print(f"(a) rebuild of one partition: {n:,} records ({args.live} live sessions), best of 2")
            print(table(
                ["what", "seconds", "records/s"],
                [
                    ("raw: read_committed consume + fastavro decode", min(s for _, s in raws), raw_rate),
                    ("worker assignment: fenced -> live (rebuild)", best.rebuild_s, rate),
                    ("  of which own_partition (init_transactions)", best.fence_s, "-"),
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
                prefix = partition_with(ended)
                runs = [asyncio.run(worker_assignment(bootstrap, prefix)) for _ in range(args.repeat + 1)]
                # The (a) runs on a shared partition were its first assignments.
                cold, warm = (runs[0], runs[1:]) if ended != args.records or args.skip_a else (None, runs)
                medians[ended] = statistics.median(a.rebuild_s for a in warm)
                colds[ended] = cold.rebuild_s if cold is not None else float("nan")
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
    from harness.log.kafka import KafkaLog

    klog = KafkaLog(bootstrap=bootstrap, topic_prefix=prefix, partitions=1)
    await klog.start()
    await klog.close()


if __name__ == "__main__":
    raise SystemExit(main())
