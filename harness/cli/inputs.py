"""``harness send`` and ``harness answer``: inputs for a session's owner.

They only produce input records and read the log: the worker that owns the session
takes the input, runs the turn and settles it. ``send`` waits for that settlement
(a live status line on a terminal) and prints the answer; if the turn stops to wait
for a person, it prints the open asks and how to answer them (exit 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import sys
import time
import uuid
from collections.abc import Coroutine
from typing import IO, Any

from harness.cli.common import (
    EXIT_RUNTIME,
    BrokerWatch,
    CommandParser,
    add_log_option,
    open_log_for,
    positive_float,
    utf8_argument,
)
from harness.cli.render import ask_lines, clock, style_for
from harness.cli.sessions import read_existing
from harness.errors import ConfigError, StepValueError
from harness.ids import check_id, check_sent_input_id
from harness.jsonvalues import json_copy
from harness.records import InputAnswer, InputMessage, InputSettled, LogEntry
from harness.replay import SessionState, TurnState, fold
from harness.replay.payload import record_payload
from harness.runtime.answers import judge_answer, waiting_answers
from harness.runtime.catalog import follow_session, scan_session
from harness.views import classify, input_queued_behind_person, input_waits_for_person, open_asks, timeline

__all__ = ["EXIT_WAITING", "main_answer", "main_send"]

EXIT_WAITING = 3
"""``send``: the turn waits for a person's answer (the open asks are printed)."""

TICK_S = 0.2
"""How often the status line is redrawn."""

UNTAKEN_HINT_S = 10.0
"""After this long with nothing written after the input, say that no worker may run this log."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class StatusLine:
    """One line on a terminal, redrawn in place; nothing when the stream is not a terminal."""

    FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self.enabled = hasattr(stream, "isatty") and stream.isatty()
        self._text = ""
        self._started = time.monotonic()
        self._frame = 0

    def set(self, text: str) -> None:
        self._text = text
        self.draw()

    def draw(self) -> None:
        if not self.enabled or not self._text:
            return
        self._frame = (self._frame + 1) % len(self.FRAMES)
        elapsed = int(time.monotonic() - self._started)
        self._stream.write(f"\r\x1b[2K{self.FRAMES[self._frame]} {self._text} ({elapsed} s)")
        self._stream.flush()

    def clear(self) -> None:
        if self.enabled:
            self._stream.write("\r\x1b[2K")
            self._stream.flush()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self.draw()


def _progress(state: SessionState, entries: list[LogEntry], input_id: str, now: int) -> str:
    """What the session is doing about ``input_id``, in a few words."""
    inp = state.inputs.get(input_id)
    if inp is None or inp.turn is None:
        ahead = _turn_ahead(state, input_id)
        if ahead is not None:
            return f"{input_id} queued behind turn {ahead.turn} (input {ahead.input_id})"
        return f"{input_id} sent; waiting for a worker to take it"
    name, until = classify(state, now_ms=now)
    turn = f"turn {inp.turn}"
    if name == "sleeping":
        return f"{turn}: sleeping until {clock(until, now)}"
    last = next((i for i in reversed(timeline(entries[-20:])) if i.kind not in ("input.settled",)), None)
    if last is None:
        return f"{turn} running"
    what = {
        "turn.started": "calling the model",
        "turn.resumed": f"taken over by a new owner (attempt {last.attempt})",
        "model.response": "the model answered" + (f"; calling {last.preview}" if last.preview else ""),
        "tool.started": f"tool {last.name} running",
        "step": f"step {last.name} done",
        "sleep": f"sleeping until {clock(last.wake_at, now)}",
        "ask": f"asking: {last.text}",
        "tool.result": f"tool {last.name} finished",
    }.get(last.kind, "running")
    return f"{turn}: {what}"


def _turn_ahead(state: SessionState, input_id: str) -> TurnState | None:
    """The unfinished turn of another input that ``input_id`` (not taken yet) waits behind.
    Only a message waits for a turn to end: an answer (or a cancel) is taken by the owner
    while the turn runs (it is what that turn waits for), so none is queued behind it."""
    inp = state.inputs.get(input_id)
    active = state.active_turn
    if inp is None or inp.kind != "message" or inp.turn is not None or inp.settled is not None or active is None:
        return None
    return active if active.input_id != input_id else None


def _our_turn_sleeps_until(state: SessionState, input_id: str, now: int) -> int | None:
    """When the turn of ``input_id`` wakes, if it is the active turn and it sleeps."""
    inp = state.inputs.get(input_id)
    active = state.active_turn
    if inp is None or inp.turn is None or active is None or active.turn != inp.turn:
        return None
    name, until = classify(state, now_ms=now)
    return until if name == "sleeping" else None


async def _watch(
    log: Any, session_id: str, input_id: str, state: SessionState, entries: list[LogEntry], after: int,
    status: StatusLine, *, stop_when_waiting: bool,
) -> InputSettled | None:
    """Fold the session's new records until ``input_id`` settles (or, with
    ``stop_when_waiting``, its turn waits for a person: None)."""
    def done() -> InputSettled | bool | None:
        inp = state.inputs.get(input_id)
        if inp is not None and inp.settled is not None:
            return inp.settled
        if stop_when_waiting and (
            input_waits_for_person(state, input_id, now_ms=_now_ms())
            or input_queued_behind_person(state, input_id, now_ms=_now_ms()) is not None
        ):
            return None  # (_report_send tells which)
        return False

    told: set[int] = set()

    def show() -> None:
        now = _now_ms()
        status.set(_progress(state, entries, input_id, now))
        until = _our_turn_sleeps_until(state, input_id, now)
        if not status.enabled and until is not None and until not in told:
            # No status line off a terminal: say once why nothing happens for a while.
            told.add(until)
            print(f"{input_id}: the turn sleeps until {clock(until, now)}; waiting for it to settle "
                  "(--no-wait or --timeout SECONDS stop waiting sooner; the turn goes on without this command)",
                  file=sys.stderr, flush=True)

    verdict = done()
    if verdict is not False:
        return verdict  # type: ignore[return-value]
    show()
    async for entry in follow_session(log, session_id, after=after):
        entries.append(entry)
        state.apply_entry(entry)
        state.mark_read(entry.seq)
        verdict = done()
        if verdict is not False:
            return verdict  # type: ignore[return-value]
        show()
    return None  # pragma: no cover - follow_session never ends


def _untaken(state: SessionState, input_id: str) -> bool:
    """Nothing was written after ``input_id``: no worker has taken it (yet)."""
    inp = state.inputs.get(input_id)
    return inp is not None and inp.settled is None and inp.turn is None and state.read_upto <= inp.seq


NO_WORKER_HINT = ("Is a worker running on this log ('harness worker --log ... --app module:harness')? "
                  "The input stays in the log and a worker takes it when it starts")


async def _hint_when_untaken(
    state: SessionState, input_id: str, status: StatusLine, watch: BrokerWatch | None = None
) -> None:
    """Say once, after ``UNTAKEN_HINT_S``, that nobody has taken the input: on a terminal in the
    status line, otherwise one line on stderr (a piped ``send`` was silent for ever). Not
    while the broker does not answer (the watch then says that instead)."""
    await asyncio.sleep(UNTAKEN_HINT_S)
    while watch is not None and watch.failing:
        await asyncio.sleep(1.0)
    if not _untaken(state, input_id):
        return
    ahead = _turn_ahead(state, input_id)
    if ahead is not None:  # a worker took the session: the input waits for the turn before it
        now = _now_ms()
        until = _our_turn_sleeps_until(state, ahead.input_id, now)
        # (Whether a worker still runs that turn, the log cannot tell: a dead one's turn looks the same.)
        doing = (f"which sleeps until {clock(until, now)}" if until is not None
                 else "which has not ended (if no worker runs on this log, start one: the turn goes on from the log)")
        note = f"{input_id}: queued behind turn {ahead.turn} (input {ahead.input_id}), {doing}"
        if status.enabled:
            status.set(note)
        else:
            print(f"{note}; it is taken once that turn ends; still waiting (--timeout SECONDS stops sooner)",
                  file=sys.stderr, flush=True)
        return
    waited = f"{UNTAKEN_HINT_S:g} s"
    if status.enabled:
        status.set(f"{input_id}: no worker has taken it in {waited}; is one running on this log?")
    else:
        print(f"{input_id}: no worker has taken it in {waited}. {NO_WORKER_HINT}; still waiting "
              "(--timeout SECONDS stops sooner)", file=sys.stderr, flush=True)


async def _wait(
    coro: Any, timeout: float | None, what: str, session_id: str, state: SessionState, input_id: str
) -> Any:
    try:
        return await asyncio.wait_for(coro, timeout)
    except TimeoutError:
        if _untaken(state, input_id) and _turn_ahead(state, input_id) is None:
            # Nothing was written after it: most often no worker runs this log.
            raise TimeoutError(f"{what} within {timeout:g} s: no worker took it up. {NO_WORKER_HINT}") from None
        raise TimeoutError(
            f"{what} within {timeout:g} s; it stays in the log and its owner will still take it "
            f"('harness show {session_id}' shows where the session is)"
        ) from None


def _resend_note(record: InputMessage | InputAnswer, command: str) -> str:
    return (f"{record.input_id} may be in the log or not: 'harness show {record.session_id}' tells; "
            f"'harness {command}' again with --input-id {record.input_id} has no second effect")


def _in_log_note(input_id: str, session_id: str) -> str:
    return (f"{input_id} is in the log and its turn runs all the same: 'harness show {session_id}' shows how it goes "
            "once the broker is back")


async def _submit(
    log: Any, record: InputMessage | InputAnswer, command: str, watch: BrokerWatch | None = None
) -> LogEntry:
    """``log.submit(record)``; stopped (Ctrl-C) before the log said it took it, say that it
    may be in the log or not, and how to send it again with no second effect."""
    try:
        if watch is None:
            entry: LogEntry = await log.submit(record)
        else:
            entry = await watch.guard(log.submit(record), note=_resend_note(record, command))
    except asyncio.CancelledError:
        print(f"\nharness {command}: stopped while sending; {record.input_id} may be in the log or not: "
              f"'harness show {record.session_id}' tells; 'harness {command}' again with --input-id "
              f"{record.input_id} has no second effect", file=sys.stderr)
        raise
    return entry


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --- harness send -----------------------------------------------------------------------------------


def stdin_text(what: str = "message", setting: str = "TEXT", example: str = "harness send s-1 - < prompt.txt") -> str:
    """The ``what`` given as ``-``: standard input to its end, UTF-8, one final line break
    dropped (``echo hi |`` sends ``hi``). A command line holds at most ~128 KB an argument."""
    if sys.stdin is None:
        raise ConfigError(f"{setting} is - but there is no standard input to read the {what} from: pipe the "
                          f"{what} in ({example}) or give it as {setting}", setting=setting)
    if sys.stdin.isatty():
        print(f"reading the {what} from standard input: end it with Ctrl-D", file=sys.stderr)
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the {what} on standard input is not UTF-8 (byte 0x{data[exc.start]:02x} at "
                          f"byte {exc.start}): give it as UTF-8 (e.g. iconv -t UTF-8)", setting=setting) from None
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def send_parser() -> CommandParser:
    parser = CommandParser(
        prog="harness send",
        description="Send a user message to a session and wait for the worker that owns it to settle it; "
        "prints the answer. Exit 0 completed, 1 failed or rejected, 3 waiting for a person, its turn or the "
        "turn it is queued behind (the open asks are printed). It never runs the turn itself.",
        example="  harness send s-1 'please check out order 42' --harness acme/assistant --log sqlite:///harness.db\n"
        "  git diff | harness send s-1 - --harness acme/reviewer",
        extra_words_hint=lambda args, words: (
            "; quote a message of several words: harness send "
            f"{shlex.quote(args.session)} {shlex.quote(' '.join([args.text, *words]))}"
        ),
    )
    parser.add_argument("session", metavar="SESSION", help="the session id (a new one starts a session)")
    parser.add_argument("text", metavar="TEXT",
                        help="the message; - reads it from standard input (a long or multi-line message: "
                        "harness send s-1 - < prompt.txt)")
    parser.add_argument("--harness", metavar="NAME",
                        help="the harness to run it (needed for a new session; default: the session's own)")
    parser.add_argument("--input-id", metavar="ID", help="the input's id (resending it with the same text has no second effect; with "
                        "another text it is refused)")
    parser.add_argument("--no-wait", action="store_true", help="print the input id and exit once it is in the log")
    parser.add_argument("--timeout", type=positive_float("--timeout"), metavar="SECONDS",
                        help="give up waiting after this long (default: wait)")
    parser.add_argument("--json", action="store_true",
                        help='print the settlement as JSON (with --no-wait: {"input_id", "position"})')
    add_log_option(parser)
    return parser


def main_send(argv: list[str]) -> Coroutine[Any, Any, int]:
    """Check the arguments and read the message given as ``-``, then return the coroutine
    that sends it. The read comes first, outside the event loop: inside it, a Ctrl-C while
    a person typed the message only cancelled the task, which the blocking read never saw
    (the command went on until Ctrl-D)."""
    args = send_parser().parse_args(argv)
    check_id(args.session, "session id")
    if args.text == "-":
        args.text = stdin_text()
    args.text = utf8_argument(args.text, "the message text")
    if not args.text:  # as the gateway's body model (MessageIn) refuses it; the log takes any text
        raise ConfigError(f"the message text is empty: give the message to send, e.g. harness send "
                          f"{args.session} 'hello'", setting="TEXT")
    if args.input_id is not None:
        check_sent_input_id(args.input_id)
    return _send(args)


async def _send(args: Any) -> int:
    log = await open_log_for(args.log, role="client")
    watch = BrokerWatch(log)
    status = StatusLine(sys.stderr)
    helpers: list[asyncio.Task[None]] = []
    try:
        entries, _ = await watch.guard(scan_session(log, args.session), note="nothing was sent")
        state = fold(args.session, entries)
        harness = args.harness or state.harness
        if state.harness is not None and args.harness and args.harness != state.harness:
            raise ConfigError(
                f"session {args.session!r} runs harness {state.harness!r}, not {args.harness!r}: leave out "
                "--harness (or use a new session id)",
                setting="--harness",
            )
        if harness is None:
            raise ConfigError(
                f"session {args.session!r} is new: give --harness NAME (the harness a worker runs)",
                setting="--harness",
            )
        input_id = args.input_id or f"in-{uuid.uuid4().hex[:12]}"
        after = entries[-1].seq if entries else 0
        record = InputMessage(args.session, _now_ms(), input_id, args.text, harness)
        first = state.inputs.get(input_id)
        position = None if first is None else first.seq
        if first is None:
            sent = await _submit(log, record, "send", watch)
            position = sent.seq
            if not entries:
                after = sent.seq - 1  # a new session: follow from its first record
        elif record_payload(first.record) != record_payload(record):
            # As session.send does: refused here, nothing written (a resend with the same
            # text is the only reuse of an id that has no second effect).
            reason = f"input id {input_id!r} was already used with another payload; use a new --input-id"
            return _print_outcome(args, input_id, "rejected", "input_conflict", reason, None)
        if args.no_wait:  # (with --json, JSON all the same: a script's `| jq` reads every outcome)
            print(json.dumps({"input_id": input_id, "position": position}) if args.json else input_id)
            return 0
        helpers = [asyncio.create_task(status.run()),
                   asyncio.create_task(_hint_when_untaken(state, input_id, status, watch))]
        follow = _watch(log, args.session, input_id, state, entries, after, status, stop_when_waiting=True)
        try:
            settled = await watch.guard(
                _wait(follow, args.timeout, f"{input_id} was not settled", args.session, state, input_id),
                note=_in_log_note(input_id, args.session),
            )
        except asyncio.CancelledError:  # Ctrl-C: the input is in the log all the same
            status.clear()
            print(f"\nharness send: stopped waiting; {input_id} stays in the log and its turn runs all the same: "
                  f"'harness show {args.session}' shows how it goes", file=sys.stderr)
            raise
    finally:
        await _stop(helpers)
        status.clear()
        await log.close()
    return _report_send(args, state, input_id, settled)


def _report_send(args: Any, state: SessionState, input_id: str, settled: InputSettled | None) -> int:
    style = style_for(sys.stdout)
    if settled is None:
        now = _now_ms()
        asks = open_asks(state, now_ms=now)
        ahead = input_queued_behind_person(state, input_id, now_ms=now)
        if args.json:
            out: dict[str, Any] = {"input_id": input_id, "outcome": "waiting", "asks": [a.to_json() for a in asks]}
            if ahead is not None:
                out["queued_behind"] = ahead
            print(json.dumps(out))
        elif ahead is not None:
            turn = state.turn_of(ahead)
            print(f"{input_id}: queued behind turn {turn.turn if turn else '?'} (input {ahead}), which waits for "
                  "a person; it runs once that turn ends")
            for line in ask_lines(asks, args.session, style, waiting_answers(state)):
                print(line)
        else:
            print(f"{input_id}: the turn waits for a person")
            for line in ask_lines(asks, args.session, style, waiting_answers(state)):
                print(line)
        return EXIT_WAITING
    turn = state.turn_of(input_id)
    text = turn.finished.text if turn is not None and turn.finished is not None else None
    return _print_outcome(args, input_id, settled.outcome, settled.code, settled.reason, text)


def _print_outcome(
    args: Any, input_id: str, outcome: str, code: str | None, reason: str | None, text: str | None
) -> int:
    """Print how ``input_id`` ended: the answer (exit 0), or why not on stderr (exit 1)."""
    if args.json:
        print(json.dumps({"input_id": input_id, "outcome": outcome, "code": code, "reason": reason, "text": text}))
    elif outcome == "completed":
        print(text if text is not None else "(no text)")
    if outcome == "completed":
        return 0
    why = f" ({code}): {reason}" if code else (f": {reason}" if reason else "")
    print(f"harness send: input {input_id} {outcome}{why}", file=sys.stderr)
    return EXIT_RUNTIME


# --- harness answer ---------------------------------------------------------------------------------


def answer_parser() -> CommandParser:
    parser = CommandParser(
        prog="harness answer",
        description="Answer a question a tool asked (step.ask). The answer is checked against the ask's "
        "schema here and by the session's owner; a refused answer prints why (exit 1) and the tool "
        "keeps waiting.",
        example="  harness answer s-1 call-1.0.0 approval '{\"approved\": true}' --log sqlite:///harness.db\n"
        "  harness answer s-1 call-1.0.0 review - < review.json      # a large answer from standard input",
    )
    parser.add_argument("session", metavar="SESSION", help="the session id")
    parser.add_argument("tool_call_id", metavar="TOOL_CALL_ID", help="the call that asked ('harness show' lists it)")
    parser.add_argument("ask_name", metavar="ASK_NAME", help="the ask's name")
    parser.add_argument("value", metavar="JSON", help="the answer, as JSON; - reads it from standard input")
    parser.add_argument("--input-id", metavar="ID", help="the answer's input id (default: a new one)")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for the owner to take the answer")
    parser.add_argument("--timeout", type=positive_float("--timeout"), metavar="SECONDS",
                        help="give up waiting after this long (default: wait)")
    add_log_option(parser)
    return parser


def main_answer(argv: list[str]) -> Coroutine[Any, Any, int]:
    """Check the arguments and read the answer given as ``-`` (before the event loop, as
    ``main_send``), then return the coroutine that sends it."""
    parser = answer_parser()
    args = parser.parse_args(argv)
    check_id(args.session, "session id")
    if args.input_id is not None:
        check_id(args.input_id, "input id")
    if args.value == "-":
        args.value = stdin_text("answer", "JSON", "harness answer s-1 call-1.0.0 review - < review.json")
    return _answer(parser, args)


async def _answer(parser: CommandParser, args: Any) -> int:
    args.value = utf8_argument(args.value, "the answer")
    try:
        value = json_copy(json.loads(args.value), what="answer")
    except StepValueError as exc:  # JSON that the log cannot hold (NaN, 1e999, a lone surrogate, 2**64 ...)
        parser.error(f"{exc}; nothing was sent: change that value (a string can carry it)")
    except ValueError as exc:
        parser.error(f"the answer {args.value!r} is not valid JSON ({exc}); quote it for the shell, "
                     "e.g. '{\"approved\": true}'")
    log = await open_log_for(args.log, role="client")
    watch = BrokerWatch(log)
    helpers: list[asyncio.Task[None]] = []
    try:
        entries = await watch.guard(read_existing(log, args.session), note="nothing was sent")
        state = fold(args.session, entries)
        record = InputAnswer(args.session, _now_ms(), args.input_id or "", args.tool_call_id, args.ask_name, value)
        first = state.inputs.get(args.input_id) if args.input_id else None
        if first is not None and record_payload(first.record) != record_payload(record):
            # As for send: refused here, nothing written (the owner would settle it input_conflict).
            print(f"harness answer: answer refused (input_conflict): input id {args.input_id!r} was already used "
                  "with another payload; use a new --input-id", file=sys.stderr)
            return EXIT_RUNTIME
        verdict = judge_answer(state, args.tool_call_id, args.ask_name, value, _now_ms())
        waiting = waiting_answers(state).get((args.tool_call_id, args.ask_name))
        if verdict.ok and waiting is not None and waiting != args.input_id:
            print(f"harness answer: answer refused (answer_waiting): the answer {waiting} to "
                  f"{args.tool_call_id}/{args.ask_name} waits for the session's worker to take it; nothing was "
                  "sent (is a worker running on this log? 'harness show' tells when it was taken)", file=sys.stderr)
            return EXIT_RUNTIME
        if not verdict.ok:
            asks = ", ".join(f"{a.tool_call_id}/{a.name}" for a in open_asks(state, now_ms=_now_ms())) or "none"
            print(f"harness answer: answer refused ({verdict.code}): {verdict.reason}; nothing was sent "
                  f"(open asks: {asks})", file=sys.stderr)
            return EXIT_RUNTIME
        input_id = args.input_id or f"answer:{args.tool_call_id}:{args.ask_name}:{uuid.uuid4().hex[:8]}"
        await _submit(
            log, InputAnswer(args.session, _now_ms(), input_id, args.tool_call_id, args.ask_name, value), "answer",
            watch,
        )
        if args.no_wait:
            print(input_id)
            return 0
        status = StatusLine(sys.stderr)
        helpers = [asyncio.create_task(_hint_when_untaken(state, input_id, status, watch))]
        follow = _watch(log, args.session, input_id, state, entries, entries[-1].seq, status, stop_when_waiting=False)
        try:
            settled = await watch.guard(
                _wait(follow, args.timeout, f"the answer {input_id} was not taken", args.session, state, input_id),
                note=_in_log_note(input_id, args.session).replace("its turn runs", "the owner takes it"),
            )
        except asyncio.CancelledError:  # Ctrl-C: the answer is in the log all the same
            status.clear()
            print(f"\nharness answer: stopped waiting; the answer {input_id} stays in the log and the session's "
                  f"owner takes it all the same: 'harness show {args.session}' shows how it goes", file=sys.stderr)
            raise
    finally:
        await _stop(helpers)
        await log.close()
    assert settled is not None
    if settled.outcome == "completed":
        print(f"answer accepted: {args.tool_call_id}/{args.ask_name} goes on")
        return 0
    print(f"harness answer: answer refused by the session's owner ({settled.code}): {settled.reason}",
          file=sys.stderr)
    return EXIT_RUNTIME
