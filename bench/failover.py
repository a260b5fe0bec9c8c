"""How long a turn in flight stops when its worker dies (SIGKILL) or is stopped (SIGTERM).

    python bench/failover.py                     # starts its own LocalKafka
    python bench/failover.py --bootstrap 127.0.0.1:9092 --repeat 3 --partitions 6

Two real ``harness worker`` processes (``bench.apps:bench``) share a log of
``--partitions`` partitions. Each round submits a new session whose ``work`` tool runs
many small durable steps (``--steps`` steps, ``--pause-ms`` each), waits until steps are
committing, then signals the worker that owns the session's partition and measures,
from the signal to when the bench sees it committed (read_committed tail):

* ``owned``: the survivor logs ``owning partition p`` (fenced, rebuilt, live);
* ``resumed``: the survivor's ``harness.turn.resumed`` for the session;
* ``step``: the first ``harness.step.result`` after it: the turn moves again.

A replacement worker is then started and the group left to settle before the next
round. Prints a table (p50 / max per signal) of the seconds from signal to each event.

What bounds each:

* SIGKILL: nobody tells the group the worker is gone; the coordinator waits for its
  heartbeats to stop for ``session.timeout.ms`` (``SESSION_TIMEOUT_MS`` in
  ``harness/runtime/group.py``, 6 s; the broker's group.min.session.timeout.ms is the
  floor), then rebalances: the survivor's next poll (every ``POLL_S``) gets the
  partitions and, one partition at a time, runs ``own_partition``
  (``init_transactions``, which also aborts the dead owner's open transaction), reads
  the latest checkpoint, reads the tail after it, folds and goes live. So: about 6 s +
  rebalance + (partitions moved) x (fence + checkpoint read + tail read) + the first
  step of the resumed turn (replaying its finished steps from memory).
* SIGTERM: the worker drains (the ``work`` tool is ``replay="safe"``: it stops at the end
  of the step it is in), stops its sessions (nothing more written), leaves the group
  (``consumer.close()``), and the group rebalances at once: no session timeout. Then
  the same fence + rebuild per moved partition. The cooperative protocol takes two
  rebalance rounds (revoke, then assign).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import (
    HARNESS_NAME,
    Follower,
    WorkerProc,
    broker,
    log_url,
    new_prefix,
    pct,
    table,
    wait_settled_group,
)


async def run(bootstrap: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    from harness.client import HarnessClient
    from harness.log.kafka.log import KafkaLog
    from harness.records import StepResult, TurnResumed
    from harness.runtime.group import SESSION_TIMEOUT_MS

    partitions = args.partitions
    prefix = new_prefix("fo")
    url = log_url(bootstrap, prefix, partitions)
    klog = KafkaLog(bootstrap=bootstrap, topic_prefix=prefix, partitions=partitions)
    await klog.start()  # topics exist before the workers race to create them
    print(f"(log {url}; SESSION_TIMEOUT_MS={SESSION_TIMEOUT_MS})", flush=True)
    workers = [WorkerProc(url, f"w{i}") for i in range(2)]
    client = HarnessClient(bootstrap=bootstrap, topic_prefix=prefix, partitions=partitions)
    results: list[dict[str, Any]] = []
    plan = ["SIGKILL", "SIGTERM"] * args.repeat
    try:
        await asyncio.to_thread(wait_settled_group, workers, partitions, timeout=90)
        async with Follower(klog, partitions) as follow:
            for n, name in enumerate(plan):
                sig = getattr(signal, name)
                sid = f"fo-{n}-{uuid.uuid4().hex[:6]}"
                p = klog.partition_for(sid)
                follow.watch(sid)
                await client.send(sid, f"steps={args.steps} pause_ms={args.pause_ms}", harness=HARNESS_NAME)

                def steps_seen(sid: str = sid) -> int:
                    return sum(isinstance(e.record, StepResult) for _, e in follow.entries[sid])

                await follow.wait_for(lambda s=steps_seen: s() >= 5, 60, f"steps of {sid}")
                victim = next(w for w in workers if w.alive and p in w.owns())
                seen = len(follow.entries[sid])
                moved = len(victim.owns())
                t0, wall0 = time.monotonic(), time.time()
                victim.signal(sig)

                def resumed(sid: str = sid, seen: int = seen) -> tuple[float, float] | None:
                    after = follow.entries[sid][seen:]
                    for i, (t, e) in enumerate(after):
                        if isinstance(e.record, TurnResumed):
                            step = next((t2 for t2, e2 in after[i + 1:] if isinstance(e2.record, StepResult)), None)
                            return (t, step) if step is not None else None
                    return None

                t_resumed, t_step = await follow.wait_for(resumed, 120, f"{sid} to resume after {name}")
                await asyncio.to_thread(victim.proc.wait, 60)
                survivors = [w for w in workers if w is not victim]
                owns = [(ts, q) for w in survivors for kind, q, ts in w.events if kind == "own" and ts >= wall0]
                released = [ts for kind, _, ts in victim.events if kind == "gave_up" and ts >= wall0]
                row = {
                    "signal": name,
                    "released": (max(released) - wall0) if released else float("nan"),
                    "first_owned": (min(owns)[0] - wall0) if owns else float("nan"),
                    "owned": (min(ts for ts, q in owns if q == p) - wall0) if any(q == p for _, q in owns)
                    else float("nan"),
                    "resumed": t_resumed - t0,
                    "step": t_step - t0,
                }
                results.append(row)
                print(f"  round {n + 1}/{len(plan)} {name}: moved {moved} partitions; released "
                      f"{row['released']:.2f}s, first owned {row['first_owned']:.2f}s, session's partition "
                      f"{p} owned {row['owned']:.2f}s, resumed {row['resumed']:.2f}s, step {row['step']:.2f}s "
                      f"(exit code {victim.proc.returncode})", flush=True)
                workers.remove(victim)
                workers.append(WorkerProc(url, f"w{n + 2}"))
                await asyncio.to_thread(wait_settled_group, workers, partitions, quiet=2.0, timeout=90)
    except BaseException:
        for w in workers:
            print(f"--- {w.name} (alive={w.alive}) owns {sorted(w.owns())}\n{w.tail(15)}", file=sys.stderr)
        raise
    finally:
        for w in workers:
            w.stop()
        await client.close()
        await klog.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="host:port of a broker (default: start a LocalKafka)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each signal")
    parser.add_argument("--steps", type=int, default=3000, help="steps of each session's tool call")
    parser.add_argument("--pause-ms", type=float, default=10.0, help="work inside each step")
    args = parser.parse_args(argv)

    with broker(args.bootstrap) as bootstrap:
        results = asyncio.run(run(bootstrap, args))
    rows = []
    labels = (
        ("released", "victim logged its last `gave up partition`"),
        ("first_owned", "survivor owns its first moved partition"),
        ("owned", "survivor owns the session's partition"),
        ("resumed", "harness.turn.resumed committed"),
        ("step", "first harness.step.result after it"),
    )
    for name in ("SIGKILL", "SIGTERM"):
        mine = [r for r in results if r["signal"] == name]
        for key, label in labels:
            xs = [r[key] for r in mine if r[key] == r[key]]  # NaN: not logged (SIGKILL releases nothing)
            if xs:
                rows.append((f"{name}: {label}", pct(xs, 0.5), max(xs), len(xs)))
    print()
    print(f"Failover, 2 workers, {args.partitions} partitions: seconds from the signal to")
    print(table(["what", "p50 (s)", "max (s)", "n"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
