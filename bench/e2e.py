"""End to end on Kafka: a client's message to its settled turn, as deployed.

    python bench/e2e.py --bootstrap 127.0.0.1:9092                 # a fresh topic
    python bench/e2e.py --bootstrap 127.0.0.1:9092 --prefix P      # again on the same topics

A turn is one user message whose scripted model calls one tool of ``--steps`` (3) no-op
durable ``step.do``, then answers (``bench.apps:bench``, ``steps=3``); every turn is a
new session. Measured side by side in one run:

(a) deployed: one ``harness worker`` process on a ``--partitions`` (6) partition log;
    ``HarnessClient.send`` + ``wait_settled`` from this process: after at least ``--warmup``
    (20) seconds of untimed load, and on a local broker until its JIT has compiled the hot
    code (a broker that runs for long has; a new one spends ~35 s of this load in its JIT,
    read with ``jstat``, at most ``--warmup-max`` (120) s), ``--turns`` (200) sequential
    turns (p50 / p99), then ``--clients`` (32) closed-loop clients for ``--seconds`` (15)
    (turns/s).
(b) the same turns in-process: ``HarnessHost`` on Kafka (its own topics, ``<prefix>h``,
    no worker), sequential then closed loop.
(c) the floor: the turn's sequential commits, counted from the log (runs of consecutive
    offsets of a session's records: one append is contiguous, two transactions are
    separated by their commit marker; the input's produce counts as one), times the p50
    of a bare confluent-kafka transaction (begin, produce one record, commit) measured
    interleaved with (a)'s sequential turns in blocks of 20.

Also: a new session's first turn against its second turn on the in-process Kafka host,
and (for reference) the in-process host on SQLite. Last line:
``e2e_p50_ms=<(a) p50> turns_per_s=<(a) closed loop> floor_ratio=<(a) p50 / (c)>
probe_ms=<the machine's speed> turn_cost=<(worker + broker CPU a turn) / client CPU a turn>``.
Run twice on the same topics (``--prefix``), turns/s moves with the machine's speed;
``turn_cost`` divides it out (see :func:`turn_cost`), so it shows whether a turn costs
more on a grown topic.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import (
    HARNESS_NAME,
    SpeedProbe,
    WorkerProc,
    add_bootstrap_option,
    broker,
    listening_pid,
    log_url,
    machine_busy,
    machine_stolen,
    new_prefix,
    pct,
    print_profile,
    process_cpu_seconds,
    table,
    wait_settled_group,
    warm_broker,
)

BLOCK = 20


def bare_transaction(bootstrap: str, topic: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """One bare transaction per call: begin, produce one turn-sized record, commit; and
    the producer's close (before the broker stops, or its reconnects print at exit)."""
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from harness.codec import default_codec
    from harness.records import StepResult

    admin = AdminClient({"bootstrap.servers": bootstrap})
    with contextlib.suppress(KafkaException):  # exists from an earlier run
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
        "linger.ms": 0,
        "retry.backoff.ms": 10,
        "transaction.timeout.ms": 10000,
        "socket.nagle.disable": True,
    })
    producer.init_transactions(30)
    value = default_codec().encode(StepResult("bench-session", 0, "work", "s0", 1))

    def transaction() -> None:
        producer.begin_transaction()
        producer.produce(topic, value=value, key=b"bench-session", partition=0)
        producer.commit_transaction(30)

    return transaction, producer.close


def partition_ends(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """The last stable offset of every partition (what read_committed readers see)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ends", "isolation.level": "read_committed"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in range(partitions)]
    finally:
        consumer.close()


def commits_of(entries: list[Any]) -> int:
    """The sequential writes that made a session's records: runs of consecutive positions
    (one append is contiguous; two transactions are separated by a commit marker), and
    each input on its own (a plain produce: no marker after it)."""
    commits = 0
    previous: Any = None
    for entry in sorted(entries, key=lambda e: e.seq):
        if previous is None or entry.seq != previous.seq + 1 or previous.record.IS_INPUT or entry.record.IS_INPUT:
            commits += 1
        previous = entry
    return commits


def sum_p50(samples: list[float], k: int, rounds: int = 5000) -> float:
    """p50 (ms) of the sum of ``k`` transactions drawn from ``samples``: what ``k`` commits
    in a row cost when each varies like the measured ones (a right-skewed distribution
    makes it more than ``k`` x the p50)."""
    rng = random.Random(7)
    return pct([sum(rng.choice(samples) for _ in range(k)) for _ in range(rounds)], 0.5) * 1000


def stats(samples: list[float]) -> tuple[float, float]:
    return pct(samples, 0.5) * 1000, pct(samples, 0.99) * 1000


async def closed_loop(turn: Callable[[str], Awaitable[None]], clients: int, seconds: float, tag: str
                      ) -> tuple[float, list[float]]:
    """``clients`` loops, each running one turn after another for ``seconds``: (turns/s, latencies)."""
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    async def client(k: int) -> None:
        n = 0
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            await turn(f"{tag}-{k}-{n}-{uuid.uuid4().hex[:6]}")
            latencies.append(time.perf_counter() - t0)
            n += 1

    t0 = time.monotonic()
    await asyncio.gather(*(client(k) for k in range(clients)))
    return len(latencies) / (time.monotonic() - t0), latencies


# --- (a) deployed ----------------------------------------------------------------------------


async def deployed(bootstrap: str, prefix: str, args: argparse.Namespace, probe: SpeedProbe) -> dict[str, Any]:
    from harness.client import HarnessClient
    from harness.log.kafka.log import KafkaLog

    url = log_url(bootstrap, prefix, args.partitions)
    admin = KafkaLog(bootstrap=bootstrap, topic_prefix=prefix, partitions=args.partitions)
    await admin.start()  # clients never create topics: make them (an earlier run's stay as they are)
    await admin.close()
    client = HarnessClient(bootstrap=bootstrap, topic_prefix=prefix, partitions=args.partitions)
    await client.log.start()  # type: ignore[attr-defined]
    worker = WorkerProc(url, "w0", profile=args.profile / "worker.prof" if args.profile else None)
    text = f"steps={args.steps}"
    out: dict[str, Any] = {"warm": {"seconds": 0.0, "jit_share": None}}
    closing: list[Callable[[], None]] = []
    try:
        await asyncio.to_thread(wait_settled_group, [worker], args.partitions, timeout=90)

        async def turn(sid: str) -> None:
            receipt = await client.send(sid, text, harness=HARNESS_NAME, input_id=f"in-{sid}")
            settled = await client.wait_settled(sid, receipt, timeout=60)
            assert settled.outcome == "completed", settled

        for k in range(10):  # warm up: producers, consumers, the worker's first sessions
            await turn(f"warm-{k}-{uuid.uuid4().hex[:6]}")
        broker_pid = listening_pid(int(bootstrap.rsplit(":", 1)[1]))
        if args.warmup > 0:  # and the broker's JIT under load, as a broker that runs for long is

            async def load(seconds: float) -> None:
                await closed_loop(turn, args.clients, seconds, "warm")

            out["warm"] = await warm_broker(load, broker_pid, least=args.warmup, most=args.warmup_max)
        bare, close_bare = await asyncio.to_thread(bare_transaction, bootstrap, f"{prefix}.raw")
        closing.append(close_bare)
        for _ in range(BLOCK):
            bare()
        seq_lat: list[float] = []
        base: list[float] = []
        sessions: list[str] = []
        while len(seq_lat) < args.turns:
            for _ in range(BLOCK):
                sid = f"seq-{uuid.uuid4().hex[:10]}"
                t0 = time.perf_counter()
                await turn(sid)
                seq_lat.append(time.perf_counter() - t0)
                sessions.append(sid)
            for _ in range(BLOCK):
                t0 = time.perf_counter()
                bare()
                base.append(time.perf_counter() - t0)
        commits = [commits_of(await client.log.read(sid)) for sid in sessions[:20]]
        pickup = []  # input acknowledged -> the worker's turn.started visible (one commit included)
        for _ in range(20):
            sid = f"pick-{uuid.uuid4().hex[:10]}"
            receipt = await client.send(sid, text, harness=HARNESS_NAME, input_id=f"in-{sid}")
            t0 = time.perf_counter()
            async with contextlib.aclosing(client.events(sid, after=receipt.position)) as entries:
                async for entry in entries:
                    if entry.type == "harness.turn.started":
                        pickup.append(time.perf_counter() - t0)
                    if entry.type == "harness.input.settled":
                        break
        out["pickup"] = pickup
        out["commits"] = int(statistics.median(commits))
        out["seq"] = seq_lat
        out["bare"] = base
        cpu0, own0, busy0 = worker.cpu_seconds(), time.process_time(), machine_busy()
        stolen0 = machine_stolen()
        broker0 = process_cpu_seconds(broker_pid) if broker_pid else float("nan")
        ends0 = await asyncio.to_thread(partition_ends, bootstrap, f"{prefix}.sessions", args.partitions)
        loop_start = time.monotonic()
        rate, lat = await closed_loop(turn, args.clients, args.seconds, "loop")
        out["probe_ms"] = probe.mean_ms(loop_start, time.monotonic())
        cpu1, own1, busy1 = worker.cpu_seconds(), time.process_time(), machine_busy()
        stolen1 = machine_stolen()
        ends1 = await asyncio.to_thread(partition_ends, bootstrap, f"{prefix}.sessions", args.partitions)
        # Every committed transaction leaves one marker (an offset without a record) in
        # its partition: transactions = offsets - records, in the closed loop's window.
        offsets = sum(e1 - e0 for e0, e1 in zip(ends0, ends1, strict=True))
        records = 0
        for p, (e0, e1) in enumerate(zip(ends0, ends1, strict=True)):
            records += len(await client.log.read_partition(p, e0, e1))  # type: ignore[attr-defined]
        out["transactions"] = offsets - records
        out["appends"] = len(lat) * (out["commits"] - 1)  # all but the input are appends of the owner
        broker1 = process_cpu_seconds(broker_pid) if broker_pid else float("nan")
        out["rate"], out["loop"] = rate, lat
        turns = max(1, len(lat))
        out["cpu_per_turn"] = {  # ms of CPU per turn in the closed loop
            "worker process": (cpu1 - cpu0) * 1000 / turns,
            "client process (this one)": (own1 - own0) * 1000 / turns,
            "broker": (broker1 - broker0) * 1000 / turns,
        }
        out["machine_busy"] = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1])
        out["stolen"] = (stolen1[0] - stolen0[0]) / max(1, stolen1[1] - stolen0[1])
    finally:
        for close in closing:
            close()
        await client.close()
        worker.stop()
    if args.profile:
        print_profile(args.profile / "worker.prof", 25, "worker")
    return out


def turn_cost(a: dict[str, Any]) -> float:
    """The worker's and the broker's CPU ms of a closed-loop turn over this bench's own
    (the client's) CPU ms of it. The client's work a turn does not depend on the topic
    (it sends, then reads from the input's position), so it is a control for the
    machine's speed, which moves every process's CPU a turn alike (measured: +-20% between
    two runs minutes apart). Two runs on the same topics compare by this figure when
    turns/s moved with the machine: a turn that cost more on a grown topic raises it. nan
    when the broker is not a process of this machine (its CPU is unknown)."""
    cpu = a["cpu_per_turn"]
    return float((cpu["worker process"] + cpu["broker"]) / cpu["client process (this one)"])


# --- (b) in-process ---------------------------------------------------------------------------


async def in_process(url: str, args: argparse.Namespace, *, first_vs_later: bool) -> dict[str, Any]:
    from bench.apps import bench
    from harness import HarnessHost, open_log

    log = open_log(url)
    host = HarnessHost(log=log)  # (a host closes only a log it opened from a URL)
    text = f"steps={args.steps}"
    out: dict[str, Any] = {}

    async def turn(sid: str) -> None:
        session = await host.open(bench, session_id=sid)
        try:
            result = await session.send(text, input_id=f"in-{sid}")
            assert result.outcome == "completed", result
        finally:
            await session.close()

    try:
        for k in range(10):
            await turn(f"warm-{k}-{uuid.uuid4().hex[:6]}")
        seq_lat = []
        for _ in range(args.turns):
            t0 = time.perf_counter()
            await turn(f"seq-{uuid.uuid4().hex[:10]}")
            seq_lat.append(time.perf_counter() - t0)
        out["seq"] = seq_lat
        out["rate"], out["loop"] = await closed_loop(turn, args.clients, args.seconds, "loop")
        if first_vs_later:
            first, later = [], []
            for k in range(args.pairs):
                sid = f"pair-{k}-{uuid.uuid4().hex[:6]}"
                t0 = time.perf_counter()
                session = await host.open(bench, session_id=sid)
                r1 = await session.send(text, input_id=f"in-{sid}-1")
                t1 = time.perf_counter()
                r2 = await session.send(text, input_id=f"in-{sid}-2")
                t2 = time.perf_counter()
                await session.close()
                assert r1.outcome == r2.outcome == "completed", (r1, r2)
                first.append(t1 - t0)
                later.append(t2 - t1)
            out["first"], out["later"] = first, later
    finally:
        await host.close()
        await log.close()
    return out


# --- main ---------------------------------------------------------------------------------------


async def run(bootstrap: str, args: argparse.Namespace) -> None:
    prefix = args.prefix or new_prefix("e2e")
    print(f"topics: {prefix}.* (deployed), {prefix}h.* (in-process); {os.cpu_count()} cores; "
          f"a turn = 1 tool call of {args.steps} steps; {args.partitions} partitions", flush=True)
    probe = SpeedProbe()
    try:
        a = await deployed(bootstrap, prefix, args, probe)
        print("(a) done", flush=True)
        b = await in_process(log_url(bootstrap, f"{prefix}h", args.partitions), args, first_vs_later=True)
        print("(b) done", flush=True)
        sq: dict[str, Any] = {}
        if args.sqlite:
            with tempfile.TemporaryDirectory() as tmp:
                sq = await in_process(f"sqlite:///{tmp}/e2e.db", args, first_vs_later=False)
        fastest_ms = probe.fastest_ms()
    finally:
        probe.close()
    bare_p50 = pct(a["bare"], 0.5) * 1000
    floor = a["commits"] * bare_p50
    a50, a99 = stats(a["seq"])
    b50, b99 = stats(b["seq"])
    rows = [
        ("(a) worker process + HarnessClient.send/wait_settled", a50, a99, stats(a["loop"])[0], a["rate"]),
        ("(b) HarnessHost in-process on Kafka", b50, b99, stats(b["loop"])[0], b["rate"]),
    ]
    if sq:
        s50, s99 = stats(sq["seq"])
        rows.append(("HarnessHost in-process on SQLite", s50, s99, stats(sq["loop"])[0], sq["rate"]))
    print()
    print(table(["path (a new session per turn)", "p50 ms", "p99 ms",
                 f"p50 ms, {args.clients} clients", f"turns/s, {args.clients} clients"], rows))
    print()
    print(table(["floor", "value"], [
        ("sequential commits per turn (from the log)", a["commits"]),
        ("bare Kafka transaction p50 ms (interleaved with (a))", bare_p50),
        ("bare Kafka transaction p99 ms", pct(a["bare"], 0.99) * 1000),
        ("(c) floor ms = commits x bare p50", floor),
        ("p50 ms of the sum of that many bare transactions (resampled: their variance)", sum_p50(a["bare"], a["commits"])),
        ("pickup ms: input acknowledged -> turn.started seen (p50, one commit included)", pct(a["pickup"], 0.5) * 1000),
        ("(a) p50 / floor", a50 / floor),
        ("(b) p50 / floor", b50 / floor),
        ("(a) closed loop: transactions per turn", a["transactions"] / max(1, len(a["loop"]))),
        ("(a) closed loop: appends per transaction (group commit)", a["appends"] / max(1, a["transactions"])),
        *((f"(a) closed loop: CPU ms per turn, {who}", ms) for who, ms in a["cpu_per_turn"].items()),
        ("(a) closed loop: machine busy (share of all cores)", a["machine_busy"]),
        ("(a) closed loop: of it, taken by the host (steal: another guest ran)", a["stolen"]),
        ("(a) warm-up s (until a local broker's JIT took < 5% of its CPU in 5 s)", a["warm"]["seconds"]),
        ("(a) warm-up: the JIT's share of the broker's CPU in its last 5 s (nan: unknown)",
         float("nan") if a["warm"]["jit_share"] is None else a["warm"]["jit_share"]),
        ("(a) closed loop: machine speed: CPU ms of a fixed piece of work (mean; SpeedProbe)", a["probe_ms"]),
        ("the same piece of work at this run's fastest (5th percentile over the run)", fastest_ms),
        ("(a) closed loop: worker + broker CPU a turn / client CPU a turn (turn_cost)", turn_cost(a)),
    ]))
    print()
    first50, later50 = pct(b["first"], 0.5) * 1000, pct(b["later"], 0.5) * 1000
    print(table(["in-process Kafka host", "p50 ms", "p99 ms"], [
        ("a new session's first turn (open + send)", first50, pct(b["first"], 0.99) * 1000),
        ("its second turn (send)", later50, pct(b["later"], 0.99) * 1000),
    ]))
    print(f"first_turn_ratio={first50 / later50:.2f}")
    print(f"prefix={prefix}")
    print(f"e2e_p50_ms={a50:.1f} turns_per_s={a['rate']:.0f} floor_ratio={a50 / floor:.2f} "
          f"probe_ms={a['probe_ms']:.2f} turn_cost={turn_cost(a):.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bootstrap_option(parser)
    parser.add_argument("--prefix", help="topic prefix: give the one of an earlier run to run on the same topics")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--turns", type=int, default=200, help="sequential turns per path")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15.0, help="closed-loop time per path")
    parser.add_argument("--pairs", type=int, default=50, help="first/second turn pairs (in-process Kafka)")
    parser.add_argument("--warmup", type=float, default=20.0,
                        help="least seconds of untimed closed loop before (a) is measured; it goes on while "
                             "a local broker's JIT still compiles (jstat), up to --warmup-max")
    parser.add_argument("--warmup-max", type=float, default=120.0, help="most seconds of that warm-up")
    parser.add_argument("--no-sqlite", dest="sqlite", action="store_false", help="skip the SQLite reference")
    parser.add_argument("--profile", type=Path, help="cProfile the worker into this directory")
    args = parser.parse_args(argv)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    with broker(args.bootstrap) as bootstrap:
        asyncio.run(run(bootstrap, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
