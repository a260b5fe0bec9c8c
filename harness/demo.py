"""``harness demo``: the checkout story, with a real crash, on the embedded SQLite log.

A child process starts the session and is killed (SIGKILL) right after the
charge step committed, before the invoice. A second process recovers the
session from the log. The transcript shows that the charge is not repeated.
No network, no Kafka, no API key.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import open_log
from harness.cli.common import EXIT_RUNTIME, CommandParser
from harness.errors import ConfigError
from harness.records import (
    AppRecord,
    InputMessage,
    ModelResponseRecord,
    StepResult,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnResumed,
)
from harness.testing.payments import FakePaymentProvider

SESSION = "demo-checkout"


def _child(command: str, log_url: str, provider: Path, *extra: str) -> tuple[int, str]:
    """Run one process of the story: its exit code and what it wrote on stderr."""
    cmd = [sys.executable, "-m", "harness.testing.checkout", command,
           "--log", log_url, "--provider", str(provider), "--session", SESSION, "--lease", "0.5", *extra]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace",
                          check=False)
    return done.returncode, done.stderr


def _failed(process: int, code: int, stderr: str, debug: bool) -> int:
    """Say in one line why a process of the story failed (its last line: the exception);
    its whole stderr (a traceback) with ``--debug``."""
    if debug:
        print(stderr, end="", file=sys.stderr)
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    why = f": {last}" if last else ""
    hint = "" if debug else " (--debug shows its output)"
    print(f"harness demo: process {process} failed with exit code {code}{why}{hint}", file=sys.stderr)
    return EXIT_RUNTIME


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


async def _transcript(log_url: str) -> list[str]:
    log = open_log(log_url)
    try:
        entries = await log.read(SESSION)
    finally:
        await log.close()
    lines = []
    for e in entries:
        r = e.record
        if isinstance(r, InputMessage):
            lines.append(f"  user      > {r.text}")
        elif isinstance(r, ModelResponseRecord):
            calls = ", ".join(f"{c['name']}({_short(c['arguments'])})" for c in r.tool_calls)
            lines.append(f"  model     > {r.text or ''}" + (f"  [calls: {calls}]" if calls else ""))
        elif isinstance(r, ToolStarted):
            lines.append(f"  tool      > {r.name} starts (attempt {r.attempt})")
        elif isinstance(r, StepResult):
            lines.append(f"  step      > {r.tool_call_id} {r.name} = {{{_short(r.value)}}}  (committed)")
        elif isinstance(r, TurnResumed):
            lines.append("  ---- process 1 was killed (SIGKILL); process 2 recovers the session from the log ----")
        elif isinstance(r, ToolResult):
            tag = "error" if r.is_error else "result"
            lines.append(f"  {tag:<9} > {r.name}: {{{_short(r.content)}}}")
        elif isinstance(r, AppRecord):
            lines.append(f"  record    > {r.record_type}: {{{_short(r.body)}}}")
        elif isinstance(r, TurnFinished):
            lines.append(f"  turn      > {r.outcome}")
    return lines


DEMO_FILES = ("sessions.db", "payments.db")


def _prepare(folder: Path) -> None:
    """Make ``folder`` for a new demo, refusing one that holds an earlier demo's files: the
    story needs a new log (on the old one the session is already done, so nothing crashes)."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--dir {folder}: it is a file, not a folder; give a folder (it is made if missing)",
                          setting="--dir")
    earlier = [name for name in DEMO_FILES if (folder / name).exists()]
    if earlier:
        raise ConfigError(
            f"--dir {folder}: it holds an earlier demo's {' and '.join(earlier)}; the demo tells its story on a "
            "new log: give another --dir, or remove those files", setting="--dir")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--dir {folder}: cannot make the folder ({exc.strerror or exc})", setting="--dir") from None
    try:  # both processes write their SQLite files here: say so now, not as their tracebacks
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".harness-demo-"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"--dir {folder}: the folder is not writable ({exc.strerror or exc}): give a folder you can write to, "
            "or make this one writable", setting="--dir") from None


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="harness demo", description=__doc__ or "",
        example="  harness demo                  # in a temporary folder\n"
        "  harness demo --dir ./demo     # keep the log: harness show demo-checkout --log sqlite:///demo/sessions.db",
    )
    parser.add_argument("--dir", help="folder for the log and the fake provider (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.dir is not None and not args.dir.strip():  # (a variable that was empty: `--dir "$DIR"`)
        raise ConfigError("--dir is empty: give a folder (it is made if missing), or leave --dir out for a "
                          "temporary one", setting="--dir")
    with tempfile.TemporaryDirectory(prefix="harness-demo-") as tmp:
        folder = Path(tmp if args.dir is None else args.dir)
        _prepare(folder)
        log_url = f"sqlite:///{folder / 'sessions.db'}"
        provider_path = folder / "payments.db"
        print(f"harness demo: checkout on the embedded SQLite log ({folder})")
        print("process 1: starts the session; it will be killed right after the charge commits")
        code, err = _child("run", log_url, provider_path, "--crash-at", "charge:committed")
        if code not in (0, -signal.SIGKILL):
            return _failed(1, code, err, args.debug)
        print(err, end="", file=sys.stderr)
        print(f"process 1: exited with {'SIGKILL' if code == -signal.SIGKILL else code}")
        print("process 2: recovers the session")
        code, err = _child("recover", log_url, provider_path)
        if code != 0:
            return _failed(2, code, err, args.debug)
        print(err, end="", file=sys.stderr)
        print("transcript (from the session log):")
        for line in asyncio.run(_transcript(log_url)):
            print(line)
        provider = FakePaymentProvider(provider_path)
        records = asyncio.run(_count_records(log_url))
        print(
            f"charges={provider.effects('charge')} invoices={provider.effects('invoice')} "
            f"notify_reruns={max(0, provider.calls('notify') - 1)} app_records={records}"
        )
    return 0


async def _count_records(log_url: str) -> int:
    log = open_log(log_url)
    try:
        return sum(1 for e in await log.read(SESSION) if isinstance(e.record, AppRecord))
    finally:
        await log.close()


if __name__ == "__main__":
    raise SystemExit(main())
