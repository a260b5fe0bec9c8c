"""The ``harness`` command: session commands, the worker, topics, the demo, a local broker.

Each subcommand lives in its own module with its own parser (``harness <command>
--help``); this module only dispatches and prints the overview. Errors are one line
(see :mod:`harness.cli.common`).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from harness.cli.common import EXIT_USAGE, kafka_client_lines, output_closed, run_command
from harness.cli.terminal import plain_where_not_utf8

__all__ = ["COMMANDS", "main", "version"]


@dataclass(frozen=True)
class Command:
    name: str
    target: str  # module:function taking argv
    summary: str
    group: str
    client_lines: bool = False
    """A command of a person at a terminal: the Kafka clients' own log lines are shown
    only with ``--debug`` (workers and the gateway log them through their logging)."""


COMMANDS: tuple[Command, ...] = (
    Command("sessions", "harness.cli.sessions:main_sessions", "list sessions: state, last activity, open asks",
            "Sessions (--log URL, default $HARNESS_LOG)", client_lines=True),
    Command("show", "harness.cli.sessions:main_show", "a session's timeline: inputs, turns, tool calls, steps, asks",
            "Sessions (--log URL, default $HARNESS_LOG)", client_lines=True),
    Command("tail", "harness.cli.sessions:main_tail", "follow a session's new records live (Ctrl-C stops)",
            "Sessions (--log URL, default $HARNESS_LOG)", client_lines=True),
    Command("send", "harness.cli.inputs:main_send", "send a message to a session and wait for its answer",
            "Sessions (--log URL, default $HARNESS_LOG)", client_lines=True),
    Command("answer", "harness.cli.inputs:main_answer", "answer a question a tool asked (step.ask)",
            "Sessions (--log URL, default $HARNESS_LOG)", client_lines=True),
    Command("worker", "harness.services.worker.main:run", "run the sessions of a log (a deployable process)",
            "Running"),
    Command("gateway", "harness.services.gateway.main:main", "run the HTTP gateway (API, SSE, web console)",
            "Running"),
    Command("serve", "harness.services.gateway.main:serve_main", "the gateway and a worker in one process",
            "Running"),
    Command("topics", "harness.cli.topics:main_topics", "create the Kafka topics of a log", "Running",
            client_lines=True),
    Command("demo", "harness.demo:main", "the checkout story with a real crash, on SQLite (no network)",
            "Running"),
    Command("kafka-local", "harness.testing.kafka_local:main", "run a local Apache Kafka broker (KRaft) for development",
            "Running"),
)


def version() -> str:
    """The build's identity: ``0.1.0 (commit 69414ae)``, or the plain version (see :mod:`harness.build`)."""
    from harness.build import build_info

    return build_info().describe()


def overview() -> str:
    lines = [
        "usage: harness <command> [options]",
        "",
        "A durable agent harness: tool calls whose side effects survive crashes.",
    ]
    width = max(len(c.name) for c in COMMANDS)
    group = None
    for c in COMMANDS:
        if c.group != group:
            group = c.group
            lines += ["", f"{group}:"]
        lines.append(f"  {c.name.ljust(width)}  {c.summary}")
    lines += [
        "",
        "Options:",
        f"  {'-h, --help'.ljust(width)}  show this overview",
        f"  {'--version'.ljust(width)}  print the version (and the build's commit, when known)",
        "",
        "Run 'harness <command> --help' for a command's options and an example.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    plain_where_not_utf8()  # (a terminal that is not UTF-8: its marks in ASCII, never a UnicodeEncodeError)
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit: a reader gone by now is a BrokenPipeError we catch
    except BrokenPipeError:  # `harness show s-1 | head -1`: quiet, as other Unix tools are
        return output_closed()
    except KeyboardInterrupt:  # Ctrl-C while the command's modules load (before run_command): no traceback
        print(file=sys.stderr)
        return 130
    return code


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(overview())
        return 0
    if args[0] == "--version":
        print(f"harness {version()}")
        return 0
    if args[0] == "--debug" and len(args) > 1:  # `harness --debug show s-1`: as `harness show s-1 --debug`
        args = [args[1], "--debug", *args[2:]]
    by_name = {c.name: c for c in COMMANDS}
    command = by_name.get(args[0])
    if command is None:
        close = difflib.get_close_matches(args[0], list(by_name), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        print(f"harness: unknown command {args[0]!r}; {hint}'harness --help' lists the commands", file=sys.stderr)
        return EXIT_USAGE
    module, _, attr = command.target.partition(":")
    fn = getattr(importlib.import_module(module), attr)
    quiet = kafka_client_lines(debug="--debug" in args[1:]) if command.client_lines else contextlib.nullcontext()
    with quiet:
        return run_command(f"harness {command.name}", args[1:], fn)
