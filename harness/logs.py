"""Logging: context fields on every line, secrets scrubbed, text or JSON lines.

The library logs through :mod:`logging` under ``harness.*`` and configures nothing;
a process that wants the harness's log lines calls :func:`configure` (the ``harness``
commands do) or adds :class:`ContextFilter` and :class:`SecretFilter` to its own handler.

* **Context.** A session's driver sets :data:`session_id`, :data:`input_id` and
  :data:`tool_call_id` (``contextvars``, so every line logged inside a turn or a tool,
  the tool's own ``logging`` calls included, knows them); :class:`ContextFilter` puts
  them on each record.
* **Secrets.** :data:`SECRETS` holds every secret value this process gives to sessions
  (a worker registers them); :class:`SecretFilter` replaces each one with
  ``[secret:<name>]`` in the message, its arguments and the traceback before any
  handler sees the record.
* **Formats.** ``text``: ``time LEVEL logger message [session=.. input=.. call=..]``;
  ``json``: one object per line with ``ts``, ``level``, ``logger``, ``message``,
  ``session_id``, ``input_id``, ``tool_call_id`` (where known) and ``exc``.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import IO, Any

__all__ = [
    "LOG_FORMATS",
    "SECRETS",
    "ContextFilter",
    "JsonFormatter",
    "SecretFilter",
    "SecretRegistry",
    "TextFormatter",
    "bind",
    "configure",
    "input_id",
    "lease_wait_message",
    "parse_level",
    "session_id",
    "tool_call_id",
]

session_id: ContextVar[str | None] = ContextVar("harness_session_id", default=None)
input_id: ContextVar[str | None] = ContextVar("harness_input_id", default=None)
tool_call_id: ContextVar[str | None] = ContextVar("harness_tool_call_id", default=None)

_FIELDS = (("session_id", session_id), ("input_id", input_id), ("tool_call_id", tool_call_id))

LOG_FORMATS = ("text", "json")


def bind(**values: str | None) -> None:
    """Set context fields (``session_id=``, ``input_id=``, ``tool_call_id=``) for the
    current task and what it starts; an asyncio task keeps its own copy."""
    known = dict(_FIELDS)
    for name, value in values.items():
        var = known.get(name)
        if var is None:
            raise TypeError(f"unknown log context field {name!r}; known: {', '.join(known)}")
        var.set(value)


class ContextFilter(logging.Filter):
    """Adds ``session_id``, ``input_id`` and ``tool_call_id`` to each record (None where
    unknown); a value given with ``extra=`` wins."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, var in _FIELDS:
            if getattr(record, name, None) is None:
                setattr(record, name, var.get())
        return True


class SecretRegistry:
    """Secret values (name -> value) this process knows; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_value: dict[str, str] = {}
        self._ordered: list[tuple[str, str]] = []

    def add(self, secrets: Mapping[str, str] | Iterable[tuple[str, str]]) -> None:
        """Remember ``name -> value`` pairs (empty values are ignored)."""
        items = secrets.items() if isinstance(secrets, Mapping) else secrets
        with self._lock:
            changed = False
            for name, value in items:
                if value and value not in self._by_value:
                    self._by_value[value] = name
                    changed = True
            if changed:  # longest first, so a secret that contains another is replaced whole
                self._ordered = sorted(self._by_value.items(), key=lambda i: -len(i[0]))

    def clear(self) -> None:
        with self._lock:
            self._by_value.clear()
            self._ordered = []

    def scrub(self, text: str) -> str:
        for value, name in self._ordered:
            if value in text:
                text = text.replace(value, f"[secret:{name}]")
        return text

    def __bool__(self) -> bool:
        return bool(self._ordered)


SECRETS = SecretRegistry()
"""The process's secret values; :class:`SecretFilter` scrubs them from log records."""


class SecretFilter(logging.Filter):
    """Scrubs registered secret values from a record's message, context fields and traceback.

    The message is rendered (``msg % args``) and scrubbed once, here, so no handler
    or formatter ever sees a secret.
    """

    def __init__(self, registry: SecretRegistry = SECRETS) -> None:
        super().__init__()
        self._registry = registry

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._registry:
            return True
        record.msg = self._registry.scrub(record.getMessage())
        record.args = None
        for name, _ in _FIELDS:  # the context too: an id that holds a secret is refused, not hidden, but
            value = getattr(record, name, None)  # its refusal is logged with it
            if isinstance(value, str):
                setattr(record, name, self._registry.scrub(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._registry.scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = self._registry.scrub(record.stack_info)
        return True


class TextFormatter(logging.Formatter):
    """``2025-01-31 12:00:01,123 INFO harness.session turn 1 started [session=s-1 input=in-1]``"""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        context = " ".join(
            f"{short}={value}"
            for short, name in (("session", "session_id"), ("input", "input_id"), ("call", "tool_call_id"))
            if (value := getattr(record, name, None)) is not None
        )
        return f"{line} [{context}]" if context else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, _ in _FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = record.stack_info
        return json.dumps(out, ensure_ascii=False, default=str)


def _iso(created: float) -> str:
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{whole}.{int(created % 1 * 1000):03d}Z"


_LEVELS = {"critical": logging.CRITICAL, "error": logging.ERROR, "warning": logging.WARNING,
           "warn": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}


def parse_level(text: str) -> int:
    """``debug`` / ``INFO`` / ``warning`` ... (any case) as a logging level.

    Raises:
        ValueError: not a level name.
    """
    level = _LEVELS.get(text.strip().lower())
    if level is None:
        raise ValueError(f"unknown log level {text!r}; use one of debug, info, warning, error, critical")
    return level


_installed: logging.Handler | None = None


def configure(
    *, level: int | str = logging.INFO, fmt: str = "text", stream: IO[str] | None = None,
    client_level: int | None = None,
) -> logging.Handler:
    """Send every log record to ``stream`` (stderr) as text or JSON lines, with context
    fields and secrets scrubbed. Replaces the handler of an earlier call.

    Args:
        level: the root level (a name such as ``"debug"``, or a number).
        fmt: ``text`` or ``json``.
        stream: where lines go (default ``sys.stderr``).
        client_level: the level of the Kafka client's own lines
            (``harness.log.kafka.client``); default: the same as ``level``.
    """
    global _installed
    if fmt not in LOG_FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; use text or json")
    number = parse_level(level) if isinstance(level, str) else level
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    handler.addFilter(SecretFilter())
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    root.addHandler(handler)
    root.setLevel(number)
    logging.getLogger("harness.log.kafka.client").setLevel(client_level if client_level is not None else number)
    # The model SDKs' HTTP client logs a line per request at INFO: on a worker, one a model
    # call, saying nothing its own lines do not. Shown at DEBUG only.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(number if number <= logging.DEBUG else max(number, logging.WARNING))
    _installed = handler
    return handler


def lease_wait_message(
    session: str, owner: str | None, lease_until: float | None, now: float, *, holder_pid: int | None = None,
    keep_until: float | None = None,
) -> str:
    """``waiting for the lease of session s-1, held by HOST until 12:00:31 (14 s)``
    (local time; the seconds left rounded up). With ``holder_pid``: the lease ran out
    but its holder is alive on this machine (``harness.log.holder``), said so with the fix."""
    holder = owner or "another owner"
    if holder_pid is not None and keep_until is not None:
        return (
            f"waiting for session {session}: the lease of {holder} ran out, but its process {holder_pid} is still "
            f"alive on this machine, likely in a call that holds the GIL (a long C computation) and stops its "
            f"renewals; it keeps the session until {time.strftime('%H:%M:%S', time.localtime(keep_until))} "
            f"({max(0, int(-(-(keep_until - now) // 1)))} s) unless it goes on first: stop process {holder_pid} to "
            "take over at once, or run such code in a subprocess"
        )
    if lease_until is None:
        return f"waiting for the lease of session {session}, held by {holder}"
    left = max(0, int(-(-(lease_until - now) // 1)))
    clock = time.strftime("%H:%M:%S", time.localtime(lease_until))
    return f"waiting for the lease of session {session}, held by {holder} until {clock} ({left} s)"
