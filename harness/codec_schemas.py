"""Avro schemas of the session log records: loaded once, fingerprinted, versioned.

Part of the codec (``harness.codec`` re-exports the public names). The ``.avsc`` files
in ``schemas/`` (shipped in the wheel as ``harness/schemas``) are today's versions;
``schemas/history/<type>.<n>.avsc`` are the versions written before. A record written
with an older version is read with that version and resolved to today's (a field added
later gets its default).
"""

from __future__ import annotations

import importlib.resources
import json
import threading
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path
from typing import Any

from fastavro import parse_schema
from fastavro.schema import to_parsing_canonical_form

from harness.errors import CodecError
from harness.records import RECORD_CLASSES, ModelResponseRecord, Record

__all__ = ["NAMESPACE", "crc64_avro", "schema_dir"]

NAMESPACE = "harness.v1"


# --- CRC-64-AVRO (Rabin) fingerprint, as in the Avro specification -----------------------

_EMPTY64 = 0xC15D213AA4D7A795


def _make_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY64 & -(fp & 1))
        table.append(fp)
    return tuple(table)


_FP_TABLE = _make_table()


def crc64_avro(data: bytes) -> bytes:
    """CRC-64-AVRO fingerprint of ``data`` as 8 little-endian bytes (single-object order)."""
    fp = _EMPTY64
    for byte in data:
        fp = (fp >> 8) ^ _FP_TABLE[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


# --- errors --------------------------------------------------------------------------------


def _error(message: str, raw: bytes | None = None, record_type: str | None = None) -> CodecError:
    return CodecError(message, raw=raw if raw is not None else b"", record_type=record_type)


# --- schemas ---------------------------------------------------------------------------------


def schema_dir() -> Path:
    """The folder holding the ``.avsc`` files: packaged ``harness/schemas``, else repo ``schemas/``."""
    try:
        packaged = importlib.resources.files("harness") / "schemas"
        # A zip or namespace-package Traversable is not a Path: use the repo folder then.
        if isinstance(packaged, Path) and packaged.is_dir():
            return packaged
    except (ModuleNotFoundError, NotADirectoryError, OSError, TypeError):
        pass
    return Path(__file__).resolve().parents[1] / "schemas"


@dataclass(frozen=True, slots=True, eq=False)
class _Schema:
    """One record type's schema and everything the hot path needs about it."""

    cls: type[Record]
    record_type: str
    full_name: str  # harness.v1.<RecordName>
    parsed: Any  # fastavro parsed schema
    canonical: str  # Parsing Canonical Form
    documented: str  # the .avsc as compact JSON, docs included (what a registry gets)
    fingerprint: bytes
    names: tuple[str, ...]  # every field, in schema order
    plain: tuple[str, ...]  # fields that go as they are
    json_fields: tuple[str, ...]
    get_plain: attrgetter[Any]
    has_tool_calls: bool  # a model response: its tool_calls and thinking need the codec's care


@dataclass(frozen=True, slots=True, eq=False)
class _Writer:
    """A schema records may have been written with: today's (``parsed`` None) or an older one."""

    schema: _Schema  # today's schema of the record type (what decode resolves to)
    parsed: Any  # the older writer schema, parsed; None for today's


_schemas_lock = threading.Lock()
_schemas: dict[str, _Schema] | None = None
_writers: dict[bytes, _Writer] | None = None


def _load_schemas() -> dict[str, _Schema]:
    """Every record type's schema, read and checked once per process."""
    global _schemas
    if _schemas is not None:
        return _schemas
    with _schemas_lock:
        if _schemas is None:
            root = schema_dir()
            _schemas = {cls.TYPE: _build_schema(cls, root) for cls in RECORD_CLASSES}
    return _schemas


def _load_writers() -> dict[bytes, _Writer]:
    """Fingerprint -> writer schema, for today's schemas and every older version."""
    global _writers
    if _writers is not None:
        return _writers
    schemas = _load_schemas()
    found = {s.fingerprint: _Writer(s, None) for s in schemas.values()}
    history = schema_dir() / "history"
    for path in sorted(history.glob("*.avsc")) if history.is_dir() else ():
        record_type = path.name.rsplit(".", 2)[0]
        current = schemas.get(record_type)
        if current is None:
            raise _error(f"schema {path} is an older version of no known record type", record_type=record_type)
        try:
            parsed = parse_schema(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise _error(f"cannot load schema {path}: {exc}", record_type=record_type) from exc
        fingerprint = crc64_avro(to_parsing_canonical_form(parsed).encode("utf-8"))
        found.setdefault(fingerprint, _Writer(current, parsed))
    with _schemas_lock:
        _writers = found
    return found


def _build_schema(cls: type[Record], root: Path) -> _Schema:
    path = root / f"{cls.TYPE}.avsc"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        parsed = parse_schema(raw)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise _error(f"cannot load schema {path}: {exc}", record_type=cls.TYPE) from exc
    names = tuple(f["name"] for f in raw["fields"])
    expected = tuple(f.name for f in fields(cls))
    # The dataclass and the schema must agree exactly, or records would silently lose fields.
    if names != expected or raw.get("namespace") != NAMESPACE:
        raise _error(
            f"schema {path} does not match {cls.__name__}: fields {names} vs {expected}, "
            f"namespace {raw.get('namespace')!r} vs {NAMESPACE!r}",
            record_type=cls.TYPE,
        )
    has_tool_calls = cls is ModelResponseRecord
    special = set(cls.JSON_FIELDS) | ({"tool_calls", "thinking"} if has_tool_calls else set())
    plain = tuple(n for n in names if n not in special)
    canonical = to_parsing_canonical_form(parsed)
    return _Schema(
        cls=cls,
        record_type=cls.TYPE,
        full_name=f"{NAMESPACE}.{raw['name']}",
        parsed=parsed,
        canonical=canonical,
        documented=json.dumps(raw, separators=(",", ":"), ensure_ascii=False),
        fingerprint=crc64_avro(canonical.encode("utf-8")),
        names=names,
        plain=plain,
        json_fields=tuple(cls.JSON_FIELDS),
        get_plain=attrgetter(*plain),
        has_tool_calls=has_tool_calls,
    )


def _record_type_for_name(full_name: str) -> str | None:
    for schema in _load_schemas().values():
        if schema.full_name == full_name:
            return schema.record_type
    return None
