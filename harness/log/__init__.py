"""Session logs: the contract (:mod:`harness.log.base`) and its backends, chosen by URL.

::

    open_log("memory:")                       # in-process, for tests
    open_log("sqlite:///harness.db")          # relative path
    open_log("sqlite:////var/lib/harness.db") # absolute path
    open_log("kafka://127.0.0.1:9092?topic_prefix=acme")

Backends are imported lazily, so an embedded user never needs librdkafka.

Every backend refuses a record larger than it takes with
:class:`~harness.errors.RecordTooLarge`, writing nothing of that append. Kafka's limit
is its clients' ``message.max.bytes`` (and the topic's ``max.message.bytes``); the SQLite
and memory logs take records up to ``max_record_bytes`` (the encoded record, as stored),
:data:`DEFAULT_MAX_RECORD_BYTES` unless the URL or a keyword says otherwise::

    open_log("sqlite:///harness.db?max_record_bytes=4000000")   # 4 MB records
    open_log("memory:?max_record_bytes=20000")

The small private helpers at the bottom are shared by the backends (encoding a
batch, decoding a stored row into a :class:`LogEntry` or a
:class:`~harness.errors.CorruptRecord`), so each backend only does storage.
"""

from __future__ import annotations

import importlib.util
import sys
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from harness.errors import CodecError, CorruptRecord, LogConfigError, MissingExtra, RecordTooLarge
from harness.log.base import LeaseInfo, LogEntry, SessionLog, SessionWriter
from harness.records import Record

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "LeaseInfo",
    "LogEntry",
    "SessionLog",
    "SessionWriter",
    "blank_at_an_end",
    "check_log",
    "open_client_log",
    "open_log",
    "parse_sqlite_url",
    "sqlite_path",
    "unsupported_url",
]

SUPPORTED_URLS = (
    "memory:[?max_record_bytes=N]",
    "sqlite:///<path>[?max_record_bytes=N]",
    "kafka://<host:port>[,<host:port>][?...]",
)

DEFAULT_MAX_RECORD_BYTES = 1_000_000
"""The largest record (encoded, in bytes) the SQLite and memory logs take by default:
what a Kafka log takes by default (its clients' ``message.max.bytes``, librdkafka's
1000000, which also counts the record's key and headers, a few hundred bytes at most),
so a session that fits one backend fits the others."""

SQLITE_MAX_RECORD_BYTES = 999_000_000
"""The most ``max_record_bytes`` may be on SQLite: its own limit on a value and on a row
(``SQLITE_MAX_LENGTH``, 1e9 bytes by default), less room for the row's other columns. A
larger value would fail a whole group commit with ``LogUnavailable`` instead of one append."""

_LOG_URL_OPTIONS = ("max_record_bytes",)


def open_client_log(url: str, **options: Any) -> SessionLog:
    """The log of ``url`` opened by a client of it (``HarnessClient``, ``harness gateway``),
    which never creates it: no Kafka topic, no SQLite file or tables (a missing or empty
    file is a typo, or a log no worker made yet).

    Raises:
        LogUnavailable: no SQLite file at the URL's path, or one that is not a log.
        ValueError: as :func:`open_log`.
        TypeError: ``url`` is not a string.
    """
    _check_url(url)
    if url.startswith("kafka://"):
        return open_log(url, create_topics=False, **options)
    if url.startswith("sqlite:///"):
        from harness.errors import LogUnavailable

        path = Path(sqlite_path(url))
        if not path.is_file():
            raise LogUnavailable(
                f"no SQLite log at {path} ({path.resolve()}): check the URL; a worker (or HarnessHost) "
                "creates the file when it first opens it"
            )
        options.setdefault("create", False)
    return open_log(url, **options)


def open_log(url: str, **options: Any) -> SessionLog:
    """Open a session log by URL.

    Args:
        url: ``memory:``, ``sqlite:///relative/path``, ``sqlite:////absolute/path``
            or ``kafka://host:port[,host:port][?options]``. A memory or SQLite URL
            takes one option, ``max_record_bytes=N``: the largest record the log takes
            (encoded, in bytes; :data:`DEFAULT_MAX_RECORD_BYTES` by default), e.g.
            ``sqlite:///harness.db?max_record_bytes=4000000``.
        **options: keyword arguments for the backend (``clock=``, ``codec=``,
            ``busy_timeout=``, ``max_record_bytes=`` ...); they win over the URL's.

    Raises:
        TypeError: ``url`` is not a string.
        LogConfigError: (a ``ConfigError``, a ``HarnessError`` and a ``ValueError``) the
            URL names no supported backend, a SQLite URL names a folder, or an option
            is unknown or malformed.
        MissingExtra: a Kafka URL without ``confluent_kafka`` installed.
    """
    _check_url(url)
    base, _, query = url.partition("?")
    if base == "memory:" or base == "memory://":
        from harness.log.memory import MemoryLog

        return MemoryLog(**{**_log_url_options(url, query), **options})
    if url.startswith("sqlite:///"):
        from harness.log.sqlite import SqliteLog

        path, url_options = parse_sqlite_url(url)
        return SqliteLog(path, **{**url_options, **options})
    if url.startswith("kafka://"):
        try:
            from harness.log.kafka.log import open_kafka_log  # type: ignore[import-not-found, unused-ignore]
        except ImportError as exc:
            # Only a missing client library is the user's missing extra; any other
            # import failure is a bug and must surface as itself.
            if importlib.util.find_spec("confluent_kafka") is None:
                raise MissingExtra("the Kafka session log", "kafka") from exc
            raise
        log: SessionLog = open_kafka_log(url, **options)
        return log
    raise LogConfigError(unsupported_url(url))


def unsupported_url(url: str) -> str:
    """Why ``url`` names no session log, and what to write instead (one line): the one
    message of ``open_log`` and of the ``harness`` commands' ``--log``."""
    if url.startswith("sqlite://"):  # two slashes: what follows reads as a host, not a path
        rest = url[len("sqlite://"):]
        return (
            f"{url!r} has two slashes after 'sqlite:'; a path needs three: sqlite:///{rest} (relative to the "
            f"current folder) or four for an absolute one: sqlite:////{rest.lstrip('/')}"
        )
    return f"unsupported session log URL {url!r}; supported: {', '.join(SUPPORTED_URLS)}"


def check_log(log: object) -> SessionLog:
    """``log`` if it is a session log (made by ``open_log``, or a backend of your own).

    Raises:
        TypeError: it is not (None, a path, a number ...).
    """
    if not (callable(getattr(log, "submit", None)) and callable(getattr(log, "read", None))):
        raise TypeError(
            f"log= takes a session log or its URL, not {type(log).__name__}: "
            "e.g. log='sqlite:///harness.db' or log=open_log('sqlite:///harness.db')"
        )
    return log  # type: ignore[return-value]


def _check_url(url: object) -> None:
    if not isinstance(url, str):
        raise TypeError(
            f"open_log() takes a log URL as a string, not {type(url).__name__}: "
            f"e.g. open_log('sqlite:///harness.db'); supported: {', '.join(SUPPORTED_URLS)}"
        )
    problem = blank_at_an_end(url)
    if problem is not None:
        raise LogConfigError(problem)


def blank_at_an_end(url: str) -> str | None:
    """Why ``url`` is refused if it has a space or a line break at an end (else None): a
    value read from a file or a Secret keeps its last line break, and a SQLite log named
    ``harness.db\n`` would be made beside ``harness.db``, its sessions seen by nobody
    who gives the clean URL."""
    if url == url.strip():
        return None
    return (f"the log URL {url!r} has a space or a line break at its end: remove it (a value read from a file "
            "or a Secret often keeps its last line break)")


def sqlite_path(url: str) -> str:
    """The database file a ``sqlite:///`` URL names (its options checked: see
    :func:`parse_sqlite_url`).

    Raises:
        ValueError: as :func:`parse_sqlite_url`.
    """
    return parse_sqlite_url(url)[0]


def parse_sqlite_url(url: str) -> tuple[str, dict[str, Any]]:
    """``sqlite:///path[?max_record_bytes=N]`` as the database file and the keyword
    arguments of :class:`~harness.log.sqlite.SqliteLog`.

    Raises:
        ValueError: no path, the path is a folder (sqlite3 would only say "unable to open
            database file"), or an unknown or malformed option.
    """
    _check_url(url)
    path, _, query = url[len("sqlite:///"):].partition("?")
    if not path:
        raise LogConfigError(f"no database path in {url!r}: use sqlite:///relative or sqlite:////absolute")
    options = _log_url_options(url, query)
    if Path(path).is_dir():
        raise LogConfigError(
            f"{url!r} names the folder {Path(path).resolve()}, not a file: name the log's file in it, "
            f"e.g. {url.partition('?')[0].rstrip('/')}/harness.db"
        )
    return path, options


def _log_url_options(url: str, query: str) -> dict[str, Any]:
    """The options of a memory or SQLite URL (after its ``?``) as keyword arguments."""
    out: dict[str, Any] = {}
    if not query:
        return out
    for name, values in urllib.parse.parse_qs(query, keep_blank_values=True).items():
        if name not in _LOG_URL_OPTIONS:
            raise LogConfigError(
                f"{url!r}: unknown option {name!r}; the URL takes {', '.join(_LOG_URL_OPTIONS)}, other "
                "settings are keywords of open_log()"
            )
        if len(values) != 1:
            raise LogConfigError(f"{url!r}: option {name!r} is given {len(values)} times; give it once")
        value = values[0]
        if not (value.isascii() and value.isdigit()) or int(value) <= 0:
            raise LogConfigError(
                f"{url!r}: {name} must be a whole number of bytes above 0 (e.g. {name}=4000000 for 4 MB), "
                f"not {values[0]!r}"
            )
        out[name] = int(value)
    if not out:  # only separators: '?&'
        raise LogConfigError(f"{url!r}: an empty option list; known options: {', '.join(_LOG_URL_OPTIONS)}")
    return out


# --- helpers shared by the backends ------------------------------------------------------


class _Codec(Protocol):
    def encode(self, record: Record) -> bytes: ...

    def decode(self, data: bytes) -> Record: ...

    def peek_type(self, data: bytes) -> str: ...

    def framed_type(self, data: bytes) -> str | None: ...

    def decode_fields(self, data: bytes) -> tuple[str, dict[str, Any]]: ...


def _default_codec() -> _Codec:
    from harness.codec import default_codec

    return default_codec()


def _lease_seconds(lease: timedelta | float) -> float:
    seconds = lease.total_seconds() if isinstance(lease, timedelta) else float(lease)
    if seconds <= 0:
        raise LogConfigError(f"lease must be positive, got {lease!r}")
    return seconds


def _max_record_bytes(value: object, *, ceiling: int | None = None, why: str = "") -> int:
    """``value`` if it is a usable ``max_record_bytes`` (a whole number of bytes > 0, at
    most ``ceiling``; ``why`` says why that is the most).

    Raises:
        ValueError: it is not (a bool, a float, 0, over ``ceiling`` ...).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise LogConfigError(f"max_record_bytes must be a whole number of bytes above 0, not {value!r}")
    if ceiling is not None and value > ceiling:
        raise LogConfigError(f"max_record_bytes is at most {ceiling}{why}, not {value}")
    return value


@dataclass(frozen=True, slots=True)
class _RecordLimit:
    """The largest record (encoded bytes) a log takes, and how its user raises that."""

    max_bytes: int
    raise_limit: str  # e.g. "the log URL's max_record_bytes: sqlite:///harness.db?max_record_bytes=N"

    def refused(self, record: Record, size: int) -> RecordTooLarge:
        return RecordTooLarge(
            f"a {record.TYPE} record of session {record.session_id!r} is {size} bytes, more than the session log "
            f"accepts ({self.max_bytes} bytes); nothing of it was written: send or store less, or raise the "
            f"log's record limit ({self.raise_limit})",
            session_id=record.session_id,
            size=size,
            limit=self.max_bytes,
            raise_limit=self.raise_limit,
        )


def _encode_batch(
    codec: _Codec, session_id: str, records: Sequence[Record], limit: _RecordLimit | None = None
) -> list[tuple[str, bytes]]:
    """``(type, bytes)`` per record; raises before anything is stored (atomic batches):
    ``RecordTooLarge`` for a record over ``limit`` (checked here, before the write is
    queued, so a group commit never holds it)."""
    max_bytes = sys.maxsize if limit is None else limit.max_bytes
    out: list[tuple[str, bytes]] = []
    for record in records:
        if record.session_id != session_id:
            raise ValueError(
                f"record {record.TYPE} belongs to session {record.session_id!r}, "
                f"not to this writer's session {session_id!r}"
            )
        value = codec.encode(record)
        if len(value) > max_bytes:
            assert limit is not None
            raise limit.refused(record, len(value))
        out.append((record.TYPE, value))
    return out


def _check_input(record: Record) -> None:
    if not type(record).IS_INPUT:
        raise ValueError(
            f"submit() takes input records only (IS_INPUT), not {record.TYPE or type(record).__name__}; "
            "other records are appended by the session's owner through claim()"
        )


def _decode_row(codec: _Codec, session_id: str, seq: int, raw: bytes) -> LogEntry | CorruptRecord:
    """A stored row as an entry, or as the error describing why it cannot be read."""
    try:
        return LogEntry(seq, codec.decode(raw))
    except CodecError as exc:  # only this row is unreadable (an outage is not a corrupt row)
        err = CorruptRecord(
            f"record seq={seq} of session {session_id!r} cannot be decoded: {exc}",
            session_id=session_id,
            seq=seq,
            raw=raw,
        )
        err.__cause__ = exc
        return err


def _strict(items: Sequence[LogEntry | CorruptRecord]) -> list[LogEntry]:
    """The entries, or raise the first corrupt row."""
    out: list[LogEntry] = []
    for item in items:
        if isinstance(item, CorruptRecord):
            raise item
        out.append(item)
    return out
