"""Schema ids for the Confluent Schema Registry framing (``00`` + 4-byte schema id).

Part of the codec (``harness.codec`` re-exports the public names).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from fastavro import parse_schema
from fastavro.schema import to_parsing_canonical_form

from harness.codec_schemas import _error, _load_schemas, _record_type_for_name, crc64_avro
from harness.errors import LogUnavailable

__all__ = ["ConfluentRegistryClient", "SchemaIdResolver", "StaticSchemaIds"]


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
