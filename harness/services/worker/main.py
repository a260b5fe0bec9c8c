"""``harness worker``: a stateless process that drives the sessions it owns.

    harness worker --log kafka://broker:9092?topic_prefix=acme --app myapp.agents:assistant
    harness worker --log sqlite:///harness.db --app myapp.agents:assistant

Settings come from the command line or, once at start, from the environment:
HARNESS_LOG, HARNESS_APPS (comma-separated module:attribute), HARNESS_INSTANCE_ID,
HARNESS_LEASE_SECONDS, HARNESS_METRICS_PORT (/metrics, /healthz, /readyz on that port).
SIGTERM/SIGINT stop the sessions recoverably, leave the consumer group (so partitions
move at once) and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from harness.definition import Harness
from harness.errors import DefinitionError
from harness.log import open_log
from harness.runtime.worker import Worker


def load_harnesses(specs: Sequence[str]) -> list[Harness]:
    """``module:attribute`` -> harnesses; the attribute may be a Harness, a list of them,
    or a function returning either."""
    out: list[Harness] = []
    for spec in specs:
        module_name, _, attr = spec.partition(":")
        if not module_name or not attr:
            raise DefinitionError(f"--app takes module:attribute, not {spec!r}")
        value: Any = getattr(importlib.import_module(module_name), attr)
        if callable(value) and not isinstance(value, Harness):
            value = value()
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if not isinstance(item, Harness):
                raise DefinitionError(f"{spec} gives {type(item).__name__}, not a Harness (use define_harness)")
            out.append(item)
    return out


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(prog="harness worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", default=env.get("HARNESS_LOG"), help="session log URL")
    parser.add_argument("--app", action="append", default=None, help="module:attribute of a harness (repeat)")
    parser.add_argument("--instance-id", default=env.get("HARNESS_INSTANCE_ID"),
                        help="static group membership (group.instance.id)")
    parser.add_argument("--lease", type=float, default=float(env.get("HARNESS_LEASE_SECONDS", "30")),
                        help="session lease seconds (SQLite)")
    parser.add_argument("--log-level", default=env.get("HARNESS_LOG_LEVEL", "INFO"))
    parser.add_argument("--metrics-port", type=int, default=env.get("HARNESS_METRICS_PORT") or None,
                        help="serve /metrics, /healthz and /readyz on this port (0: any free port)")
    args = parser.parse_args(argv)
    if args.app is None:
        args.app = [a for a in env.get("HARNESS_APPS", "").split(",") if a]
    if not args.log or not args.app:
        parser.error("--log and at least one --app are required (or HARNESS_LOG / HARNESS_APPS)")
    return args


async def serve(args: argparse.Namespace) -> int:
    harnesses = load_harnesses(args.app)
    log = open_log(args.log)
    worker = Worker(log=log, harnesses=harnesses, lease=timedelta(seconds=args.lease), instance_id=args.instance_id)
    server = None
    if args.metrics_port is not None:
        from harness.observability import MetricsServer, enable_metrics

        sink = enable_metrics()
        server = MetricsServer(port=args.metrics_port, registry=sink.registry,
                               alive=worker.health.alive, ready=worker.health.ready).start()
        print(f"metrics port={server.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.create_task(worker.run(stop))

    async def announce() -> None:
        await worker.ready.wait()
        print(f"worker ready owner={worker.owner_id} harnesses={','.join(worker.harnesses)}", flush=True)

    announcer = asyncio.create_task(announce())
    try:
        await task
    finally:
        announcer.cancel()
        await log.close()
        if server is not None:
            server.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return asyncio.run(serve(args))


if __name__ == "__main__":
    raise SystemExit(main())
