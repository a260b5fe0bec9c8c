"""The gateway's cost: a message's round trip through HTTP vs ``HarnessClient``, and one
session's events fanned out to many SSE subscribers.

    python bench/gateway.py [--turns 100] [--subscribers 1000] [--messages 10]

Runs ``harness serve`` (gateway + worker in one process) on a fresh SQLite file, with
the bench app (a turn = one tool call of 3 no-op ``step.do``). Then, interleaved turn by
turn on the same worker:

* HTTP: ``POST /v1/sessions/{id}/messages``, then the session's SSE stream from the
  input's position until its ``harness.input.settled``;
* HTTP, stream held: the session's SSE stream stays open (as the web console keeps it);
  ``POST`` a message, read the same stream on until its settlement;
* direct: ``HarnessClient(log=...).send`` + ``wait_settled`` (from the send's receipt)
  on the same file.

Then ``--subscribers`` SSE streams of one session stay open while ``--messages`` turns
run in it: every record reaches every stream; the events/s delivered and the gateway's
resident memory per stream are printed. Last line: ``ratio=<http p50 / direct p50> ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench._common import pct, start_harness, table  # noqa: E402
from harness.client import HarnessClient  # noqa: E402
from harness.log import open_log  # noqa: E402

HARNESS = "bench/app"
TURN = "steps=3"


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def read_until_settled(http: httpx.AsyncClient, sid: str, after: int, input_id: str) -> None:
    async with http.stream("GET", f"/v1/sessions/{sid}/events", params={"after": after}) as response:
        event = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "harness.input.settled" and f'"input_id":"{input_id}"' in line:
                return


async def settlements(lines: Any) -> Any:
    """The input ids of the ``harness.input.settled`` events of an SSE stream's lines."""
    event = ""
    async for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event == "harness.input.settled":
            yield line.split('"input_id":"', 1)[1].split('"', 1)[0]


async def round_trips(url: str, log_url: str, turns: int) -> tuple[list[float], list[float], list[float]]:
    http_ms: list[float] = []
    held_ms: list[float] = []
    direct_ms: list[float] = []
    log = open_log(log_url)
    client = HarnessClient(log=log)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        first = (await http.post("/v1/sessions/rt-held/messages",
                                 json={"text": TURN, "harness": HARNESS, "input_id": "k-first"})).json()
        async with http.stream("GET", "/v1/sessions/rt-held/events", params={"after": first["position"]}) as held:
            settled = settlements(held.aiter_lines())
            for i in range(turns + 2):  # two warm-up turns each
                t0 = time.perf_counter()
                r = (await http.post("/v1/sessions/rt-http/messages",
                                     json={"text": TURN, "harness": HARNESS, "input_id": f"h{i}"})).json()
                await read_until_settled(http, "rt-http", r["position"] - 1, f"h{i}")
                t1 = time.perf_counter()
                await http.post("/v1/sessions/rt-held/messages", json={"text": TURN, "input_id": f"k{i}"})
                async for input_id in settled:
                    if input_id == f"k{i}":
                        break
                t2 = time.perf_counter()
                receipt = await client.send("rt-direct", TURN, harness=HARNESS, input_id=f"d{i}")
                await client.wait_settled("rt-direct", receipt, timeout=60)
                t3 = time.perf_counter()
                if i >= 2:
                    http_ms.append((t1 - t0) * 1000)
                    held_ms.append((t2 - t1) * 1000)
                    direct_ms.append((t3 - t2) * 1000)
    await client.close()
    await log.close()
    return http_ms, held_ms, direct_ms


async def fan_out(url: str, pid: int, subscribers: int, messages: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=subscribers + 10, max_keepalive_connections=subscribers + 10)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120), limits=limits) as http:
        first = (await http.post("/v1/sessions/fan/messages",
                                 json={"text": TURN, "harness": HARNESS, "input_id": "warm"})).json()
        await read_until_settled(http, "fan", first["position"] - 1, "warm")
        start = (await http.get("/v1/sessions/fan")).json()["last_position"]
        rss_before = rss_kib(pid)
        hello = asyncio.Event()
        connected = 0
        received = [0] * subscribers
        done_at = [0.0] * subscribers
        last_input = f"m{messages - 1}"

        async def subscriber(k: int) -> None:
            nonlocal connected
            async with http.stream("GET", "/v1/sessions/fan/events", params={"after": start}) as response:
                event = ""
                async for line in response.aiter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                        if event == "hello":
                            connected += 1
                            if connected == subscribers:
                                hello.set()
                    elif line.startswith("id: "):
                        received[k] += 1
                    elif (line.startswith("data: ") and event == "harness.input.settled"
                          and f'"input_id":"{last_input}"' in line):
                        done_at[k] = time.perf_counter()
                        return

        tasks = [asyncio.create_task(subscriber(k)) for k in range(subscribers)]
        await asyncio.wait_for(hello.wait(), 300)
        rss_connected = rss_kib(pid)
        server_cpu0, client_cpu0 = cpu_s(pid), time.process_time()
        t0 = time.perf_counter()
        for i in range(messages):
            await http.post("/v1/sessions/fan/messages", json={"text": TURN, "harness": HARNESS, "input_id": f"m{i}"})
        await asyncio.wait_for(asyncio.gather(*tasks), 600)
        elapsed = max(done_at) - t0
        server_cpu, client_cpu = cpu_s(pid) - server_cpu0, time.process_time() - client_cpu0
        per_stream = received[0]
        assert all(n == per_stream for n in received), "a stream missed or repeated an event"
    return {
        "subscribers": subscribers,
        "events_per_stream": per_stream,
        "events": per_stream * subscribers,
        "seconds": elapsed,
        "events_per_s": per_stream * subscribers / elapsed,
        "rss_before_kib": rss_before,
        "rss_connected_kib": rss_connected,
        "kib_per_stream": (rss_connected - rss_before) / subscribers,
        "server_cpu_s": server_cpu,
        "client_cpu_s": client_cpu,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log_url = f"sqlite:///{tmp}/bench.db"
        proc = start_harness(["serve", "--log", log_url, "--app", "bench.apps:bench", "--open-access", "--port", "0",
                              "--heartbeat", "30"], ready="serve ready")
        try:
            http_ms, held_ms, direct_ms = asyncio.run(round_trips(proc.url, log_url, args.turns))
            fan = asyncio.run(fan_out(proc.url, proc.proc.pid, args.subscribers, args.messages))
        finally:
            with contextlib.suppress(Exception):
                proc.stop()
    print(f"round trip: message -> settled, {args.turns} sequential turns each (SQLite, gateway + worker in one "
          "process; turn = 1 tool call of 3 no-op steps)\n")
    print(table(["path", "p50 (ms)", "p99 (ms)"], [
        ["HTTP: POST message + SSE until settled", f"{pct(http_ms, 0.5):.1f}", f"{pct(http_ms, 0.99):.1f}"],
        ["HTTP, SSE stream held open: POST message, until settled", f"{pct(held_ms, 0.5):.1f}",
         f"{pct(held_ms, 0.99):.1f}"],
        ["HarnessClient.send + wait_settled", f"{pct(direct_ms, 0.5):.1f}", f"{pct(direct_ms, 0.99):.1f}"],
    ]))
    print(f"\nfan-out: {fan['subscribers']} SSE streams of one session, {args.messages} turns\n")
    print(table(["streams", "events/stream", "events delivered", "seconds", "events/s", "RSS before (MiB)",
                 "RSS with streams (MiB)", "KiB/stream"], [[
        fan["subscribers"], fan["events_per_stream"], fan["events"], f"{fan['seconds']:.2f}",
        f"{fan['events_per_s']:,.0f}", f"{fan['rss_before_kib'] / 1024:.1f}",
        f"{fan['rss_connected_kib'] / 1024:.1f}", f"{fan['kib_per_stream']:.1f}"]]))
    print(f"\nCPU while fanning out: gateway+worker process {fan['server_cpu_s']:.1f} s, "
          f"the subscribers' process {fan['client_cpu_s']:.1f} s (both on the same 2 cores)")
    ratio = pct(http_ms, 0.5) / pct(direct_ms, 0.5)
    print(f"\nratio={ratio:.2f} http_p50_ms={pct(http_ms, 0.5):.1f} held_p50_ms={pct(held_ms, 0.5):.1f} "
          f"direct_p50_ms={pct(direct_ms, 0.5):.1f} "
          f"fanout_events_per_s={fan['events_per_s']:.0f} kib_per_stream={fan['kib_per_stream']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
