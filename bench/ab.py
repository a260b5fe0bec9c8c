"""Two workers side by side on one broker, A and B, that differ by environment or by code.

    python bench/ab.py --b-env HARNESS_CPU_POLICY=normal          # a setting
    python bench/ab.py --b-root ../other-checkout                 # B runs another checkout
    python bench/ab.py                                            # A/A: the tool's own noise

On this 2-core machine the same code runs at 170-250 turns/s from one run to the next, so
a change of a few percent can only be seen side by side. Each side has its own log (its
own topics), its own ``harness worker`` and the same turns as ``bench/e2e.py`` (a):
``HarnessClient.send`` + ``wait_settled`` from this process, a new session per turn, one
tool call of ``--steps`` (3) no-op steps, ``--clients`` (32) closed-loop clients. Windows
of ``--window`` (8) seconds alternate (A B, B A, ...) for ``--rounds`` (6) rounds, so
the machine's drift hits both sides alike.

Run it more than once: one run of a change with no effect (uvloop for the worker's loop,
0.98 and 0.99 in the next two runs) once said 1.16.

The two places are not equal (the second log of a run came out 1-7% faster in A/A runs),
so the whole run is made twice: first A in the first place and B in the second, then
swapped, each time with new workers and new topics. A figure of a side is over both runs;
the ratios are the geometric mean of the two runs' ratios, which cancels the place.

Prints per side: turns/s, CPU ms per turn of its worker and of the broker, the worker's
context switches per turn; then each run's ratio. Last line: ``ratio=<B/A turns/s>
worker_cpu_ratio=<B/A> broker_cpu_ratio=<B/A>``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import ROOT, add_bootstrap_option, broker, listening_pid, new_prefix, table
from bench.growth import Deployed


@dataclass
class Side:
    """One of the two things compared, over both runs."""

    name: str
    env: dict[str, str]
    root: Path
    turns: int = 0
    seconds: float = 0.0
    worker_cpu: float = 0.0
    broker_cpu: float = 0.0
    switches: int = 0
    rates: list[float] = field(default_factory=list)  # turns/s of each run
    worker_per_turn: list[float] = field(default_factory=list)
    broker_per_turn: list[float] = field(default_factory=list)


def env_pairs(items: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"bench/ab.py: {flag} {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


def code_of(root: Path) -> str:
    """Where a worker started in ``root`` imports ``harness`` from, and that checkout's commit."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    where = subprocess.run([sys.executable, "-c", "import harness; print(harness.__file__)"], cwd=root, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    commit = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %s"], capture_output=True,
                            text=True).stdout.strip()
    return f"{where} ({commit or 'not a git checkout'})"


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of ``pid`` so far."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as status:
                for line in status:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except OSError:
            pass  # a thread that ended
    return total


async def one_run(bootstrap: str, first: Side, second: Side, args: argparse.Namespace, number: int) -> None:
    stem = new_prefix("ab")
    places = [(first, Deployed(bootstrap, f"{stem}1", args)), (second, Deployed(bootstrap, f"{stem}2", args))]
    broker_pid = listening_pid(int(bootstrap.rsplit(":", 1)[1]))
    totals: dict[str, list[float]] = {side.name: [0, 0.0, 0.0, 0.0] for side, _d in places}
    try:
        for side, deployed in places:
            await deployed.start()
            deployed.start_worker(env=side.env, root=side.root)
        for _side, deployed in places:
            await deployed.ready()
        for _side, deployed in places:  # one untimed window each: JIT, caches, the client's tails
            await deployed.window(broker_pid)
        for r in range(args.rounds):
            for side, deployed in places if r % 2 == 0 else places[::-1]:
                assert deployed.worker is not None
                pid = deployed.worker.proc.pid
                turns0, seconds0 = deployed.turns, deployed.seconds
                worker0, broker0, switches0 = deployed.worker_cpu, deployed.broker_cpu, context_switches(pid)
                await deployed.window(broker_pid)
                total = totals[side.name]
                total[0] += deployed.turns - turns0
                total[1] += deployed.seconds - seconds0
                total[2] += deployed.worker_cpu - worker0
                total[3] += deployed.broker_cpu - broker0
                side.switches += context_switches(pid) - switches0
            print(f"run {number} round {r + 1}: " + ", ".join(
                f"{side.name} {totals[side.name][0] / totals[side.name][1]:.0f}" for side, _d in places
            ) + " turns/s so far", flush=True)
    finally:
        for _side, deployed in places:
            await deployed.close()
    for side, _d in places:
        turns, seconds, worker_cpu, broker_cpu = totals[side.name]
        side.turns += int(turns)
        side.seconds += seconds
        side.worker_cpu += worker_cpu
        side.broker_cpu += broker_cpu
        side.rates.append(turns / seconds)
        side.worker_per_turn.append(worker_cpu * 1000 / max(1, turns))
        side.broker_per_turn.append(broker_cpu * 1000 / max(1, turns))


def geometric_ratio(b: list[float], a: list[float]) -> float:
    return math.exp(sum(math.log(x / y) for x, y in zip(b, a, strict=True)) / len(a))


async def run(bootstrap: str, a: Side, b: Side, args: argparse.Namespace) -> None:
    for side in (a, b):
        print(f"{side.name}: {code_of(side.root)}; environment {side.env or '(as this process)'}", flush=True)
    print(f"{os.cpu_count()} cores; {args.partitions} partitions; {args.clients} clients; "
          f"{args.rounds} rounds of {args.window:g} s windows per run; 2 runs (places swapped)", flush=True)
    await one_run(bootstrap, a, b, args, 1)
    await one_run(bootstrap, b, a, args, 2)

    def row(side: Side) -> tuple[Any, ...]:
        turns = max(1, side.turns)
        return (side.name, side.turns / side.seconds, side.worker_cpu * 1000 / turns,
                side.broker_cpu * 1000 / turns, side.switches / turns)

    print()
    print(table(["side", "turns/s", "worker CPU ms / turn", "broker CPU ms / turn", "worker switches / turn"],
                [row(a), row(b)]))
    print(f"B/A turns/s: run 1 (A first) {b.rates[0] / a.rates[0]:.3f}, run 2 (B first) {b.rates[1] / a.rates[1]:.3f}")
    print(f"ratio={geometric_ratio(b.rates, a.rates):.3f} "
          f"worker_cpu_ratio={geometric_ratio(b.worker_per_turn, a.worker_per_turn):.3f} "
          f"broker_cpu_ratio={geometric_ratio(b.broker_per_turn, a.broker_per_turn):.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bootstrap_option(parser)
    parser.add_argument("--a-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable for A's worker only (repeat for several)")
    parser.add_argument("--b-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable for B's worker only (repeat for several)")
    parser.add_argument("--a-root", metavar="DIR", help="the checkout A's worker runs (default: this one)")
    parser.add_argument("--b-root", metavar="DIR", help="the checkout B's worker runs (default: this one)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--window", type=float, default=8.0, help="seconds of one closed-loop window")
    parser.add_argument("--rounds", type=int, default=6, help="windows per side in each of the two runs")
    args = parser.parse_args(argv)
    for flag, value in (("--a-root", args.a_root), ("--b-root", args.b_root)):
        if value and not (Path(value) / "harness" / "__init__.py").is_file():
            parser.error(f"{flag} {value}: no harness/__init__.py there (give a checkout of this project)")
    a = Side("A", env_pairs(args.a_env, "--a-env"), Path(args.a_root).resolve() if args.a_root else ROOT)
    b = Side("B", env_pairs(args.b_env, "--b-env"), Path(args.b_root).resolve() if args.b_root else ROOT)
    with broker(args.bootstrap) as bootstrap:
        asyncio.run(run(bootstrap, a, b, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
