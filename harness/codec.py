"""Encode and decode session log records as Avro.

The only module that knows Avro. Schemas come from the ``.avsc`` files in
``schemas/`` (shipped in the wheel as ``harness/schemas``), parsed once on first
use. The hot path is fastavro's ``schemaless_writer`` / ``schemaless_reader``.

Wire framing of a value (the decoder tells them apart by the first bytes):

* single-object encoding (default): ``C3 01`` + the 8-byte little-endian
  CRC-64-AVRO fingerprint of the schema's Parsing Canonical Form + Avro body;
* Confluent Schema Registry: ``00`` + 4-byte big-endian schema id + Avro body.
  Schema ids come from a :class:`SchemaIdResolver` (:class:`StaticSchemaIds`
  in tests, :class:`ConfluentRegistryClient` against a real registry).

Fields listed in a record class's ``JSON_FIELDS`` travel as JSON text, and so do
the ``arguments`` of each tool call of a model response.

Schema versions: ``schemas/<type>.avsc`` is the version written today;
``schemas/history/<type>.<n>.avsc`` are the versions written before (a field added
with a default). A record is read with the schema its framing names (by fingerprint,
or by the registry's schema for its id) and resolved to today's, so old bytes decode
with the new fields at their defaults (``tests/golden``).
"""

from __future__ import annotations

import importlib.resources
import json
import threading
import typing
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, fields
from io import BytesIO
from operator import attrgetter
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import to_parsing_canonical_form

from harness.errors import CodecError, HarnessError, LogUnavailable
from harness.records import RECORD_CLASSES, ModelResponseRecord, Record

__all__ = [
    "ConfluentRegistryClient",
    "RecordCodec",
    "SchemaIdResolver",
    "StaticSchemaIds",
    "crc64_avro",
    "decode",
    "default_codec",
    "encode",
    "schema_dir",
]

NAMESPACE = "harness.v1"
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
REGISTRY_MAGIC = b"\x00"
_SO_HEADER = 10  # magic (2) + fingerprint (8)
_REG_HEADER = 5  # magic (1) + schema id (4)
_TOOL_CALL_KEYS = frozenset(("id", "name", "arguments"))

Framing = Literal["single-object", "registry"]


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


# --- JSON text fields ----------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Built once: json.dumps/json.loads with non-default options build a new coder per call.
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_loads = json.JSONDecoder(parse_constant=_reject_constant).decode


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
    has_tool_calls: bool


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
    special = set(cls.JSON_FIELDS) | ({"tool_calls"} if has_tool_calls else set())
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


# --- schema ids (Confluent Schema Registry framing) -------------------------------------


@runtime_checkable
class SchemaIdResolver(Protocol):
    """Maps record types to registry schema ids and back."""

    def id_for(self, record_type: str, schema_json: str) -> int:
        """The id under which ``schema_json`` (the schema of ``record_type``) is registered."""
        ...

    def schema_for(self, schema_id: int) -> str:
        """The record type whose schema has id ``schema_id``; ``CodecError`` if unknown."""
        ...


def _registered_fingerprint(resolver: SchemaIdResolver, schema_id: int) -> bytes | None:
    """The CRC-64-AVRO fingerprint of the schema registered as ``schema_id``, if the
    resolver can tell (a registry can: its id may name an older version)."""
    known = getattr(resolver, "fingerprint_for", None)
    return known(schema_id) if callable(known) else None


class StaticSchemaIds:
    """A fixed ``record type -> schema id`` table (tests, or ids assigned out of band)."""

    def __init__(self, mapping: Mapping[str, int]) -> None:
        self._ids = dict(mapping)
        self._types = {schema_id: record_type for record_type, schema_id in self._ids.items()}
        if len(self._types) != len(self._ids):
            raise ValueError("schema ids must be unique per record type")

    def id_for(self, record_type: str, schema_json: str) -> int:
        try:
            return self._ids[record_type]
        except KeyError:
            raise _error(f"no schema id for record type {record_type!r}", record_type=record_type) from None

    def schema_for(self, schema_id: int) -> str:
        try:
            return self._types[schema_id]
        except KeyError:
            raise _error(f"unknown schema id {schema_id}") from None


class ConfluentRegistryClient:
    """A minimal Confluent Schema Registry client (stdlib ``urllib`` only), caching ids.

    Subjects follow TopicRecordNameStrategy: ``<subject_prefix>-harness.v1.<RecordName>``,
    where ``subject_prefix`` is the sessions topic (``<prefix>.sessions``).
    Registry unreachable or failing -> :class:`~harness.errors.LogUnavailable` (retry);
    an id the registry does not know, or a schema that is not ours -> :class:`CodecError`.
    """

    def __init__(
        self,
        url: str,
        *,
        subject_prefix: str = "harness.sessions",
        timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._url = url.rstrip("/")
        self._subject_prefix = subject_prefix
        self._timeout = timeout
        self._headers = dict(headers or {})
        self._lock = threading.Lock()
        self._ids: dict[str, int] = {}
        self._types: dict[int, str] = {}
        self._fingerprints: dict[int, bytes] = {}

    def fingerprint_for(self, schema_id: int) -> bytes | None:
        """The fingerprint of the schema registered as ``schema_id`` (after ``schema_for``)."""
        with self._lock:
            return self._fingerprints.get(schema_id)

    def subject(self, record_type: str) -> str:
        schema = _load_schemas().get(record_type)
        if schema is None:
            raise _error(f"unknown record type {record_type!r}", record_type=record_type)
        return f"{self._subject_prefix}-{schema.full_name}"

    def id_for(self, record_type: str, schema_json: str) -> int:
        with self._lock:
            cached = self._ids.get(record_type)
        if cached is not None:
            return cached
        subject = urllib.parse.quote(self.subject(record_type), safe="")
        reply = self._call("POST", f"/subjects/{subject}/versions", {"schema": schema_json})
        schema_id = int(reply["id"])
        with self._lock:
            self._ids[record_type] = schema_id
            self._types[schema_id] = record_type
        return schema_id

    def schema_for(self, schema_id: int) -> str:
        with self._lock:
            cached = self._types.get(schema_id)
        if cached is not None:
            return cached
        reply = self._call("GET", f"/schemas/ids/{int(schema_id)}", None)
        try:
            raw = json.loads(reply["schema"])
            name = raw["name"] if "." in raw["name"] else f"{raw.get('namespace', '')}.{raw['name']}"
            fingerprint = crc64_avro(to_parsing_canonical_form(parse_schema(raw)).encode("utf-8"))
        except Exception as exc:
            raise _error(f"schema id {schema_id} is not a harness record schema") from exc
        record_type = _record_type_for_name(name)
        if record_type is None:
            raise _error(f"schema id {schema_id} names {name!r}, not a harness record")
        with self._lock:
            self._types[schema_id] = record_type
            self._fingerprints[schema_id] = fingerprint
        return record_type

    def _call(self, method: str, path: str, body: Any) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self._url + path, data=data, method=method)
        request.add_header("Accept", "application/vnd.schemaregistry.v1+json")
        if data is not None:
            request.add_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        for key, value in self._headers.items():
            request.add_header(key, value)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and method == "GET":
                raise _error(f"schema registry does not know {path}") from exc
            if 400 <= exc.code < 500:
                raise _error(f"schema registry refused {method} {path}: HTTP {exc.code}") from exc
            raise LogUnavailable(f"schema registry {self._url} failed: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise LogUnavailable(f"schema registry {self._url} unreachable: {exc}") from exc


# --- the codec -----------------------------------------------------------------------------


class RecordCodec:
    """Turns :class:`~harness.records.Record` objects into framed Avro bytes and back.

    Args:
        framing: ``"single-object"`` (default) or ``"registry"`` for what ``encode``
            writes. ``decode`` reads both (a registry-framed value needs ``schema_ids``).
        schema_ids: maps record types to registry schema ids; required for ``"registry"``.
    """

    def __init__(
        self,
        *,
        framing: Framing = "single-object",
        schema_ids: SchemaIdResolver | None = None,
    ) -> None:
        if framing not in ("single-object", "registry"):
            raise ValueError(f"framing must be 'single-object' or 'registry', not {framing!r}")
        if framing == "registry" and schema_ids is None:
            raise ValueError("registry framing needs schema_ids (a SchemaIdResolver)")
        self._framing = framing
        self._schema_ids = schema_ids
        self._by_class: dict[type[Record], tuple[_Schema, bytes]] = {}
        self._by_id: dict[int, _Writer] = {}
        self._lock = threading.Lock()

    # -- schema facts --

    def _schema(self, record_type: str) -> _Schema:
        schema = _load_schemas().get(record_type)
        if schema is None:
            raise _error(f"unknown record type {record_type!r}", record_type=record_type)
        return schema

    def schema_json(self, record_type: str) -> str:
        """The Parsing Canonical Form of ``record_type``'s schema."""
        return self._schema(record_type).canonical

    def fingerprint(self, record_type: str) -> bytes:
        """The 8-byte little-endian CRC-64-AVRO fingerprint of ``record_type``'s schema."""
        return self._schema(record_type).fingerprint

    # -- encode --

    def _header(self, cls: type[Record]) -> tuple[_Schema, bytes]:
        found = self._by_class.get(cls)
        if found is not None:
            return found
        schemas = _load_schemas()
        schema = schemas.get(getattr(cls, "TYPE", ""))
        if schema is None or schema.cls is not cls:
            raise _error(f"{cls.__name__} is not a record class the codec knows")
        if self._framing == "single-object":
            header = SINGLE_OBJECT_MAGIC + schema.fingerprint
        else:
            assert self._schema_ids is not None
            schema_id = self._schema_ids.id_for(schema.record_type, schema.documented)
            header = REGISTRY_MAGIC + schema_id.to_bytes(4, "big")
        with self._lock:
            self._by_class[cls] = (schema, header)
        return schema, header

    def encode(self, record: Record) -> bytes:
        """The record as framed Avro bytes; ``CodecError`` if it cannot be encoded."""
        schema, header = self._header(type(record))
        try:
            values = schema.get_plain(record)
            # Every record has at least session_id and ts as plain fields, so this is a tuple.
            datum = dict(zip(schema.plain, values, strict=True))
            for name in schema.json_fields:
                datum[name] = _dumps(getattr(record, name))
            if schema.has_tool_calls:
                calls = typing.cast(ModelResponseRecord, record).tool_calls
                datum["tool_calls"] = [_tool_call_out(call) for call in calls]
            out = BytesIO()
            out.write(header)
            schemaless_writer(out, schema.parsed, datum)
            return out.getvalue()
        except CodecError:
            raise
        except Exception as exc:  # fastavro/json raise many types; callers get one
            raise _error(
                f"cannot encode {schema.record_type} for session {getattr(record, 'session_id', '?')!r}: {exc}",
                record_type=schema.record_type,
            ) from exc

    # -- decode --

    def _schema_for_id(self, schema_id: int, data: bytes) -> _Writer:
        writer = self._by_id.get(schema_id)
        if writer is not None:
            return writer
        if self._schema_ids is None:
            raise _error(
                "registry-framed record but this codec has no schema_ids resolver",
                raw=data,
            )
        record_type = self._schema_ids.schema_for(schema_id)
        schema = self._schema(record_type)
        writer = _Writer(schema, None)
        fingerprint = _registered_fingerprint(self._schema_ids, schema_id)
        if fingerprint is not None and fingerprint != schema.fingerprint:
            older = _load_writers().get(fingerprint)
            if older is None or older.schema is not schema:
                raise _error(f"schema id {schema_id} is a version of {record_type} this codec does not know", raw=data)
            writer = older
        with self._lock:
            self._by_id[schema_id] = writer
        return writer

    def _locate(self, data: bytes) -> tuple[_Writer, int]:
        """The schema named by ``data``'s framing and where its body starts."""
        if data[:2] == SINGLE_OBJECT_MAGIC:
            if len(data) < _SO_HEADER:
                raise _error("truncated single-object header", raw=data)
            writer = _load_writers().get(data[2:_SO_HEADER])
            if writer is None:
                raise _error(f"unknown schema fingerprint {data[2:_SO_HEADER].hex()}", raw=data)
            return writer, _SO_HEADER
        if data[:1] == REGISTRY_MAGIC:
            if len(data) < _REG_HEADER:
                raise _error("truncated schema registry header", raw=data)
            try:
                writer = self._schema_for_id(int.from_bytes(data[1:_REG_HEADER], "big"), data)
            except CodecError as exc:
                exc.raw = data
                raise
            return writer, _REG_HEADER
        raise _error(f"unknown framing: first bytes {data[:2].hex() or '(empty)'}", raw=data)

    def peek_type(self, data: bytes) -> str:
        """The record type ``data`` holds, from its framing alone (the body is not read).

        Raises:
            CodecError: unknown framing or schema.
        """
        return self._locate(bytes(data))[0].schema.record_type

    def _datum(self, data: bytes, writer: _Writer, start: int) -> dict[str, Any]:
        schema = writer.schema
        buf = BytesIO(data)
        buf.seek(start)
        if writer.parsed is None:
            datum = typing.cast(dict[str, Any], schemaless_reader(buf, schema.parsed, None))
        else:  # an older version: resolved to today's schema (new fields get their defaults)
            datum = typing.cast(dict[str, Any], schemaless_reader(buf, writer.parsed, schema.parsed))
        if buf.tell() != len(data):
            raise _error(
                f"{len(data) - buf.tell()} trailing bytes after a {schema.record_type} record",
                raw=data,
                record_type=schema.record_type,
            )
        return datum

    def decode_fields(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """The record type and its Avro fields as read (JSON fields left as text).

        Cheaper than :meth:`decode` (no JSON parsing, no record object): for code that
        only needs a few plain fields of many records (a rebuild classifying sessions).
        """
        data = bytes(data)
        writer, start = self._locate(data)
        schema = writer.schema
        try:
            return schema.record_type, self._datum(data, writer, start)
        except HarnessError:
            raise
        except Exception as exc:  # EOFError, UnicodeDecodeError, IndexError ...
            raise _error(
                f"malformed {schema.record_type} record: {type(exc).__name__}: {exc}",
                raw=data,
                record_type=schema.record_type,
            ) from exc

    def decode(self, data: bytes) -> Record:
        """The record in ``data`` (either framing); ``CodecError`` on any malformed input."""
        if not isinstance(data, bytes):
            try:
                data = bytes(data)
            except TypeError as exc:
                raise _error(f"cannot decode {type(data).__name__}; expected bytes") from exc
        writer, start = self._locate(data)
        schema = writer.schema
        try:
            datum = self._datum(data, writer, start)
            for name in schema.json_fields:
                datum[name] = _loads(datum[name])
            if schema.has_tool_calls:
                datum["tool_calls"] = tuple(_tool_call_in(call) for call in datum["tool_calls"])
            return schema.cls(**datum)
        except HarnessError:
            raise
        except Exception as exc:  # EOFError, UnicodeDecodeError, JSONDecodeError, IndexError ...
            raise _error(
                f"malformed {schema.record_type} record: {type(exc).__name__}: {exc}",
                raw=data,
                record_type=schema.record_type,
            ) from exc


def _tool_call_out(call: Any) -> dict[str, str]:
    if not isinstance(call, Mapping) or call.keys() != _TOOL_CALL_KEYS:
        raise _error(f"a tool call must be a dict with exactly id, name, arguments; got {call!r}")
    return {
        "id": call["id"],
        "name": call["name"],
        "arguments": _dumps(call["arguments"]),
    }


def _tool_call_in(call: dict[str, str]) -> dict[str, Any]:
    return {
        "id": call["id"],
        "name": call["name"],
        "arguments": _loads(call["arguments"]),
    }


# --- process-wide default ----------------------------------------------------------------

_default: RecordCodec | None = None


def default_codec() -> RecordCodec:
    """The process-wide single-object codec."""
    global _default
    if _default is None:
        _default = RecordCodec()
    return _default


def encode(record: Record) -> bytes:
    """``default_codec().encode(record)``."""
    return default_codec().encode(record)


def decode(data: bytes) -> Record:
    """``default_codec().decode(data)``."""
    return default_codec().decode(data)
