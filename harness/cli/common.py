"""What every ``harness`` command shares: its argument parser, errors as one line,
opening the log named by ``--log`` (or ``$HARNESS_LOG``), and number checks.

Exit codes: 0 done, 1 a runtime error (a broker down, a session that does not exist,
an input that failed), 2 a usage error (a wrong option, ``--app``, log URL ...), 141
(128 + SIGPIPE, silently) when the reader of the output went away (``| head``).
The traceback of an error is printed only with ``--debug``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import functools
import inspect
import logging
import os
import re
import shlex
import sys
import time
import urllib.parse
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from harness.errors import ConfigError, HarnessError, InvalidId, LogUnavailable, MissingExtra
from harness.log.base import SessionLog

__all__ = [
    "BROKER_CHECK_S",
    "BROKER_LOST_S",
    "EXIT_BROKEN_PIPE",
    "EXIT_RUNTIME",
    "EXIT_USAGE",
    "MAX_SECONDS",
    "MAX_WHOLE",
    "PROBE_TIMEOUT_S",
    "BrokerWatch",
    "CommandParser",
    "add_log_option",
    "kafka_client_config",
    "kafka_client_lines",
    "log_url",
    "open_log_for",
    "positive_float",
    "positive_int",
    "run_command",
    "telling_if_slow",
    "utf8_argument",
    "whole_number",
]

T = TypeVar("T")

EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + 13
"""The reader of stdout went away (``harness show s-1 | head -1``): what a shell reports for
a tool killed by SIGPIPE. Python ignores SIGPIPE, so it shows as ``BrokenPipeError``."""

PROBE_TIMEOUT_S = 5.0
"""How long a command waits for a Kafka broker's first answer before it says it cannot reach it."""

BROKER_CHECK_S = 2.0
"""While a command waits on a Kafka log (``send``, ``answer``, ``tail``...), how often it asks
the cluster whether it still answers."""

BROKER_LOST_S = 15.0
"""A command gives up once no broker of its Kafka log has answered for this long (the
broker stopped or became unreachable mid-command): one line, exit 1. A broker restart
shorter than this goes unnoticed."""

KAFKA_CONFIG_PREFIX = "HARNESS_KAFKA_CONFIG_"

CLIENT_LOGGERS = ("harness.log.kafka.client", "harness.live.client")
"""Where the Kafka clients' own log lines go (``harness.log.kafka.client_log``)."""


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (exit 2)."""

    def __init__(
        self, *, prog: str, description: str, example: str,
        extra_words_hint: Callable[[Any, list[str]], str] | None = None, **kw: Any,
    ) -> None:
        self.extra_words_hint = extra_words_hint
        self._given: list[str] = []
        """What words left over that are no options probably were (``send``: the rest of a
        message that was not quoted), from the parsed arguments and those words."""
        super().__init__(
            prog=prog,
            description=re.sub(r"``([^`]+)``", r"'\1'", description),  # a module docstring, as plain text
            epilog=f"example:\n{example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=False,  # a typo ('--harnes') must not work by accident as a prefix
            **kw,
        )
        self.add_argument("--debug", action="store_true", help="print the traceback of an error")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message}{self._dash_hint(message)} (see '{self.prog} --help')\n")

    def _dash_hint(self, message: str) -> str:
        """A value that starts with '-' (``harness send s-1 -hello``) is read as options:
        argparse's words for it ("argument -h/--help: ignored explicit argument 'ello'")
        do not say what to do."""
        if not any(m in message for m in ("ignored explicit argument", "required", "expected one argument")):
            return ""
        for word in self._given:
            if (len(word) > 1 and word.startswith("-") and not word.startswith("--") and not _is_number(word)
                    and word.split("=", 1)[0] not in self._option_string_actions):
                return (f"; {word!r} was read as options: a value that starts with '-' goes last, after "
                        f"'--' ({self.prog} ... -- {shlex.quote(word)})")
        return ""

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> argparse.Namespace:
        """As argparse's, with a hint after "unrecognized arguments": the option a word
        misspells (``--max-sesions``: did you mean --max-sessions?), or what words that
        are no options probably were (``extra_words_hint``)."""
        self._given = list(sys.argv[1:] if args is None else args)
        parsed: argparse.Namespace
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._hint(parsed, extras)}")
        return parsed

    def _hint(self, parsed: Any, extras: list[str]) -> str:
        for word in extras:
            if word.startswith("-"):
                options = [o for o in self._option_string_actions if o.startswith("--")]
                close = difflib.get_close_matches(word.split("=", 1)[0], options, n=1, cutoff=0.7)
                return f"; did you mean {close[0]}?" if close else ""
        return self.extra_words_hint(parsed, extras) if self.extra_words_hint else ""


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def add_log_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log", metavar="URL", default=None,
        help="the session log: sqlite:///path or kafka://host:port?topic_prefix=... (default: $HARNESS_LOG)",
    )


MAX_WHOLE = 2**31 - 1
"""The largest whole number an option takes: what Kafka (a partition count) and the C
code under the clients hold in a signed 32-bit int; a larger one failed deep inside them
(``OverflowError: signed integer is greater than maximum``) instead of as a usage error."""

MAX_SECONDS = 10.0**9
"""The longest duration an option takes (about 31 years): a longer one overflowed a
``timedelta`` or a C timeout inside the worker (``OverflowError``)."""


def seconds_or_zero(text: str) -> float:
    """An argparse type: a number of seconds >= 0 (0: none), at most ``MAX_SECONDS``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, not {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, not {text}")
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be a number of seconds from 0 to {MAX_SECONDS:.0f}, not {text}")
    return value


def whole_number(what: str, *, minimum: int = 1, maximum: int = MAX_WHOLE) -> Callable[[str], int]:
    """An argparse type: a whole number from ``minimum`` to ``maximum``; out of range or
    not a number, one line naming ``what`` and the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            shown = repr(text) if value is None else text
            raise argparse.ArgumentTypeError(f"{what} a whole number >= {minimum}, not {shown}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{what} a whole number from {minimum} to {maximum}, not {text}")
        return value

    return parse


def positive_int(name: str) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to ``MAX_WHOLE``."""
    return whole_number(f"{name} takes")


def positive_float(name: str) -> Callable[[str], float]:
    """An argparse type: a number of seconds > 0, at most ``MAX_SECONDS``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} takes a number of seconds > 0, not {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{name} takes a number of seconds > 0, not {text}")
        if value > MAX_SECONDS:
            raise argparse.ArgumentTypeError(f"{name} takes a number of seconds > 0 and at most {MAX_SECONDS:.0f}, "
                                             f"not {text}")
        return value

    return parse


def utf8_argument(text: str, what: str) -> str:
    """``text`` from the command line, refused in one line (a usage error) if it holds bytes
    that are not UTF-8: Python reads each such byte as a lone surrogate, which the log
    cannot hold. Under a locale that is not UTF-8 (ASCII: ``LC_ALL=C`` without Python's
    UTF-8 mode) a UTF-8 argument comes in as such surrogates too: its own bytes are read
    again as UTF-8, so it is taken as typed."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        with contextlib.suppress(UnicodeError):
            return os.fsencode(text).decode("utf-8")  # (the bytes as they were given; strict UTF-8)
        bad = text[exc.start]
        byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"U+{ord(bad):04X}"
        raise ConfigError(
            f"{what} holds a character that is not valid UTF-8 ({byte} at position {exc.start}): give it as "
            "UTF-8 (check the encoding of the terminal or script that passes it)",
            setting=what,
        ) from None
    return text


def kafka_client_config(env: Mapping[str, str]) -> dict[str, str]:
    """``HARNESS_KAFKA_CONFIG_<KEY>=value`` -> ``{"<key>": value}``: the key lower-cased
    with ``_`` as ``.`` and ``__`` as ``_`` (``HARNESS_KAFKA_CONFIG_SASL_PASSWORD`` ->
    ``sasl.password``, ``HARNESS_KAFKA_CONFIG_LOG__LEVEL`` -> ``log_level``), as
    Confluent's images spell librdkafka settings in the environment."""
    out = {}
    for name, value in env.items():
        if name.startswith(KAFKA_CONFIG_PREFIX) and len(name) > len(KAFKA_CONFIG_PREFIX):
            key = name[len(KAFKA_CONFIG_PREFIX):].lower()
            out["_".join(part.replace("_", ".") for part in key.split("__"))] = value
    return out


def log_url(given: str | None, env: Mapping[str, str]) -> str:
    url = given or env.get("HARNESS_LOG")
    if not url:
        raise ConfigError(
            "no session log given: pass --log URL or set HARNESS_LOG "
            "(e.g. --log sqlite:///harness.db or --log 'kafka://127.0.0.1:9092?topic_prefix=acme')",
            setting="--log",
        )
    from harness.log import blank_at_an_end

    problem = blank_at_an_end(url)
    if problem is not None:
        raise ConfigError(problem, setting="--log")
    return url


async def open_log_for(
    given: str | None,
    *,
    role: str,
    env: Mapping[str, str] | None = None,
    probe_timeout: float = PROBE_TIMEOUT_S,
    partitions: int | None = None,
    start: bool = True,
) -> SessionLog:
    """Open the log of ``--log`` (or ``$HARNESS_LOG``) for a command, checked and started.

    Args:
        role: ``reader`` (only reads: changes nothing, a SQLite file is opened
            read-only), ``client`` (reads and submits inputs; needs the log to exist:
            never creates a file or a topic) or ``worker`` (creates what is missing).
        probe_timeout: seconds a Kafka broker has to answer before the command says it
            cannot be reached (instead of librdkafka's silent retries).
        partitions: for ``worker`` on Kafka, the partition count of topics created
            here (overrides the URL's).
        start: start a Kafka log (check or create its topics); else only probe the cluster.

    Raises:
        ConfigError: no URL, or one that names no usable log.
        LogUnavailable: the log does not exist (client) or cannot be reached.
        MissingExtra: a Kafka URL without the kafka extra.
    """
    env = os.environ if env is None else env
    url = log_url(given, env)
    if url.startswith("memory:"):
        raise ConfigError(
            f"{url!r} lives inside one process; use sqlite:///path or kafka://host:port", setting="--log"
        )
    if url.startswith("sqlite:///"):
        return _open_sqlite(url, role)
    if url.startswith("kafka://"):
        return await _open_kafka(
            url, role=role, env=env, probe_timeout=probe_timeout, partitions=partitions, start=start
        )
    if url.startswith("sqlite://"):
        from harness.log import unsupported_url

        raise ConfigError(unsupported_url(url), setting="--log")
    raise ConfigError(
        f"unsupported session log URL {url!r}: use sqlite:///path or kafka://host:port[?topic_prefix=...]",
        setting="--log",
    )


async def telling_if_slow(work: Coroutine[Any, Any, T], *, after: float, note: str) -> T:
    """``await work``; if it has not finished after ``after`` seconds, print ``note`` on
    stderr once (a command reading a big log says what it does instead of going quiet)."""
    task = asyncio.ensure_future(work)
    try:
        done, _pending = await asyncio.wait([task], timeout=after)
        if not done:
            print(note, file=sys.stderr, flush=True)
        return await task
    finally:
        if not task.done():
            close_unstarted(work)
            task.cancel()


def close_unstarted(coro: Any) -> None:
    """Close ``coro`` if it never ran, and the coroutines it was given as arguments.

    A task stopped (Ctrl-C) before its first step drops its coroutine's arguments, and a
    coroutine among them (``guard(telling_if_slow(list_sessions(...)))``) made Python
    print "RuntimeWarning: coroutine ... was never awaited" under the command's one line.
    """
    if not inspect.iscoroutine(coro) or inspect.getcoroutinestate(coro) != inspect.CORO_CREATED:
        return
    frame = coro.cr_frame
    for value in list(frame.f_locals.values()) if frame is not None else []:
        close_unstarted(value)
    coro.close()


def _open_sqlite(url: str, role: str) -> SessionLog:
    from harness.log import open_log, sqlite_path

    try:
        path = urllib.parse.unquote(sqlite_path(url))  # no path, a folder, a bad option
    except ValueError as exc:
        raise ConfigError(str(exc), setting="--log") from exc
    if role != "worker" and not Path(path).is_file():
        raise LogUnavailable(
            f"no SQLite log at {path} ({Path(path).resolve()}): check --log; "
            "a worker (or HarnessHost) creates the file when it first opens it"
        )
    options = {"reader": {"read_only": True}, "client": {"create": False}}.get(role, {})
    try:
        return open_log(url, **options)
    except ValueError as exc:
        raise ConfigError(str(exc), setting="--log") from exc


async def _open_kafka(
    url: str, *, role: str, env: Mapping[str, str], probe_timeout: float, partitions: int | None, start: bool
) -> SessionLog:
    from harness.log import open_log

    options: dict[str, Any] = {"client_config": kafka_client_config(env)}
    if role in ("client", "reader"):
        options["create_topics"] = False
    elif partitions is not None:
        options["partitions"] = partitions
    try:
        log = open_log(url, **options)
    except MissingExtra:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc), setting="--log") from exc
    from harness.log.kafka.own_thread import on_own_thread
    from harness.log.kafka.topics import probe

    try:  # (not the default pool, which asyncio.run waits for: a Ctrl-C ends the probe at once)
        await on_own_thread(functools.partial(probe, log.settings, timeout=probe_timeout))  # type: ignore[attr-defined]
        if start:
            await log.start()  # type: ignore[attr-defined]
    except ValueError as exc:
        await log.close()
        raise ConfigError(f"{exc} (check the HARNESS_KAFKA_CONFIG_* variables)", setting="--log") from exc
    except BaseException:
        await log.close()
        raise
    return log


@contextlib.contextmanager
def kafka_client_lines(*, debug: bool) -> Iterator[None]:
    """The Kafka clients' own log lines (librdkafka's ``Connect to ... failed`` and such)
    during a session command: none by default (a broker that cannot be reached is one line
    of the command's own, see :class:`BrokerWatch`), all of them on stderr with ``--debug``
    (throttled and scrubbed of secrets). A worker or the gateway configures its own
    logging (``harness.logs.configure``) and does not use this."""
    loggers = [logging.getLogger(name) for name in CLIENT_LOGGERS]
    saved = [(lg, lg.level, lg.propagate) for lg in loggers]
    handler: logging.Handler | None = None
    if debug:
        from harness.logs import SecretFilter

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("kafka client %(levelname)s: %(message)s"))
        handler.addFilter(SecretFilter())
    for lg in loggers:
        lg.setLevel(logging.DEBUG if debug else logging.CRITICAL + 1)
        lg.propagate = False  # (never Python's last-resort handler, which prints bare WARNINGs)
        if handler is not None:
            lg.addHandler(handler)
    try:
        yield
    finally:
        for lg, level, propagate in saved:
            lg.setLevel(level)
            lg.propagate = propagate
            if handler is not None:
                lg.removeHandler(handler)


class BrokerWatch:
    """Keeps asking a Kafka log's cluster whether it answers while a command waits on it
    (every ``every`` seconds), and stops the wait once no broker has answered for
    ``lost_after`` seconds: librdkafka itself retries for ever, so a ``send`` whose broker
    went away mid-command would otherwise wait silently. Does nothing on other logs."""

    def __init__(self, log: Any, *, every: float = BROKER_CHECK_S, lost_after: float = BROKER_LOST_S) -> None:
        self._check: Callable[[float], Coroutine[Any, Any, None]] | None = getattr(log, "check_reachable", None)
        settings = getattr(log, "settings", None)
        self._bootstrap = getattr(settings, "bootstrap", "?")
        self._every = every
        self._lost_after = lost_after
        self._last_ok = time.monotonic()  # (the log was just opened: its probe answered)
        self.failing = False
        """The last check got no answer."""
        self.lost = False
        """The watch gave up: a wait it stopped must not print its Ctrl-C note."""

    def _lost_error(self, note: str) -> LogUnavailable:
        silent = time.monotonic() - self._last_ok
        return LogUnavailable(
            f"lost the Kafka cluster at {self._bootstrap}: no broker answered for {silent:.0f} s; check that the "
            f"broker is up and that --log (or HARNESS_LOG) names it{'; ' + note if note else ''}"
        )

    async def guard(self, work: Coroutine[Any, Any, T], *, note: str = "") -> T:
        """``await work``, unless the cluster stops answering meanwhile: then ``work`` is
        cancelled and ``LogUnavailable`` (one line: the servers, the fix, and ``note``) raised."""
        if self._check is None:
            return await work  # (no task: a Ctrl-C before it starts cannot drop its coroutine unawaited)
        task = asyncio.ensure_future(work)
        check: asyncio.Future[None] | None = None
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self._every)
                if not done:
                    check = asyncio.ensure_future(self._check(min(PROBE_TIMEOUT_S, self._lost_after)))
                    await asyncio.wait({task, check}, return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    try:
                        return task.result()
                    except LogUnavailable as exc:  # (a read or submit that timed out: say what it means)
                        if self.failing:
                            raise self._lost_error(note) from exc
                        raise
                assert check is not None
                try:
                    check.result()
                except LogUnavailable:
                    self.failing = True
                    if time.monotonic() - self._last_ok >= self._lost_after:
                        self.lost = True
                        raise self._lost_error(note) from None
                else:
                    self.failing = False
                    self._last_ok = time.monotonic()
                check = None
        finally:
            close_unstarted(work)
            for pending in (check, task):
                if pending is not None and not pending.done():
                    pending.cancel()
            with contextlib.suppress(BaseException):
                await task


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text


def run_command(
    prog: str, argv: Sequence[str], main: Callable[[list[str]], int | Coroutine[Any, Any, int]]
) -> int:
    """Run a command's ``main(argv)``; an error becomes one line on stderr and an exit code."""
    debug = "--debug" in argv
    try:
        result = main(list(argv))
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return int(result or 0)
    except SystemExit as exc:  # argparse (usage errors, --help)
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_USAGE)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise  # the output's reader went away: no message (see harness.cli.main)
    except (ConfigError, InvalidId) as exc:  # (an id on the command line is the caller's to fix)
        _report(prog, _one_line(exc), exc, debug)
        return EXIT_USAGE
    except (HarnessError, TimeoutError) as exc:
        _report(prog, _one_line(exc), exc, debug)
        return EXIT_RUNTIME
    except Exception as exc:  # noqa: BLE001 - a bug or an unexpected failure: one line unless --debug
        _report(prog, f"unexpected error: {type(exc).__name__}: {_one_line(exc)}", exc, debug,
                hint=" (run with --debug for the traceback)")
        return EXIT_RUNTIME


def output_closed() -> int:
    """The exit code once stdout's reader went away, with nothing more said: stdout now
    writes to devnull, so flushing it at exit cannot fail again (as the Python docs on
    SIGPIPE advise)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's capture): nothing to flush
        return EXIT_BROKEN_PIPE
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    return EXIT_BROKEN_PIPE


def _report(prog: str, line: str, exc: BaseException, debug: bool, hint: str = "") -> None:
    from harness.logs import SECRETS

    if debug:
        import traceback

        print(SECRETS.scrub("".join(traceback.format_exception(exc))), end="", file=sys.stderr)
    print(SECRETS.scrub(f"{prog}: {line}{'' if debug else hint}"), file=sys.stderr)
