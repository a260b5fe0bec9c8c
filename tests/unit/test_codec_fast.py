"""The straight-line Avro writers (harness.codec_fast) write fastavro's bytes, or leave the
record to fastavro: no byte and no error of ``encode`` changes."""

from __future__ import annotations

import dataclasses
from io import BytesIO
from typing import Any

import pytest
from fastavro import schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.codec import RecordCodec, _dumps, default_codec
from harness.codec_fast import compile_writer, writer_source
from harness.codec_schemas import _load_schemas
from harness.errors import CodecError
from harness.records import (
    RECORD_CLASSES,
    ModelResponseRecord,
    ModelUsage,
    Record,
    StepResult,
    ToolResult,
    TurnResumed,
)
from tests.unit.test_codec import example, records_of

FLAT = [cls for cls in RECORD_CLASSES if cls is not ModelResponseRecord]


def fastavro_encode(record: Record) -> bytes:
    """What encode wrote before the straight-line writers: fastavro on the record's dict."""
    codec = default_codec()
    schema, header, _ = codec._header(type(record))
    datum = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    for name in schema.json_fields:
        datum[name] = _dumps(datum[name])
    out = BytesIO()
    out.write(header)
    schemaless_writer(out, schema.parsed, datum)
    return out.getvalue()


def writer_of(cls: type[Record]) -> Any:
    schema = _load_schemas()[cls.TYPE]
    return compile_writer(schema.parsed["fields"], schema.json_fields, _dumps)


def test_every_record_type_but_the_model_response_has_a_writer() -> None:
    assert all(writer_of(cls) is not None for cls in FLAT)
    assert writer_of(ModelResponseRecord) is None  # (arrays of records: fastavro's)


@pytest.mark.parametrize("cls", FLAT, ids=lambda c: c.TYPE)
def test_the_writer_writes_fastavros_bytes(cls: type[Record]) -> None:
    record = example(cls)
    header = default_codec()._header(cls)[1]
    assert writer_of(cls)(record, header) == fastavro_encode(record)


@settings(max_examples=300, deadline=None)
@given(st.one_of([records_of(cls) for cls in FLAT]))
def test_generated_records_encode_to_fastavros_bytes(record: Record) -> None:
    assert default_codec().encode(record) == fastavro_encode(record)
    header = default_codec()._header(type(record))[1]
    assert writer_of(type(record))(record, header) == fastavro_encode(record)


@pytest.mark.parametrize(
    "value",
    [0, -1, 1, 63, -64, 64, -65, 2**31, -(2**31), 2**62, 2**63 - 1, -(2**63), 1_733_366_400_000],
)
def test_longs_at_varint_edges(value: int) -> None:
    record = TurnResumed("s", value, "i", value, value, True)
    assert default_codec().encode(record) == fastavro_encode(record)


@pytest.mark.parametrize("length", [0, 1, 63, 64, 65, 127, 128, 8191, 8192, 100_000])
def test_string_lengths_at_varint_edges(length: int) -> None:
    record = StepResult("s" * length, 1, "c", "é" * length, "x" * length)
    assert default_codec().encode(record) == fastavro_encode(record)


class Text(str):
    pass


@pytest.mark.parametrize(
    "record",
    [
        TurnResumed("s", 1, "i", True, 1, True),  # a bool where a long goes
        TurnResumed("s", 1.0, "i", 1, 1, True),  # type: ignore[arg-type]  # a float where a long goes
        TurnResumed("s", 1, "i", 1, 1, 1),  # type: ignore[arg-type]  # an int where a boolean goes
        ToolResult(Text("s"), 1, "c", "n", "x", False, False),  # a str subclass
        ModelUsage("s", 1, 1, 0, None, 1, 1, 2, None),  # type: ignore[arg-type]  # an int where a double goes
    ],
    ids=["bool-long", "float-long", "int-boolean", "str-subclass", "int-double"],
)
def test_a_value_of_another_type_is_left_to_fastavro(record: Record) -> None:
    """fastavro accepts these (it writes True as 1, 1.0 as 1...): the bytes stay its own."""
    header = default_codec()._header(type(record))[1]
    assert writer_of(type(record))(record, header) is None
    assert default_codec().encode(record) == fastavro_encode(record)


@pytest.mark.parametrize(
    "record",
    [
        TurnResumed("s", 2**63, "i", 1, 1, True),  # over 64 bits
        StepResult("s", 1, "c", "\ud800", "x"),  # a lone surrogate
        StepResult("s", 1, "c", "n", "\udfff"),  # ... in a JSON field
        StepResult("s", 1, "c", 5, "x"),  # type: ignore[arg-type]  # no string at all
        StepResult("s", 1, "c", "n", float("nan")),  # not JSON
    ],
    ids=["long-overflow", "surrogate", "surrogate-json", "int-string", "nan"],
)
def test_what_fastavro_refuses_is_still_refused_as_before(record: Record) -> None:
    with pytest.raises(CodecError):
        default_codec().encode(record)
    with pytest.raises(Exception):  # noqa: B017 (fastavro's own error, whatever its type)
        fastavro_encode(record)


def test_registry_framing_uses_the_writer_with_its_own_header() -> None:
    from harness.codec import StaticSchemaIds

    codec = RecordCodec(framing="registry", schema_ids=StaticSchemaIds({StepResult.TYPE: 7}))
    record = StepResult("s", 1, "c", "n", {"a": [1, 2]})
    encoded = codec.encode(record)
    assert encoded[:5] == b"\x00\x00\x00\x00\x07"
    assert encoded[5:] == fastavro_encode(record)[10:]  # the same body behind either header
    assert codec.decode(encoded) == record


def test_a_field_that_is_not_flat_or_not_a_name_gets_no_writer() -> None:
    string = {"name": "session_id", "type": "string"}
    assert writer_source([string, {"name": "xs", "type": {"type": "array", "items": "string"}}], ()) is None
    assert writer_source([string, {"name": "u", "type": ["null", "string", "long"]}], ()) is None
    assert writer_source([string, {"name": "class", "type": "string"}], ()) is None
    assert writer_source([string, {"name": "j", "type": ["null", "string"]}], ("j",)) is None
    assert writer_source([string], ()) is not None


def reference_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 2**14), min_size=1, max_size=20))
def test_varints_in_any_order_are_avros(numbers: list[int]) -> None:
    """(A multi-byte varint keeps its last high part: any order of values still writes each right.)"""
    from harness.codec_fast import _varint

    for n in numbers:
        assert _varint(n) == reference_varint(n)


def test_timestamps_a_millisecond_apart_are_written_right() -> None:
    from harness.codec_fast import _varint

    start = 2 * 1_733_366_400_000
    for n in range(start - 300, start + 300):  # across several changes of the high part
        assert _varint(n) == reference_varint(n)
