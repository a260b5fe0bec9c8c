"""harness.codec: exact round trips, fingerprints, both framings, and malformed input."""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import io
import json
import math
import threading
import typing
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro.schema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import codec as codec_mod
from harness.codec import (
    ConfluentRegistryClient,
    RecordCodec,
    SchemaIdResolver,
    StaticSchemaIds,
    crc64_avro,
    decode,
    default_codec,
    encode,
    schema_dir,
)
from harness.errors import CodecError
from harness.records import (
    RECORD_CLASSES,
    InputMessage,
    ModelResponseRecord,
    Record,
    StepResult,
    ToolResult,
)

LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

# --- strategies ------------------------------------------------------------------------------

# Avro strings are UTF-8: lone surrogates cannot be encoded (tested separately).
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
longs = st.integers(LONG_MIN, LONG_MAX)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
tool_calls = st.lists(
    st.fixed_dictionaries({"id": texts, "name": texts, "arguments": json_values}),
    max_size=3,
).map(tuple)
# A block has a type and any of the other fields (only those it had come back).
thinking_blocks = st.lists(
    st.fixed_dictionaries(
        {"type": texts},
        optional={"thinking": texts, "signature": texts, "data": texts},
    ),
    max_size=3,
).map(tuple)

_PRIMITIVES: dict[Any, st.SearchStrategy[Any]] = {
    str: texts,
    int: longs,
    bool: st.booleans(),
    float: st.floats(allow_nan=False, allow_infinity=False),
}


def _field_strategy(cls: type[Record], name: str, hint: Any) -> st.SearchStrategy[Any]:
    if name in cls.JSON_FIELDS:
        return json_values
    if cls is ModelResponseRecord and name == "tool_calls":
        return tool_calls
    if cls is ModelResponseRecord and name == "thinking":
        return thinking_blocks
    if hint in _PRIMITIVES:
        return _PRIMITIVES[hint]
    args = typing.get_args(hint)
    assert len(args) == 2 and args[1] is type(None), (cls, name, hint)
    return st.none() | _PRIMITIVES[args[0]]


def records_of(cls: type[Record]) -> st.SearchStrategy[Record]:
    hints = typing.get_type_hints(cls)
    return st.builds(
        cls,
        **{f.name: _field_strategy(cls, f.name, hints[f.name]) for f in dataclasses.fields(cls)},
    )


any_record = st.one_of([records_of(cls) for cls in RECORD_CLASSES])


def example(cls: type[Record]) -> Record:
    """A small fixed record of ``cls`` with every optional field set."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in cls.JSON_FIELDS:
            values[f.name] = {"k": ["v", 1, 2.5, None, True], "ü": {}}
        elif f.name == "tool_calls":
            values[f.name] = ({"id": "c1", "name": "t", "arguments": {"x": [1]}},)
        elif f.name == "thinking":
            values[f.name] = ({"type": "thinking", "thinking": "hm", "signature": "sig=="},)
        else:
            hint = hints[f.name]
            base = typing.get_args(hint)[0] if typing.get_args(hint) else hint
            values[f.name] = {str: f"{f.name}-é", int: 1234567, bool: True, float: 0.25}[base]
    return cls(**values)


# --- hand-written Avro, independent of fastavro ---------------------------------------------


def avro_long(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def avro_bytes(b: bytes) -> bytes:
    return avro_long(len(b)) + b


def avro_str(s: str) -> bytes:
    return avro_bytes(s.encode("utf-8"))


def single_object(record_type: str, body: bytes) -> bytes:
    return b"\xc3\x01" + default_codec().fingerprint(record_type) + body


def step_result_body(value_text: str) -> bytes:
    # StepResult: session_id, ts, tool_call_id, name, value (JSON text)
    return avro_str("s") + avro_long(7) + avro_str("c1") + avro_str("step") + avro_str(value_text)


# --- round trips -----------------------------------------------------------------------------


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(any_record)
def test_round_trip_is_exact(record: Record) -> None:
    data = encode(record)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == default_codec().fingerprint(record.TYPE)
    back = decode(data)
    assert type(back) is type(record)
    assert back == record


@pytest.mark.parametrize("cls", RECORD_CLASSES, ids=[c.TYPE for c in RECORD_CLASSES])
@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip_every_type(cls: type[Record], data: st.DataObject) -> None:
    record = data.draw(records_of(cls))
    assert decode(encode(record)) == record


def test_json_fields_are_compact_json_text() -> None:
    record = StepResult("s", 1, "c", "n", {"a": ["é", 1]})
    data = encode(record)
    assert '{"a":["é",1]}'.encode() in data


def test_tool_calls_come_back_as_tuple_of_dicts() -> None:
    record = ModelResponseRecord("s", 1, 1, 0, None, ({"id": "c", "name": "t", "arguments": {"q": 1}},))
    back = decode(encode(record))
    assert isinstance(back, ModelResponseRecord)
    assert back.tool_calls == ({"id": "c", "name": "t", "arguments": {"q": 1}},)
    assert isinstance(back.tool_calls, tuple)


def test_thinking_blocks_come_back_as_they_were_with_only_their_own_fields() -> None:
    blocks = (
        {"type": "thinking", "thinking": "Let me think… ü", "signature": "EqQBCgIYAhIM=="},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3p"},
        {"type": "thinking", "thinking": "", "signature": ""},
    )
    record = ModelResponseRecord("s", 1, 1, 0, None, (), "tool_calls", blocks)
    back = decode(encode(record))
    assert isinstance(back, ModelResponseRecord) and isinstance(back.thinking, tuple)
    assert back.thinking == blocks and back == record


@pytest.mark.parametrize(
    "blocks",
    [
        ({"thinking": "no type"},),
        ({"type": "thinking", "thinking": "t", "extra": "x"},),
        ("not a dict",),
        ({"type": 1},),
        ({"type": "thinking", "thinking": 5},),
    ],
)
def test_encode_bad_thinking_blocks_raises(blocks: Any) -> None:
    with pytest.raises(CodecError):
        encode(ModelResponseRecord("s", 1, 1, 0, None, (), None, blocks))


def test_memoryview_and_bytearray_decode() -> None:
    record = InputMessage("s", 1, "i", "hi")
    data = encode(record)
    assert decode(bytearray(data)) == record
    assert decode(memoryview(data)) == record


def test_peek_type_reads_the_framing_of_any_value() -> None:
    codec = default_codec()
    data = encode(InputMessage("s", 1, "i", "hi"))
    for value in (data, bytearray(data), memoryview(data), data[:10]):
        assert codec.peek_type(value) == InputMessage.TYPE
    registry = RecordCodec(framing="registry", schema_ids=StaticSchemaIds({InputMessage.TYPE: 3}))
    assert registry.peek_type(registry.encode(InputMessage("s", 1, "i", "hi"))) == InputMessage.TYPE
    for bad, why in [
        (data[:9], "truncated single-object header"),
        (data[:2] + b"\x00" * 8, "unknown schema fingerprint"),
        (b"", "unknown framing"),
        (b"\x00\x00", "truncated schema registry header"),
    ]:
        with pytest.raises(CodecError, match=why):
            codec.peek_type(bad)


# --- schemas and fingerprints ----------------------------------------------------------------


def test_schema_files_exist_for_every_record_class() -> None:
    for cls in RECORD_CLASSES:
        raw = json.loads((schema_dir() / f"{cls.TYPE}.avsc").read_text(encoding="utf-8"))
        assert raw["namespace"] == "harness.v1"
        assert [f["name"] for f in raw["fields"]] == [f.name for f in dataclasses.fields(cls)]
        assert raw["fields"][0]["name"] == "session_id" and raw["fields"][1]["name"] == "ts"
        assert raw.get("doc") and all(f.get("doc") for f in raw["fields"])


def test_crc64_avro_spec_vectors() -> None:
    # From the Avro specification's test suite (schema-tests.txt), as 64-bit integers.
    assert int.from_bytes(crc64_avro(b'"null"'), "little") == 7195948357588979594
    assert int.from_bytes(crc64_avro(b'"int"'), "little") == 8247732601305521295


@pytest.mark.parametrize("cls", RECORD_CLASSES, ids=[c.TYPE for c in RECORD_CLASSES])
def test_fingerprint_matches_fastavro(cls: type[Record]) -> None:
    c = default_codec()
    canonical = c.schema_json(cls.TYPE)
    parsed = fastavro.schema.load_schema(str(schema_dir() / f"{cls.TYPE}.avsc"), _write_hint=False)
    assert canonical == fastavro.schema.to_parsing_canonical_form(parsed)
    fp = c.fingerprint(cls.TYPE)
    assert len(fp) == 8
    assert fp.hex() == fastavro.schema.fingerprint(canonical, "CRC-64-AVRO")


def test_fingerprints_are_distinct() -> None:
    c = default_codec()
    assert len({c.fingerprint(cls.TYPE) for cls in RECORD_CLASSES}) == len(RECORD_CLASSES)


def test_unknown_record_type_in_schema_lookup() -> None:
    with pytest.raises(CodecError):
        default_codec().schema_json("harness.nope")


# --- registry framing --------------------------------------------------------------------------

IDS = {cls.TYPE: 100 + i for i, cls in enumerate(RECORD_CLASSES)}


@pytest.mark.parametrize("cls", RECORD_CLASSES, ids=[c.TYPE for c in RECORD_CLASSES])
def test_registry_framing_round_trip(cls: type[Record]) -> None:
    resolver = StaticSchemaIds(IDS)
    assert isinstance(resolver, SchemaIdResolver)
    c = RecordCodec(framing="registry", schema_ids=resolver)
    record = example(cls)
    data = c.encode(record)
    assert data[0] == 0
    assert int.from_bytes(data[1:5], "big") == IDS[cls.TYPE]
    assert c.decode(data) == record
    # The same body as single-object framing: only the header differs.
    assert data[5:] == encode(record)[10:]
    # A single-object codec with a resolver reads both framings.
    both = RecordCodec(schema_ids=resolver)
    assert both.decode(data) == record
    assert both.decode(encode(record)) == record


def test_registry_framing_needs_a_resolver() -> None:
    with pytest.raises(ValueError):
        RecordCodec(framing="registry")
    data = RecordCodec(framing="registry", schema_ids=StaticSchemaIds(IDS)).encode(example(InputMessage))
    with pytest.raises(CodecError):
        decode(data)  # the default codec has no resolver


def test_registry_unknown_schema_id() -> None:
    c = RecordCodec(framing="registry", schema_ids=StaticSchemaIds(IDS))
    data = b"\x00" + (99999).to_bytes(4, "big") + b"\x02s\x02"
    with pytest.raises(CodecError) as info:
        c.decode(data)
    assert getattr(info.value, "raw", None) == data


class _FakeRegistry(http.server.BaseHTTPRequestHandler):
    schemas: typing.ClassVar[dict[int, str]] = {}
    subjects: typing.ClassVar[dict[str, int]] = {}
    requests: typing.ClassVar[list[str]] = []

    def _reply(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.requests.append(f"POST {self.path}")
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        subject = self.path.split("/")[2]
        schema_id = self.subjects.setdefault(subject, 1 + len(self.subjects))
        self.schemas[schema_id] = body["schema"]
        self._reply(200, {"id": schema_id})

    def do_GET(self) -> None:
        self.requests.append(f"GET {self.path}")
        schema_id = int(self.path.rsplit("/", 1)[1])
        if schema_id not in self.schemas:
            self._reply(404, {"error_code": 40403, "message": "Schema not found"})
        else:
            self._reply(200, {"schema": self.schemas[schema_id]})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_registry() -> Iterator[str]:
    _FakeRegistry.schemas, _FakeRegistry.subjects, _FakeRegistry.requests = {}, {}, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeRegistry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_confluent_registry_client(fake_registry: str) -> None:
    writer = RecordCodec(
        framing="registry",
        schema_ids=ConfluentRegistryClient(fake_registry, subject_prefix="t.sessions"),
    )
    record = example(ToolResult)
    data = writer.encode(record)
    writer.encode(record)  # cached: one registration only
    assert _FakeRegistry.requests == ["POST /subjects/t.sessions-harness.v1.ToolResult/versions"]
    registered = json.loads(_FakeRegistry.schemas[int.from_bytes(data[1:5], "big")])
    assert registered["name"] == "ToolResult" and registered["fields"][0].get("doc")

    reader = RecordCodec(schema_ids=ConfluentRegistryClient(fake_registry))
    assert reader.decode(data) == record
    assert reader.decode(data) == record
    assert _FakeRegistry.requests[1:] == [f"GET /schemas/ids/{int.from_bytes(data[1:5], 'big')}"]
    with pytest.raises(CodecError):
        reader.decode(b"\x00\x00\x00\x03\x09" + data[5:])  # id the registry does not know


def test_records_of_an_earlier_schema_version_decode_in_both_framings(fake_registry: str) -> None:
    """A field added to a schema (model.response's finish_reason) keeps old records readable:
    the earlier version is kept in schemas/history and Avro resolution fills the default."""
    golden = Path(__file__).resolve().parents[1] / "golden"
    old = (golden / "harness.model.response.bin").read_bytes()
    current = default_codec().fingerprint("harness.model.response")
    assert old[2:10] != current  # written with the first version
    record = default_codec().decode(old)
    assert isinstance(record, ModelResponseRecord) and record.finish_reason is None
    assert default_codec().decode(default_codec().encode(record)) == record

    old_schema = (schema_dir() / "history" / "harness.model.response.1.avsc").read_text(encoding="utf-8")
    request = urllib.request.Request(
        f"{fake_registry}/subjects/x-harness.v1.ModelResponse/versions",
        data=json.dumps({"schema": old_schema}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as reply:
        schema_id = json.loads(reply.read())["id"]
    framed = b"\x00" + schema_id.to_bytes(4, "big") + old[10:]
    assert RecordCodec(schema_ids=ConfluentRegistryClient(fake_registry)).decode(framed) == record


def _old_turn_resumed_body() -> bytes:
    """A TurnResumed as written before ``counted`` existed (schemas/history/...1.avsc)."""
    old = fastavro.schema.load_schema(str(schema_dir() / "history" / "harness.turn.resumed.1.avsc"), _write_hint=False)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, old, {"session_id": "s", "ts": 5, "input_id": "i", "turn": 1, "attempt": 3})
    return out.getvalue()


def test_a_record_of_an_older_schema_version_decodes_with_the_new_fields_defaults() -> None:
    from harness.records import TurnResumed

    old = fastavro.schema.load_schema(str(schema_dir() / "history" / "harness.turn.resumed.1.avsc"), _write_hint=False)
    fingerprint = crc64_avro(fastavro.schema.to_parsing_canonical_form(old).encode())
    assert fingerprint != default_codec().fingerprint("harness.turn.resumed")
    data = b"\xc3\x01" + fingerprint + _old_turn_resumed_body()
    assert decode(data) == TurnResumed("s", 5, "i", 1, 3, counted=True)
    assert default_codec().decode_fields(data) == (
        "harness.turn.resumed",
        {"session_id": "s", "ts": 5, "input_id": "i", "turn": 1, "attempt": 3, "counted": True},
    )


def test_registry_framed_record_of_an_older_schema_version_decodes(fake_registry: str) -> None:
    from harness.records import TurnResumed

    old_text = (schema_dir() / "history" / "harness.turn.resumed.1.avsc").read_text(encoding="utf-8")
    _FakeRegistry.schemas[7] = json.dumps(json.loads(old_text))
    reader = RecordCodec(schema_ids=ConfluentRegistryClient(fake_registry))
    data = b"\x00" + (7).to_bytes(4, "big") + _old_turn_resumed_body()
    assert reader.decode(data) == TurnResumed("s", 5, "i", 1, 3)


def test_every_older_schema_version_resolves_to_todays() -> None:
    """A history file is an older version of a record type, readable as today's schema."""
    history = sorted((schema_dir() / "history").glob("*.avsc"))
    assert history
    for path in history:
        record_type = path.name.rsplit(".", 2)[0]
        old = json.loads(path.read_text(encoding="utf-8"))
        new = json.loads((schema_dir() / f"{record_type}.avsc").read_text(encoding="utf-8"))
        old_names = [f["name"] for f in old["fields"]]
        assert [f["name"] for f in new["fields"]][: len(old_names)] == old_names, path.name
        assert all("default" in f for f in new["fields"][len(old_names) :]), path.name


# --- encode errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [{1, 2}, object(), b"bytes", math.nan, [math.inf], {"a": -math.inf}],
    ids=["set", "object", "bytes", "nan", "inf", "-inf"],
)
def test_encode_non_json_value_raises(value: Any) -> None:
    with pytest.raises(CodecError):
        encode(StepResult("s", 1, "c", "n", value))


@pytest.mark.parametrize(
    "calls",
    [
        ({"id": "c", "name": "t"},),
        ({"id": "c", "name": "t", "arguments": {}, "extra": 1},),
        ("not a dict",),
        ({"id": 1, "name": "t", "arguments": {}},),
        ({"id": "c", "name": "t", "arguments": {1, 2}},),
    ],
)
def test_encode_bad_tool_calls_raises(calls: Any) -> None:
    with pytest.raises(CodecError):
        encode(ModelResponseRecord("s", 1, 1, 0, None, calls))


def test_encode_bad_field_values_raise() -> None:
    with pytest.raises(CodecError):
        encode(InputMessage("s", 2**63, "i", "t"))  # beyond Avro long
    with pytest.raises(CodecError):
        encode(InputMessage("s", 1, "i", "\ud800"))  # lone surrogate: not UTF-8
    with pytest.raises(CodecError):
        encode(InputMessage("s", 1, "i", None))  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        encode(InputMessage(None, 1, "i", "t"))  # type: ignore[arg-type]


def test_encode_unknown_record_class_raises() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Stranger(Record):
        TYPE: typing.ClassVar[str] = "harness.input.message"  # borrows a real type name

        input_id: str = ""
        text: str = ""
        harness: str | None = None

    with pytest.raises(CodecError):
        encode(Stranger("s", 1))
    with pytest.raises(CodecError):
        encode(Record("s", 1))


# --- malformed input: always CodecError ------------------------------------------------------


def _assert_codec_error(data: Any) -> None:
    # pytest.raises(CodecError) would let any other exception escape as a test error;
    # this names the wrong type in the failure instead.
    try:
        decode(data)
    except CodecError:
        return
    except Exception as exc:  # noqa: BLE001 - the failure this helper exists to report
        pytest.fail(f"{data!r} raised {type(exc).__name__}, not CodecError: {exc}")
    pytest.fail(f"{data!r} decoded without error")


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc3",
        b"\xc3\x02" + bytes(12),
        b"\x01\x02\x03",
        b"{}",
        b"\xc3\x01\x00",
        b"\x00",
        b"\x00\x00\x00\x01",
    ],
)
def test_decode_bad_header(data: bytes) -> None:
    _assert_codec_error(data)


def test_decode_non_bytes() -> None:
    _assert_codec_error(None)
    _assert_codec_error(12)


def test_decode_unknown_fingerprint_keeps_raw() -> None:
    data = b"\xc3\x01" + bytes(8) + b"\x02s\x02"
    with pytest.raises(CodecError) as info:
        decode(data)
    assert getattr(info.value, "raw", None) == data


@pytest.mark.parametrize("cls", RECORD_CLASSES, ids=[c.TYPE for c in RECORD_CLASSES])
def test_decode_truncated_at_every_position(cls: type[Record]) -> None:
    data = encode(example(cls))
    for end in range(len(data)):
        _assert_codec_error(data[:end])
    registry = RecordCodec(framing="registry", schema_ids=StaticSchemaIds(IDS))
    framed = registry.encode(example(cls))
    for end in range(len(framed)):
        with pytest.raises(CodecError):
            registry.decode(framed[:end])


@pytest.mark.parametrize("cls", RECORD_CLASSES, ids=[c.TYPE for c in RECORD_CLASSES])
def test_decode_trailing_bytes(cls: type[Record]) -> None:
    data = encode(example(cls))
    _assert_codec_error(data + b"\x00")
    _assert_codec_error(data + data)


def test_hand_written_body_decodes() -> None:
    # Guards the helpers below: a valid hand-made record must decode.
    assert decode(single_object(StepResult.TYPE, step_result_body('{"a":[1]}'))) == StepResult(
        "s", 7, "c1", "step", {"a": [1]}
    )


@pytest.mark.parametrize("text", ["{not json", "", "NaN", "[Infinity]", '{"a":1', "1 2", "'x'"])
def test_decode_invalid_json_text_in_json_field(text: str) -> None:
    data = single_object(StepResult.TYPE, step_result_body(text))
    with pytest.raises(CodecError) as info:
        decode(data)
    assert getattr(info.value, "raw", None) == data


def test_decode_invalid_json_in_tool_call_arguments() -> None:
    # ModelResponse: session_id, ts, turn, index, text (union null), tool_calls (array)
    body = (
        avro_str("s")
        + avro_long(1)
        + avro_long(1)
        + avro_long(0)
        + avro_long(0)
        + avro_long(1)
        + avro_str("c1")
        + avro_str("t")
        + avro_str("{oops")
        + avro_long(0)
    )
    _assert_codec_error(single_object(ModelResponseRecord.TYPE, body))


def test_decode_bad_avro_body() -> None:
    # invalid UTF-8 in a string
    _assert_codec_error(single_object(StepResult.TYPE, avro_bytes(b"\xff\xfe") + step_result_body("1")[2:]))
    # union branch index out of range (InputMessage.harness is ["null","string"])
    body = avro_str("s") + avro_long(1) + avro_str("i") + avro_str("t") + avro_long(5)
    _assert_codec_error(single_object(InputMessage.TYPE, body))
    # negative string length
    _assert_codec_error(single_object(StepResult.TYPE, avro_long(-3) + b"abc"))
    # huge length prefix
    _assert_codec_error(single_object(StepResult.TYPE, avro_long(2**40) + b"abc"))


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_decode_random_bytes_never_raises_other_errors(tail: bytes) -> None:
    for prefix in (
        b"",
        b"\xc3\x01" + default_codec().fingerprint(StepResult.TYPE),
        b"\xc3\x01" + default_codec().fingerprint(ModelResponseRecord.TYPE),
    ):
        with contextlib.suppress(CodecError):
            decode(prefix + tail)


def test_default_codec_is_cached() -> None:
    assert default_codec() is default_codec()
    assert codec_mod.encode is encode
