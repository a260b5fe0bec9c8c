"""Turns/s through the HTTP gateway on Kafka, against ``HarnessClient`` on the same worker.

    python bench/gateway_load.py --bootstrap 127.0.0.1:9092 [--clients 32] [--window 10] [--rounds 3]

One ``harness worker`` and one ``harness gateway`` (``--open-access``) on a fresh
``--partitions`` (6) partition Kafka log. A turn is ``bench/e2e.py``'s: a new session,
one tool call of 3 no-op durable steps. ``--clients`` closed-loop clients in alternating
windows of ``--window`` seconds (``--rounds`` of each), so the machine's drift hits both
paths alike:

* HTTP: ``POST /v1/sessions/{id}/messages``, then the session's SSE stream from the
  input's position until its ``harness.input.settled`` (httpx, from this process);
* HTTP wait: one ``POST /v1/sessions/{id}/messages?wait=60`` that answers with the
  turn's settlement (no event stream);
* direct: ``HarnessClient.send`` + ``wait_settled`` from its receipt (this process).

Prints per path: turns/s, p50 per turn, and the CPU ms per turn of the gateway, the
worker, the broker and this process (the load: httpx for HTTP, the client for direct);
everything shares the machine's cores. Last line:
``ratio=<HTTP turns/s / direct turns/s> http_turns_per_s=... direct_turns_per_s=...
wait_ratio=<HTTP wait turns/s / direct turns/s> http_wait_turns_per_s=...``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench._common import (
    HARNESS_NAME,
    WorkerProc,
    add_bootstrap_option,
    broker,
    listening_pid,
    log_url,
    new_prefix,
    process_cpu_seconds,
    start_harness,
    table,
    wait_settled_group,
    warm_broker,
)
from bench.e2e import closed_loop

TEXT = "steps=3"


async def run(bootstrap: str, args: argparse.Namespace) -> None:
    from harness.client import HarnessClient
    from harness.log.kafka.log import KafkaLog

    prefix = new_prefix("gwload")
    url = log_url(bootstrap, prefix, args.partitions)
    admin = KafkaLog(bootstrap=bootstrap, topic_prefix=prefix, partitions=args.partitions)
    await admin.start()
    await admin.close()
    worker = WorkerProc(url, "w0")
    gateway = None
    client = HarnessClient(bootstrap=bootstrap, topic_prefix=prefix, partitions=args.partitions)
    limits = httpx.Limits(max_connections=args.clients * 2 + 10, max_keepalive_connections=args.clients * 2 + 10)
    try:
        await asyncio.to_thread(wait_settled_group, [worker], args.partitions, timeout=90)
        gateway = start_harness(["gateway", "--log", url, "--open-access", "--port", str(args.port)],
                                ready="gateway ready")
        await client.log.start()  # type: ignore[attr-defined]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{args.port}", timeout=60, limits=limits) as http:

            async def http_turn(sid: str) -> None:
                response = await http.post(f"/v1/sessions/{sid}/messages",
                                           json={"text": TEXT, "harness": HARNESS_NAME, "input_id": f"in-{sid}"})
                response.raise_for_status()
                position = response.json()["position"]
                async with http.stream("GET", f"/v1/sessions/{sid}/events", params={"after": position - 1}) as events:
                    event = ""
                    async for line in events.aiter_lines():
                        if line.startswith("event: "):
                            event = line[7:]
                        elif line.startswith("data: ") and event == "harness.input.settled":
                            assert '"outcome":"completed"' in line, line
                            return

            async def http_wait_turn(sid: str) -> None:
                response = await http.post(f"/v1/sessions/{sid}/messages", params={"wait": 60},
                                           json={"text": TEXT, "harness": HARNESS_NAME, "input_id": f"in-{sid}"})
                response.raise_for_status()
                settlement = response.json()["settlement"]
                assert settlement["outcome"] == "completed", settlement

            async def direct_turn(sid: str) -> None:
                receipt = await client.send(sid, TEXT, harness=HARNESS_NAME, input_id=f"in-{sid}")
                settled = await client.wait_settled(sid, receipt, timeout=60)
                assert settled.outcome == "completed", settled

            paths = {"HTTP gateway": http_turn, "HTTP gateway, ?wait": http_wait_turn, "HarnessClient": direct_turn}
            broker_pid = listening_pid(int(bootstrap.rsplit(":", 1)[1]))

            async def load(seconds: float) -> None:  # warm up both paths, and the broker's JIT
                for turn in paths.values():
                    await closed_loop(turn, args.clients, seconds / 2, "warm")

            warm = await warm_broker(load, broker_pid, least=args.warmup, most=args.warmup_max)
            print(f"  warmed up in {warm['seconds']:.0f} s", flush=True)
            results: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
            for _ in range(args.rounds):
                for name, turn in paths.items():
                    before = (process_cpu_seconds(gateway.proc.pid), worker.cpu_seconds(),
                              process_cpu_seconds(broker_pid) if broker_pid else float("nan"), time.process_time())
                    rate, latencies = await closed_loop(turn, args.clients, args.window, "loop")
                    after = (process_cpu_seconds(gateway.proc.pid), worker.cpu_seconds(),
                             process_cpu_seconds(broker_pid) if broker_pid else float("nan"), time.process_time())
                    n = max(1, len(latencies))
                    cpu = [(b - a) * 1000 / n for a, b in zip(before, after, strict=True)]
                    results[name].append({"rate": rate, "p50": statistics.median(latencies) * 1000,
                                          "gateway": cpu[0], "worker": cpu[1], "broker": cpu[2], "load": cpu[3]})
                    print(f"  {name}: {rate:.0f} turns/s", flush=True)
    finally:
        await client.close()
        if gateway is not None:
            gateway.stop()
        worker.stop()

    def mean(name: str, key: str) -> float:
        return statistics.mean(r[key] for r in results[name])

    print()
    print(table(["path (a new session per turn)", f"turns/s, {args.clients} clients", "p50 ms",
                 "CPU ms/turn gateway", "worker", "broker", "this process"],
                [(name, mean(name, "rate"), mean(name, "p50"), mean(name, "gateway"), mean(name, "worker"),
                  mean(name, "broker"), mean(name, "load")) for name in results]))
    http_rate, direct_rate = mean("HTTP gateway", "rate"), mean("HarnessClient", "rate")
    wait_rate = mean("HTTP gateway, ?wait", "rate")
    print(f"ratio={http_rate / direct_rate:.3f} http_turns_per_s={http_rate:.0f} direct_turns_per_s={direct_rate:.0f} "
          f"wait_ratio={wait_rate / direct_rate:.3f} http_wait_turns_per_s={wait_rate:.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bootstrap_option(parser)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--window", type=float, default=10.0, help="seconds per window")
    parser.add_argument("--rounds", type=int, default=3, help="windows of each path")
    parser.add_argument("--warmup", type=float, default=20.0,
                        help="least seconds of untimed load first (both paths); it goes on while a local "
                             "broker's JIT still compiles (jstat), up to --warmup-max")
    parser.add_argument("--warmup-max", type=float, default=120.0, help="most seconds of that warm-up")
    parser.add_argument("--port", type=int, default=18431, help="the gateway's HTTP port")
    args = parser.parse_args(argv)
    with broker(args.bootstrap) as bootstrap:
        asyncio.run(run(bootstrap, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
