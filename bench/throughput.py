"""Durable tool calls/s and steps/s of 1, 2 and 3 worker processes on one log.

    python bench/throughput.py                   # starts its own LocalKafka
    python bench/throughput.py --bootstrap 127.0.0.1:9092 --sessions 600 --steps 20 --workers 1,2,3

For each worker count: a fresh log of ``--partitions`` partitions, that many real
``harness worker`` processes (``bench.apps:bench``), the group left to settle (every
partition owned, no change for a second). Then ``--sessions`` sessions are submitted at
once through ``HarnessClient``, each running one ``work`` tool call of ``--steps``
no-op durable steps (a turn: input, turn.started, model.response, tool.started,
k x step.result, tool.result, model.response, turn.finished + input.settled). Timed
from the first submit to the last ``harness.input.settled`` seen on a read_committed
tail of every partition.

What bounds it: each step is one transactional commit of the partition's owner
producer; the sessions of a partition share it (group commit), so the partition's
producer round trip, the broker (fsync off, one node) and the workers' Python (one
event loop per process, the codec, the fold) are the limits. On a machine with few
cores the workers and the broker compete for them (the table prints the count).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import (
    HARNESS_NAME,
    Follower,
    WorkerProc,
    broker,
    log_url,
    machine_busy,
    new_prefix,
    print_profile,
    table,
    wait_settled_group,
)


async def runs(bootstrap: str, n_workers: int, args: argparse.Namespace) -> list[dict[str, float]]:
    """``args.repeat`` timed rounds on one set of ``n_workers`` workers (fresh sessions each)."""
    from harness.client import HarnessClient
    from harness.log.kafka.log import KafkaLog

    partitions = args.partitions
    prefix = new_prefix(f"tp{n_workers}")
    url = log_url(bootstrap, prefix, partitions)
    klog = KafkaLog(bootstrap=bootstrap, topic_prefix=prefix, partitions=partitions)
    await klog.start()
    workers = [WorkerProc(url, f"w{i}", profile=(args.profile / f"worker-{n_workers}-{i}.prof")
                          if args.profile else None) for i in range(n_workers)]
    client = HarnessClient(bootstrap=bootstrap, topic_prefix=prefix, partitions=partitions)
    out = []
    try:
        await asyncio.to_thread(wait_settled_group, workers, partitions, timeout=90)
        async with Follower(klog, partitions) as follow:
            # Warm up: the client's producer (InitProducerId) and one turn end to end.
            follow.watch("warmup")
            await client.send("warmup", "steps=1", harness=HARNESS_NAME)
            await follow.wait_for(lambda: "warmup" in follow.settled, args.timeout, "the warm-up turn")
            for r in range(args.repeat):
                sessions = [f"tp-{r}-{k}-{uuid.uuid4().hex[:6]}" for k in range(args.sessions)]
                for sid in sessions:
                    follow.watch(sid)
                cpu0 = [w.cpu_seconds() for w in workers]
                busy0, total0 = machine_busy()
                self0 = time.process_time()
                t0 = time.monotonic()
                await asyncio.gather(*(
                    client.send(sid, f"steps={args.steps}", harness=HARNESS_NAME, input_id=f"in-{sid}")
                    for sid in sessions
                ))
                t_submitted = time.monotonic()
                await follow.wait_for(lambda s=sessions: all(sid in follow.settled for sid in s), args.timeout,
                                      "every session to settle")
                t_end = max(follow.settled[sid][0] for sid in sessions)
                wall = t_end - t0
                busy1, total1 = machine_busy()
                cpu = [w.cpu_seconds() - c for w, c in zip(workers, cpu0, strict=True)]
                bench_cpu = time.process_time() - self0
                row = {
                    "wall": wall,
                    "submit": t_submitted - t0,
                    "calls_s": args.sessions / wall,
                    "steps_s": args.sessions * args.steps / wall,
                    "failed": sum(follow.settled[sid][1].outcome != "completed" for sid in sessions),
                    "worker_cpu": sum(cpu) / wall,  # cores' worth of CPU the workers used
                    "bench_cpu": bench_cpu / wall,
                    "machine": (busy1 - busy0) / max(1, total1 - total0),
                }
                print(f"  {n_workers} worker(s), round {r + 1}: {wall:.2f}s, {row['calls_s']:.1f} calls/s,"
                      f" {row['steps_s']:.0f} steps/s ({row['failed']} not completed)", flush=True)
                out.append(row)
    except BaseException:
        for w in workers:
            print(f"--- {w.name} (alive={w.alive}) owns {sorted(w.owns())}\n{w.tail(15)}", file=sys.stderr)
        raise
    finally:
        for w in workers:
            w.stop()
        await client.close()
        await klog.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="host:port of a broker (default: start a LocalKafka)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--workers", default="1,2,3", help="worker counts to run, comma-separated")
    parser.add_argument("--sessions", type=int, default=600, help="sessions (one tool call each) per run")
    parser.add_argument("--steps", type=int, default=20, help="durable steps per tool call")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds per worker count")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--profile", type=Path, help="run the workers under cProfile, writing here")
    parser.add_argument("--top", type=int, default=25, help="profile entries to print")
    args = parser.parse_args(argv)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)

    rows = []
    with broker(args.bootstrap) as bootstrap:
        for n in (int(x) for x in args.workers.split(",")):
            rounds = asyncio.run(runs(bootstrap, n, args))
            r = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
            other = r["machine"] * (os.cpu_count() or 1) - r["worker_cpu"] - r["bench_cpu"]
            rows.append((f"{n}", r["wall"], r["calls_s"], r["steps_s"], max(x["steps_s"] for x in rounds),
                         r["submit"], r["worker_cpu"], r["bench_cpu"], other, f"{r['machine']:.0%}",
                         int(sum(x["failed"] for x in rounds))))
    print()
    print(f"Throughput: {args.sessions} sessions x 1 tool call x {args.steps} steps, {args.partitions} partitions,"
          f" {os.cpu_count()} cores (broker + workers + bench on the same machine)")
    print(table(["workers", "wall (s)", "tool calls/s", "steps/s", "best steps/s", "submit all (s)", "CPU workers",
                 "CPU bench", "CPU broker+rest", "machine busy", "not completed"], rows))
    print(f"(median of {args.repeat} rounds; CPU columns: cores' worth of CPU time over the timed window)")
    if args.profile:
        for path in sorted(args.profile.glob("worker-*.prof")):
            print()
            print_profile(path, args.top, f"{path.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
