"""A long-running reader's session listing on a grown Kafka log (``GET /v1/sessions``).

    python bench/listing.py --bootstrap 127.0.0.1:9092

A log first filled with ``--sessions`` (120,000) ended sessions, served by one
``harness worker`` (its checkpoints hold them). Then ``--rounds`` (5) times: ``--turns``
(20) new turns through the worker, and the listing, both ways, side by side:

* one-shot: ``list_sessions(log)``, each partition from its latest checkpoint plus the
  tail (what every gateway request did before the gateway kept an index);
* kept index: ``KafkaSessionIndex.summaries()`` of one index kept across the rounds (what
  the gateway does now): each partition read on from where the previous listing stopped.

Both must list the same sessions in the same states. Last line:
``oneshot_ms=<p50> index_ms=<p50> ratio=<index / one-shot>``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import add_bootstrap_option, broker, new_prefix, table
from bench.growth import Deployed, fill


async def run(bootstrap: str, args: argparse.Namespace) -> None:
    from harness.log.kafka.log import KafkaLog
    from harness.runtime.catalog import KafkaSessionIndex, list_sessions

    args.clients, args.window = 1, 0.0
    d = Deployed(bootstrap, new_prefix("listing"), args)
    reader = KafkaLog(bootstrap=bootstrap, topic_prefix=d.prefix, partitions=args.partitions, create_topics=False)
    try:
        await d.start()
        t0 = time.monotonic()
        records = await asyncio.to_thread(fill, bootstrap, d.prefix, args.partitions, args.sessions)
        print(f"{args.sessions:,} ended sessions ({records:,} records) written in {time.monotonic() - t0:.0f} s",
              flush=True)
        d.start_worker()
        await d.ready()
        index = KafkaSessionIndex(reader)
        t0 = time.perf_counter()
        listed = await index.summaries()
        first_ms = (time.perf_counter() - t0) * 1000
        print(f"the index's first listing: {len(listed):,} sessions in {first_ms:.0f} ms", flush=True)
        oneshot, kept = [], []
        for r in range(args.rounds):
            for k in range(args.turns):
                await d.turn(f"new-{r}-{k}-{uuid.uuid4().hex[:6]}")
            t0 = time.perf_counter()
            fresh = await list_sessions(reader)
            oneshot.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            mine = await index.summaries()
            kept.append((time.perf_counter() - t0) * 1000)
            states = {s.session_id: s.state for s in fresh}
            assert states == {s.session_id: s.state for s in mine}, "the two listings differ"
            print(f"round {r + 1}: {len(states):,} sessions; one-shot {oneshot[-1]:.0f} ms, "
                  f"kept index {kept[-1]:.1f} ms", flush=True)
    finally:
        await reader.close()
        await d.close()
    a, b = statistics.median(oneshot), statistics.median(kept)
    print()
    print(table(["listing", "p50 ms", "max ms"], [
        ("one-shot (checkpoint + tail, every call)", a, max(oneshot)),
        ("kept index (what came since)", b, max(kept)),
        ("kept index, its first listing", first_ms, first_ms),
    ]))
    print(f"oneshot_ms={a:.1f} index_ms={b:.1f} ratio={b / a:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bootstrap_option(parser)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--sessions", type=int, default=120_000, help="ended sessions the log holds first")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--turns", type=int, default=20, help="new turns before each listing")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with broker(args.bootstrap) as bootstrap:
        asyncio.run(run(bootstrap, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
