"""``harness worker``: a stateless process that drives the sessions it owns.

    harness worker --log 'kafka://broker:9092?topic_prefix=acme' --app myapp.agents:assistant
    harness worker --log sqlite:///harness.db --app myapp.agents:assistant --max-sessions 50

Settings come from the command line or, read once at start, from the environment:
HARNESS_LOG, HARNESS_APPS (comma-separated module:attribute), HARNESS_INSTANCE_ID,
HARNESS_SECRETS_DIR (read again when it changes, looked at every HARNESS_SECRETS_RECHECK_SECONDS,
default 10), HARNESS_MAX_SESSIONS, HARNESS_LOG_FORMAT, HARNESS_LOG_LEVEL,
HARNESS_LEASE_SECONDS, HARNESS_SYNC_THREADS, HARNESS_DRAIN_TIMEOUT_SECONDS, HARNESS_CPU_POLICY, HARNESS_SECRET_<NAME> (one secret each; the name lower-cased),
HARNESS_KAFKA_CONFIG_<KEY> (one librdkafka setting each: HARNESS_KAFKA_CONFIG_SASL_PASSWORD
is sasl.password), HARNESS_METRICS_PORT (/metrics, /healthz, /readyz on that port).
A flag wins over its variable.

SIGTERM/SIGINT drain first (nothing new starts; a running tool call goes on to its
result and a model call to its logged answer, for at most --drain-timeout seconds; on
Kafka a partition the group moves elsewhere is drained the same way), then stop the
sessions recoverably (what still runs is cut and recovered by the next owner), leave the
consumer group (so partitions move at once) and exit 0. A second SIGTERM/SIGINT ends the
drain at once. After a SIGKILL the others take over
once the group's session timeout (Kafka) or the session leases (SQLite) ran out.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from harness import logs
from harness.cli.common import (
    CommandParser,
    add_log_option,
    open_log_for,
    positive_float,
    positive_int,
    run_command,
    seconds_or_zero,
)
from harness.errors import ConfigError
from harness.gcpause import tune_for_service
from harness.runtime.host import DEFAULT_SYNC_THREADS
from harness.runtime.worker import DEFAULT_DRAIN_TIMEOUT, Worker
from harness.services.cpu_policy import CPU_POLICIES, DEFAULT_CPU_POLICY, apply_cpu_policy
from harness.services.lingering import exit_if_sync_calls_linger
from harness.services.worker.apps import load_harnesses
from harness.services.worker.secrets import RECHECK_SECONDS, WorkerSecrets

__all__ = ["load_harnesses", "main", "parse", "run", "serve"]

log = logging.getLogger("harness.worker")

EXAMPLE = """\
  harness worker --log sqlite:///harness.db --app myapp.agents:assistant
  harness worker --log 'kafka://broker:9092?topic_prefix=acme' --app myapp.agents:assistant \\
      --secrets-dir /etc/harness/secrets --max-sessions 100 --log-format json
"""


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name)
    if text is None or text == "":
        return None
    try:
        return positive_int(name)(text)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(str(exc), setting=name) from None


def _env_seconds(env: Mapping[str, str], name: str) -> float | None:
    text = env.get(name)
    if text is None or text == "":
        return None
    try:
        return positive_float(name)(text)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(str(exc), setting=name) from None


def _choice(value: str, name: str, choices: Sequence[str]) -> str:
    if value.lower() not in choices:
        raise ConfigError(f"{name} takes one of {', '.join(choices)}, not {value!r}", setting=name)
    return value.lower()


def parser() -> CommandParser:
    p = CommandParser(prog="harness worker", description=__doc__ or "", example=EXAMPLE)
    add_log_option(p)
    p.add_argument("--app", action="append", default=None, metavar="MODULE:ATTR",
                   help="the harness(es) to run: module:attribute, found from the current folder (repeat)")
    p.add_argument("--instance-id", default=None, metavar="ID",
                   help="Kafka static group membership (group.instance.id), e.g. the pod name")
    p.add_argument("--secrets-dir", default=None, metavar="DIR",
                   help="one file per secret (a mounted Kubernetes Secret); given to every session, "
                   "read again when it changes")
    p.add_argument("--secrets-recheck", type=positive_float("--secrets-recheck"), default=None, metavar="SECONDS",
                   help=f"least time between two looks at --secrets-dir (default {RECHECK_SECONDS:g}); "
                   "sessions started after a change get the new values")
    p.add_argument("--max-sessions", type=positive_int("--max-sessions"), default=None, metavar="N",
                   help="at most N sessions running at once; the others wait in order")
    p.add_argument("--log-format", default=None, metavar="FORMAT", help="text (default) or json (one object per line)")
    p.add_argument("--log-level", default=None, metavar="LEVEL", help="debug, info (default), warning, error")
    p.add_argument("--lease", type=positive_float("--lease"), default=None, metavar="SECONDS",
                   help="a session's ownership lease on SQLite (default 30): another worker takes a session "
                   "over once its owner's lease ran out")
    p.add_argument("--sync-threads", type=positive_int("--sync-threads"), default=None, metavar="N",
                   help="threads for sync step functions and sync tools (default 16); they never run "
                   "on the event loop, so a blocking call stops neither leases nor other sessions")
    p.add_argument("--drain-timeout", type=seconds_or_zero, default=None, metavar="SECONDS",
                   help=f"on SIGTERM (and, on Kafka, a partition moved elsewhere) let running tool and model "
                   f"calls finish for at most this long before they are cut (default "
                   f"{DEFAULT_DRAIN_TIMEOUT.total_seconds():g}; 0: cut at once)")
    p.add_argument("--metrics-port", type=_port, default=None, metavar="PORT",
                   help="serve /metrics, /healthz and /readyz on this port (0: any free port)")
    p.add_argument("--cpu-policy", default=None, metavar="POLICY",
                   help="Linux scheduling of the worker's threads: batch (default: a thread another one "
                   "wakes does not preempt a running one; ~20%% more turns/s on a busy machine) or normal")
    return p


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--metrics-port takes a port number, not {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"--metrics-port takes a port number (0-65535), not {value}")
    return value


def parse(argv: Sequence[str] | None, env: Mapping[str, str] | None = None) -> argparse.Namespace:
    """The worker's settings: flags first, then the environment (read once)."""
    env = os.environ if env is None else env
    args = parser().parse_args(argv)
    if args.app is None:
        args.app = [a.strip() for a in env.get("HARNESS_APPS", "").split(",") if a.strip()]
    if not args.app:
        raise ConfigError("no harness to run: give --app module:attribute (or set HARNESS_APPS)", setting="--app")
    args.instance_id = args.instance_id or env.get("HARNESS_INSTANCE_ID") or None
    args.secrets_dir = args.secrets_dir or env.get("HARNESS_SECRETS_DIR") or None
    if args.secrets_recheck is None:
        args.secrets_recheck = _env_seconds(env, "HARNESS_SECRETS_RECHECK_SECONDS") or RECHECK_SECONDS
    if args.max_sessions is None:
        args.max_sessions = _env_int(env, "HARNESS_MAX_SESSIONS")
    if args.lease is None:
        args.lease = _env_seconds(env, "HARNESS_LEASE_SECONDS") or 30.0
    if args.sync_threads is None:
        args.sync_threads = _env_int(env, "HARNESS_SYNC_THREADS") or DEFAULT_SYNC_THREADS
    if args.drain_timeout is None:
        text = env.get("HARNESS_DRAIN_TIMEOUT_SECONDS") or ""
        try:
            args.drain_timeout = seconds_or_zero(text) if text else DEFAULT_DRAIN_TIMEOUT.total_seconds()
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"HARNESS_DRAIN_TIMEOUT_SECONDS {exc}", setting="HARNESS_DRAIN_TIMEOUT_SECONDS") from None
    if args.metrics_port is None and env.get("HARNESS_METRICS_PORT"):
        try:
            args.metrics_port = _port(env["HARNESS_METRICS_PORT"])
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"HARNESS_METRICS_PORT: {exc}", setting="HARNESS_METRICS_PORT") from None
    args.cpu_policy = _choice(args.cpu_policy or env.get("HARNESS_CPU_POLICY") or DEFAULT_CPU_POLICY,
                              "--cpu-policy" if args.cpu_policy else "HARNESS_CPU_POLICY", CPU_POLICIES)
    args.log_format = _choice(args.log_format or env.get("HARNESS_LOG_FORMAT") or "text",
                              "--log-format" if args.log_format else "HARNESS_LOG_FORMAT", logs.LOG_FORMATS)
    level = args.log_level or env.get("HARNESS_LOG_LEVEL") or "info"
    try:
        args.log_level = logs.parse_level(level)
    except ValueError as exc:
        setting = "--log-level" if args.log_level else "HARNESS_LOG_LEVEL"
        raise ConfigError(f"{setting}: {exc}", setting=setting) from None
    return args


async def serve(args: argparse.Namespace, env: Mapping[str, str] | None = None, *, hard_exit: bool = False) -> int:
    """Load the apps and secrets, open the log, run the worker until SIGTERM/SIGINT.

    ``hard_exit`` (the command line): exit the process at once if sync code the stop
    cut still runs on threads (``harness.services.lingering``)."""
    worker = None
    server: Any = None
    sink: Any = None
    env = os.environ if env is None else env
    secrets = WorkerSecrets(args.secrets_dir, env, recheck=args.secrets_recheck)
    harnesses = load_harnesses(args.app)
    worker_log = await open_log_for(args.log, role="worker", env=env)
    tune_for_service()  # (after the apps and the log are loaded: see harness.gcpause)
    try:
        worker = Worker(
            log=worker_log,
            harnesses=harnesses,
            lease=timedelta(seconds=args.lease),
            instance_id=args.instance_id,
            secrets_for=secrets.hook,
            max_sessions=args.max_sessions,
            sync_threads=args.sync_threads,
            drain_timeout=timedelta(seconds=args.drain_timeout),
        )
        if args.metrics_port is not None:
            from harness.observability import MetricsServer, enable_metrics

            sink = enable_metrics()
            server = MetricsServer(port=args.metrics_port, registry=sink.registry,
                                   alive=worker.health.alive, ready=worker.health.ready).start()
            print(f"metrics port={server.port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if not stop.is_set():
                stop.set()  # drain, then stop
            elif not worker.hurry.is_set():
                log.info("a second stop signal: ending the drain now")
                worker.hurry.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        task = asyncio.create_task(worker.run(stop))

        async def announce() -> None:
            await worker.ready.wait()
            extra = f" max_sessions={args.max_sessions}" if args.max_sessions else ""
            print(f"worker ready owner={worker.owner_id} harnesses={','.join(worker.harnesses)}"
                  f" secrets={len(secrets)}{extra}", flush=True)
            log.info("worker ready: %s", ", ".join(worker.harnesses))

        announcer = asyncio.create_task(announce())
        try:
            await task
        finally:
            announcer.cancel()
        log.info("worker stopped")
    finally:
        await worker_log.close()
        if server is not None:
            await _last_scrape(server, None if sink is None else sink.last_drain_cut)
            server.close()
    if hard_exit and worker is not None:
        exit_if_sync_calls_linger(worker.host, 0)
    return 0


async def _last_scrape(server: Any, cut_at: float | None) -> None:
    """Sessions cut by this stop's drain were counted moments ago: serve /metrics until
    Prometheus read that count (about one scrape interval, at most 30 s; after the log is
    closed, so the group is not kept waiting), or HarnessHandOverCutCalls never fires for
    a SIGTERM's cuts."""
    if cut_at is None:
        return
    log.info("waiting for a last scrape of /metrics (it counts the sessions the drain cut)")
    if not await asyncio.to_thread(server.wait_for_scrape, cut_at):
        log.info("no scrape of /metrics came: the sessions the drain cut are not counted in Prometheus")


def run(argv: list[str]) -> Any:
    """Parse, configure logging, and return the coroutine that serves (for ``run_command``)."""
    args = parse(argv)
    # First, before the log and the apps start threads (each thread inherits it anyway).
    refused = apply_cpu_policy(args.cpu_policy)
    logs.configure(level=args.log_level, fmt=args.log_format)
    if refused:
        log.warning("%s; the worker runs with the default policy (--cpu-policy normal: without this line)", refused)
    return serve(args, hard_exit=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``harness worker`` (errors as one line; see ``harness.cli.common.run_command``)."""
    import sys

    return run_command("harness worker", list(sys.argv[1:] if argv is None else argv), run)


if __name__ == "__main__":
    raise SystemExit(main())
