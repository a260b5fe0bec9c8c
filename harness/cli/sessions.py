"""``harness sessions``, ``harness show``, ``harness tail``: sessions as people read them.

Read-only: they never claim, fence or write (on Kafka they read checkpoints and the
sessions topic with read_committed consumers of their own; a SQLite file is opened
``read_only``: nothing in it is made or changed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import stat
import sys
import time
from typing import Any

from harness.cli.common import (
    BrokerWatch,
    CommandParser,
    add_log_option,
    open_log_for,
    positive_int,
    telling_if_slow,
)
from harness.cli.render import (
    ask_lines,
    session_header,
    sessions_table,
    style_for,
    table_cuts,
    timeline_line,
    timeline_lines,
)
from harness.errors import SessionNotFound
from harness.ids import check_id
from harness.records import LogEntry
from harness.replay import fold
from harness.runtime.answers import waiting_answers
from harness.runtime.catalog import follow_session, list_sessions, scan_session
from harness.views import SESSION_STATES, Timeline, summarize, timeline

__all__ = ["main_sessions", "main_show", "main_tail", "read_existing"]


SLOW_LISTING_S = 2.0  # after this, `harness sessions` says it is still reading


def _now_ms() -> int:
    return int(time.time() * 1000)


def _color_option(parser: CommandParser) -> None:
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="colour the output (auto: on a terminal, unless NO_COLOR is set)")


# --- harness sessions ---------------------------------------------------------------------------


def _state_name(text: str) -> str:
    """An argparse type for ``--state`` (its choices are checked after): ``queued`` is what
    the table shows of a running session whose input no worker took yet, not a state."""
    if text == "queued":
        raise argparse.ArgumentTypeError(
            "a queued session (its input not taken by a worker yet) is a running one: use --state running"
        )
    return text


def sessions_parser() -> CommandParser:
    parser = CommandParser(
        prog="harness sessions",
        description="One row per session: its id, harness, state (running, shown as queued while no worker "
        "has taken its input; waiting for a person; sleeping until a time; idle; failed), last activity and open "
        "asks; most recent first.",
        example="  harness sessions --log sqlite:///harness.db --state waiting\n"
        "  harness sessions --log 'kafka://broker:9092?topic_prefix=acme' --json --limit 20",
    )
    add_log_option(parser)
    parser.add_argument("--state", type=_state_name, choices=SESSION_STATES, action="append",
                        help="only sessions in this state (repeat for several); a queued session is running")
    parser.add_argument("--harness", metavar="NAME", help="only sessions of this harness")
    parser.add_argument("--limit", type=positive_int("--limit"), metavar="N", help="at most N sessions")
    parser.add_argument("--history", action="store_true",
                        help="Kafka: also read sessions that ended before the latest checkpoint (reads "
                        "every partition from its start)")
    parser.add_argument("--json", action="store_true", help="one JSON array of session summaries")
    _color_option(parser)
    return parser


async def main_sessions(argv: list[str]) -> int:
    args = sessions_parser().parse_args(argv)
    log = await open_log_for(args.log, role="reader")
    try:
        now = _now_ms()
        summaries = await BrokerWatch(log).guard(telling_if_slow(
            list_sessions(log, now_ms=now, history=args.history), after=SLOW_LISTING_S,
            note="(still reading: --history reads every partition from its start, which takes a while on a "
            "big log)" if args.history else "(still reading the log: a big one takes a few seconds)",
        ))
    finally:
        await log.close()
    if args.state:
        summaries = [s for s in summaries if s.state in args.state]
    if args.harness:
        summaries = [s for s in summaries if s.harness == args.harness]
    partial = sum(s.partial for s in summaries)
    if args.limit:
        summaries = summaries[: args.limit]
    if args.json:
        print(json.dumps([s.to_json() for s in summaries], indent=2))
        return 0
    if not summaries:
        print("no sessions" + (" match" if args.state or args.harness else " in this log"), file=sys.stderr)
        return 0
    for line in sessions_table(summaries, now, style_for(sys.stdout, args.color)):
        print(line)
    if table_cuts(summaries):
        print("(long ids are cut with '…': --json lists them whole)", file=sys.stderr)
    if partial:
        print(f"({partial} sessions ended before their partition's latest checkpoint: --history reads them)",
              file=sys.stderr)
    return 0


# --- harness show ---------------------------------------------------------------------------------


def show_parser() -> CommandParser:
    parser = CommandParser(
        prog="harness show",
        description="A session's timeline: inputs and their settlements, turns with attempts and takeovers, "
        "model responses, tool calls with their steps, asks (answered or open), sleeps, app records, errors.",
        example="  harness show s-1 --log sqlite:///harness.db\n  harness show s-1 --json | jq '.timeline[]'",
    )
    parser.add_argument("session", metavar="SESSION", help="the session id")
    add_log_option(parser)
    parser.add_argument("--json", action="store_true", help="the summary and the timeline as one JSON object")
    _color_option(parser)
    return parser


async def read_existing(log: Any, session_id: str) -> list[LogEntry]:
    """The session's readable records; ``SessionNotFound`` if it has none."""
    entries, _ = await read_existing_counted(log, session_id)
    return entries


async def read_existing_counted(log: Any, session_id: str) -> tuple[list[LogEntry], int]:
    """The session's readable records and how many could not be read (said on stderr);
    ``SessionNotFound`` if it has no readable one."""
    entries, unreadable = await scan_session(log, session_id)
    if unreadable:
        print(f"({unreadable} records of session {session_id} could not be decoded and are left out)",
              file=sys.stderr)
    if not entries:
        raise SessionNotFound(
            f"no session {session_id!r} in this log: 'harness sessions' lists the sessions (check --log)",
            session_id=session_id,
        )
    return entries, unreadable


async def main_show(argv: list[str]) -> int:
    args = show_parser().parse_args(argv)
    check_id(args.session, "session id")
    log = await open_log_for(args.log, role="reader")
    try:
        entries, unreadable = await BrokerWatch(log).guard(read_existing_counted(log, args.session))
    finally:
        await log.close()
    now = _now_ms()
    state = fold(args.session, entries)
    summary = summarize(state, now_ms=now, last_activity_ms=entries[-1].record.ts, unreadable=unreadable)
    items = timeline(entries)
    if args.json:
        print(json.dumps({"summary": summary.to_json(), "timeline": [i.to_json() for i in items]}, indent=2))
        return 0
    style = style_for(sys.stdout, args.color)
    print(session_header(summary, now, style))
    for line in timeline_lines(items, now, style):
        print(line)
    for line in ask_lines(summary.open_asks, args.session, style, waiting_answers(state)):
        print(line)
    return 0


# --- harness tail ---------------------------------------------------------------------------------


def tail_parser() -> CommandParser:
    parser = CommandParser(
        prog="harness tail",
        description="Follow a session's new records live, as timeline lines, until Ctrl-C.",
        example="  harness tail s-1 --log sqlite:///harness.db\n  harness tail s-1 -n 0 --json   # new items only",
    )
    parser.add_argument("session", metavar="SESSION", help="the session id")
    add_log_option(parser)
    parser.add_argument("-n", "--lines", type=int, default=10, metavar="N",
                        help="first show the last N items of the timeline (default 10)")
    parser.add_argument("--json", action="store_true", help="one JSON object per timeline item")
    _color_option(parser)
    return parser


async def main_tail(argv: list[str]) -> int:
    args = tail_parser().parse_args(argv)
    if args.lines < 0:
        tail_parser().error("-n takes a number >= 0")
    check_id(args.session, "session id")
    log = await open_log_for(args.log, role="reader")
    watch = BrokerWatch(log)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    reader_gone = _watch_pipe_reader(sys.stdout, stop)
    style = style_for(sys.stdout, args.color)
    try:
        entries, _ = await watch.guard(scan_session(log, args.session))
        made = Timeline()
        items = made.add(entries)
        shown = items[-args.lines:] if args.lines else []
        for item in shown:
            _print_item(item, args.json, style)
        if not entries:
            print(f"(no records of session {args.session} yet; waiting for the first one)", file=sys.stderr)
        after = entries[-1].seq if entries else 0
        follower = asyncio.ensure_future(watch.guard(_follow(log, args.session, after, made, args.json, style)))
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({follower, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for task in (follower, stopper):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if follower.done() and not follower.cancelled() and follower.exception() is not None:
            raise follower.exception()  # type: ignore[misc]
    finally:
        if reader_gone is not None:
            loop.remove_reader(sys.stdout.fileno())
        await log.close()
    if reader_gone is not None and reader_gone.is_set():
        raise BrokenPipeError  # (quiet, exit 141: see harness.cli.main)
    return 0


def _watch_pipe_reader(stream: Any, stop: asyncio.Event) -> asyncio.Event | None:
    """When ``stream`` is a pipe, an event set (with ``stop``) once its reader went away
    (``| head -1`` took its lines): a tail with nothing new to print would otherwise find
    out only at its next write, and the pipeline hang while the session stays quiet. The
    pipe's write end reports an error to epoll/poll then, seen as readable; it is never
    readable otherwise (a terminal is, when typed at: not watched)."""
    try:
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
    except (AttributeError, OSError, ValueError):  # not a real file (a test's capture)
        return None
    gone = asyncio.Event()

    def went_away() -> None:
        asyncio.get_running_loop().remove_reader(fd)  # (it stays "readable": once is enough)
        gone.set()
        stop.set()

    try:
        asyncio.get_running_loop().add_reader(fd, went_away)
    except (OSError, ValueError, NotImplementedError):
        return None
    return gone


async def _follow(log: Any, session_id: str, after: int, made: Timeline, as_json: bool, style: Any) -> None:
    """Print the timeline items of new records, a batch at a time (the records that came
    while the last batch was printed: an input and its settlement in one batch print as
    settled). Each batch costs what it holds, however long the session."""
    queue: asyncio.Queue[LogEntry] = asyncio.Queue()

    async def read() -> None:
        async for entry in follow_session(log, session_id, after=after):
            queue.put_nowait(entry)

    reader = asyncio.ensure_future(read())
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                reader.result()  # the reader failed (or ended): say why
                return
            batch = [getter.result()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            for item in made.add(batch):  # asks and inputs show what they know when printed
                _print_item(item, as_json, style)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


def _print_item(item: Any, as_json: bool, style: Any) -> None:
    if as_json:
        print(json.dumps(item.to_json()), flush=True)
    else:
        print(timeline_line(item, _now_ms(), style), flush=True)
