"""Session logs: the contract (:mod:`harness.log.base`) and its backends, chosen by URL.

::

    open_log("memory:")                       # in-process, for tests
    open_log("sqlite:///harness.db")          # relative path
    open_log("sqlite:////var/lib/harness.db") # absolute path
    open_log("kafka://127.0.0.1:9092?topic_prefix=acme")

Backends are imported lazily, so an embedded user never needs librdkafka.

The small private helpers at the bottom are shared by the backends (encoding a
batch, decoding a stored row into a :class:`LogEntry` or a
:class:`~harness.errors.CorruptRecord`), so each backend only does storage.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from harness.errors import CodecError, CorruptRecord, MissingExtra
from harness.log.base import LeaseInfo, LogEntry, SessionLog, SessionWriter
from harness.records import Record

__all__ = ["LeaseInfo", "LogEntry", "SessionLog", "SessionWriter", "check_log", "open_client_log", "open_log", "sqlite_path"]

SUPPORTED_URLS = ("memory:", "sqlite:///<path>", "kafka://<host:port>[,<host:port>][?...]")


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
            or ``kafka://host:port[,host:port][?options]``.
        **options: keyword arguments for the backend (``clock=``, ``codec=``,
            ``busy_timeout=`` ...).

    Raises:
        TypeError: ``url`` is not a string.
        ValueError: the URL names no supported backend, or a SQLite URL names a folder.
        MissingExtra: a Kafka URL without ``confluent_kafka`` installed.
    """
    _check_url(url)
    if url == "memory:" or url == "memory://":
        from harness.log.memory import MemoryLog

        return MemoryLog(**options)
    if url.startswith("sqlite:///"):
        from harness.log.sqlite import SqliteLog

        return SqliteLog(sqlite_path(url), **options)
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
    raise ValueError(f"unsupported session log URL {url!r}; supported: {', '.join(SUPPORTED_URLS)}")


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


def sqlite_path(url: str) -> str:
    """The database file a ``sqlite:///`` URL names.

    Raises:
        ValueError: no path, URL options (they are keywords of ``open_log``), or the
            path is a folder (sqlite3 would only say "unable to open database file").
    """
    path = url[len("sqlite:///"):]
    if not path:
        raise ValueError(f"no database path in {url!r}: use sqlite:///relative or sqlite:////absolute")
    if "?" in path:
        raise ValueError(f"{url!r}: SQLite takes no URL options; pass them as keywords to open_log()")
    if Path(path).is_dir():
        raise ValueError(
            f"{url!r} names the folder {Path(path).resolve()}, not a file: name the log's file in it, "
            f"e.g. {url.rstrip('/')}/harness.db"
        )
    return path


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
        raise ValueError(f"lease must be positive, got {lease!r}")
    return seconds


def _encode_batch(codec: _Codec, session_id: str, records: Sequence[Record]) -> list[tuple[str, bytes]]:
    """``(type, bytes)`` per record; raises before anything is stored (atomic batches)."""
    out: list[tuple[str, bytes]] = []
    for record in records:
        if record.session_id != session_id:
            raise ValueError(
                f"record {record.TYPE} belongs to session {record.session_id!r}, "
                f"not to this writer's session {session_id!r}"
            )
        out.append((record.TYPE, codec.encode(record)))
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
