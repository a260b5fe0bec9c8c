"""Encode and decode session log records as Avro.

The only module that knows Avro. Schemas come from the ``.avsc`` files in
``schemas/`` (shipped in the wheel as ``harness/schemas``), parsed once on first
use. The hot path is a straight-line writer per flat record type (:mod:`harness.codec_fast`:
the same bytes, three times faster) and a straight-line reader per flat record type
(:mod:`harness.codec_fast_read`: the same values, twice as fast), with fastavro's
``schemaless_writer`` and ``schemaless_reader`` for the model response, for a record
written with an older schema version, and for any value or byte the straight-line code
leaves to it.

Wire framing of a value (the decoder tells them apart by the first bytes):

* single-object encoding (default): ``C3 01`` + the 8-byte little-endian
  CRC-64-AVRO fingerprint of the schema's Parsing Canonical Form + Avro body;
* Confluent Schema Registry: ``00`` + 4-byte big-endian schema id + Avro body.
  Schema ids come from a :class:`SchemaIdResolver` (:class:`StaticSchemaIds`
  in tests, :class:`ConfluentRegistryClient` against a real registry).

Fields listed in a record class's ``JSON_FIELDS`` travel as JSON text, and so do
the ``arguments`` of each tool call of a model response. A model response's
``thinking`` blocks travel as Avro records with every field (absent ones null) and
read back with only the fields the block had.

Schema versions: ``schemas/<type>.avsc`` is the version written today;
``schemas/history/<type>.<n>.avsc`` are the versions written before (a field added
with a default). A record is read with the schema its framing names (by fingerprint,
or by the registry's schema for its id) and resolved to today's, so old bytes decode
with the new fields at their defaults (``tests/golden``).
"""

from __future__ import annotations

import json
import threading
import typing
from collections.abc import Mapping
from io import BytesIO
from typing import Any, Literal

from fastavro import schemaless_reader, schemaless_writer

from harness.codec_fast import Writer, compile_writer
from harness.codec_fast_read import Reader, compile_reader
from harness.codec_registry import (
    ConfluentRegistryClient,
    SchemaIdResolver,
    StaticSchemaIds,
    _registered_fingerprint,
)
from harness.codec_schemas import (
    NAMESPACE,
    _error,
    _load_schemas,
    _load_writers,
    _Schema,
    _Writer,
    crc64_avro,
    schema_dir,
)
from harness.errors import CodecError, HarnessError
from harness.jsonvalues import dumps
from harness.records import ModelResponseRecord, Record

__all__ = [
    "NAMESPACE",
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

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
REGISTRY_MAGIC = b"\x00"
_SO_HEADER = 10  # magic (2) + fingerprint (8)
_REG_HEADER = 5  # magic (1) + schema id (4)
_TOOL_CALL_KEYS = frozenset(("id", "name", "arguments"))
_THINKING_KEYS = ("type", "thinking", "signature", "data")  # = harness.models.base.THINKING_FIELDS

Framing = Literal["single-object", "registry"]


# --- JSON text fields ----------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Built once: json.dumps/json.loads with non-default options build a new coder per call.
_dumps = dumps  # (compact, NaN refused: the one JSON text of a value, jsonvalues')
_loads = json.JSONDecoder(parse_constant=_reject_constant).decode


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
        self._by_class: dict[type[Record], tuple[_Schema, bytes, Writer | None]] = {}
        self._by_id: dict[int, _Writer] = {}
        self._readers: dict[str, Reader | None] = {}
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

    def _header(self, cls: type[Record]) -> tuple[_Schema, bytes, Writer | None]:
        """The record class's schema, its framing header and its straight-line writer
        (:mod:`harness.codec_fast`; None for a record that is not flat)."""
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
        writer = None if schema.has_tool_calls else compile_writer(schema.parsed["fields"], schema.json_fields, _dumps)
        with self._lock:
            self._by_class[cls] = (schema, header, writer)
        return schema, header, writer

    def encode(self, record: Record) -> bytes:
        """The record as framed Avro bytes; ``CodecError`` if it cannot be encoded."""
        cls = type(record)
        schema, header, fast = self._by_class.get(cls) or self._header(cls)
        try:
            if fast is not None and (written := fast(record, header)) is not None:
                return written  # (None: a value fastavro must judge; see harness.codec_fast)
            values = schema.get_plain(record)
            # Every record has at least session_id and ts as plain fields, so this is a tuple.
            datum = dict(zip(schema.plain, values, strict=True))
            for name in schema.json_fields:
                datum[name] = _dumps(getattr(record, name))
            if schema.has_tool_calls:
                response = typing.cast(ModelResponseRecord, record)
                datum["tool_calls"] = [_tool_call_out(call) for call in response.tool_calls]
                datum["thinking"] = [_thinking_out(block) for block in response.thinking]
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

    def framed_type(self, data: bytes) -> str | None:
        """The record type of a single-object framed ``data`` from its fingerprint alone,
        or None when that does not tell (other framing, unknown schema, too short): then
        ``peek_type`` or ``decode`` knows, or says what is wrong. Never raises; cheap
        enough to run on every record a tail passes."""
        if data[:2] != SINGLE_OBJECT_MAGIC:
            return None
        writer = _load_writers().get(data[2:_SO_HEADER])
        return writer.schema.record_type if writer is not None else None

    def peek_type(self, data: bytes) -> str:
        """The record type ``data`` holds, from its framing alone (the body is not read).

        Raises:
            CodecError: unknown framing or schema.
        """
        # (A lazy read peeks at every record: a known fingerprint is answered at once.)
        if type(data) is bytes and data[:2] == SINGLE_OBJECT_MAGIC:
            writer = _load_writers().get(data[2:_SO_HEADER])
            if writer is not None:
                return writer.schema.record_type
        return self._locate(bytes(data))[0].schema.record_type

    def _reader(self, schema: _Schema) -> Reader | None:
        """The record type's straight-line reader (:mod:`harness.codec_fast_read`; None
        for a record that is not flat)."""
        reader = None if schema.has_tool_calls else compile_reader(schema.parsed["fields"])
        with self._lock:
            self._readers[schema.record_type] = reader
        return reader

    def _datum(self, data: bytes, writer: _Writer, start: int) -> dict[str, Any]:
        schema = writer.schema
        if writer.parsed is None:  # today's schema (an older one is resolved by fastavro)
            readers = self._readers
            fast = readers[schema.record_type] if schema.record_type in readers else self._reader(schema)
            if fast is not None and (datum := fast(data, start)) is not None:
                return datum  # (None: bytes fastavro must judge; see harness.codec_fast_read)
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
                datum["thinking"] = tuple(
                    {k: v for k, v in block.items() if v is not None} for block in datum["thinking"]
                )
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


def _thinking_out(block: Any) -> dict[str, str | None]:
    if (not isinstance(block, Mapping) or not isinstance(block.get("type"), str)
            or not set(block) <= set(_THINKING_KEYS)):
        raise _error(f"a thinking block must be a dict with a string type and only {', '.join(_THINKING_KEYS)}; "
                     f"got {block!r:.120}")
    return {k: block.get(k) for k in _THINKING_KEYS}


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
