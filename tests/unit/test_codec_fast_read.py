"""The straight-line Avro readers (harness.codec_fast_read) read fastavro's values, or
leave the bytes to fastavro: no value and no error of ``decode`` changes."""

from __future__ import annotations

import re
import struct
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from fastavro import schemaless_reader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.codec import RecordCodec, default_codec
from harness.codec_fast_read import compile_reader, reader_source
from harness.codec_schemas import _load_schemas, _load_writers, _Schema
from harness.errors import CodecError
from harness.records import (
    RECORD_CLASSES,
    InputSettled,
    ModelResponseRecord,
    ModelUsage,
    Record,
    StepResult,
    ToolResult,
    TurnResumed,
)
from tests.unit.test_codec import any_record, avro_long, avro_str, example, records_of, single_object

FLAT = [cls for cls in RECORD_CLASSES if cls is not ModelResponseRecord]


class FastavroCodec(RecordCodec):
    """What decode was before the straight-line readers: fastavro for every record."""

    def _reader(self, schema: _Schema) -> None:
        self._readers[schema.record_type] = None


FASTAVRO = FastavroCodec()


def reader_of(cls: type[Record]) -> Any:
    return compile_reader(_load_schemas()[cls.TYPE].parsed["fields"])


def fastavro_fields(data: bytes) -> dict[str, Any]:
    buf = BytesIO(data)
    buf.seek(10)
    return schemaless_reader(buf, _load_schemas()[default_codec().peek_type(data)].parsed, None)  # type: ignore[return-value]


def strict(value: Any) -> str:
    """Equal only for the same values of the same types (True is not 1, 1.0 is not 1,
    -0.0 is not 0.0, NaN is NaN), in the same order."""
    return repr(value)


def outcome(codec: RecordCodec, data: bytes) -> tuple[Any, ...]:
    """What ``decode`` and ``decode_fields`` give for ``data``: the values, or the error."""
    got: list[Any] = []
    for call in (codec.decode, codec.decode_fields):
        try:
            got.append(("ok", strict(call(data))))
        except CodecError as exc:
            # (fastavro names the BytesIO it read from: "... from <_io.BytesIO object at 0x...>")
            got.append(("error", re.sub(r" at 0x[0-9a-f]+>", ">", str(exc)), exc.raw, exc.record_type))
    return tuple(got)


def test_every_record_type_but_the_model_response_has_a_reader() -> None:
    assert all(reader_of(cls) is not None for cls in FLAT)
    assert reader_of(ModelResponseRecord) is None  # (arrays of records: fastavro's)


@pytest.mark.parametrize("cls", FLAT, ids=lambda c: c.TYPE)
def test_the_reader_reads_fastavros_values(cls: type[Record]) -> None:
    data = default_codec().encode(example(cls))
    read = reader_of(cls)(data, 10)
    assert read is not None
    assert strict(read) == strict(fastavro_fields(data))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of([records_of(cls) for cls in FLAT]))
def test_generated_records_read_as_fastavro_reads_them(record: Record) -> None:
    data = default_codec().encode(record)
    read = reader_of(type(record))(data, 10)
    assert read is not None  # (the straight-line reader read it: not left to fastavro)
    assert strict(read) == strict(fastavro_fields(data))
    assert outcome(default_codec(), data) == outcome(FASTAVRO, data)
    assert default_codec().decode(data) == record


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_record)
def test_decode_of_any_record_is_fastavros(record: Record) -> None:
    data = default_codec().encode(record)
    assert outcome(default_codec(), data) == outcome(FASTAVRO, data)


@pytest.mark.parametrize(
    "value",
    [0, -1, 1, 63, -64, 64, -65, 8191, -8192, 8192, 2**31, -(2**31), 2**62, -(2**62) - 1, 2**63 - 1, -(2**63),
     1_733_366_400_000],
)
def test_longs_at_varint_edges(value: int) -> None:
    data = default_codec().encode(TurnResumed("s", value, "i", value, value, False))
    read = reader_of(TurnResumed)(data, 10)
    assert read is not None and strict(read) == strict(fastavro_fields(data))
    assert read["ts"] == value


@pytest.mark.parametrize("length", [0, 1, 31, 32, 63, 64, 65, 127, 128, 8191, 8192, 100_000])
@pytest.mark.parametrize("char", ["s", "é", "€", "😀", "\x00"])
def test_strings_of_every_length_edge_and_width(length: int, char: str) -> None:
    data = default_codec().encode(StepResult(char * length, 1, "", char * length, char * length))
    read = reader_of(StepResult)(data, 10)
    assert read is not None and strict(read) == strict(fastavro_fields(data))
    assert outcome(default_codec(), data) == outcome(FASTAVRO, data)


@pytest.mark.parametrize(
    "record",
    [
        ModelUsage("s", 1, 1, 0, None, 0, 0, None, None),
        ModelUsage("s", 1, 1, 0, "", 0, 0, 0.0, ""),
        ModelUsage("s", 1, 1, 0, "m", 0, 0, -0.0, "c"),
        ModelUsage("s", 1, 1, 0, "m", 0, 0, float("nan"), "c"),
        ModelUsage("s", 1, 1, 0, "m", 0, 0, float("-inf"), "c"),
        ModelUsage("s", 1, 1, 0, "m", 0, 0, 5e-324, "c"),
        InputSettled("s", 1, "i", "done", None, None, None),
        InputSettled("s", 1, "i", "done", "", "", 0),
        InputSettled("s", 1, "i", "done", "c", "r", -(2**63)),
        ToolResult("s", 1, "c", "n", {}, True, False, None),
        ToolResult("s", 1, "c", "n", {"a": [{"b": None}, "ü", 2**70]}, False, True, "x"),
    ],
    ids=repr,
)
def test_edge_values(record: Record) -> None:
    data = default_codec().encode(record)
    read = reader_of(type(record))(data, 10)
    assert read is not None and strict(read) == strict(fastavro_fields(data))
    assert outcome(default_codec(), data) == outcome(FASTAVRO, data)


# --- bytes that are not a good record: the same value or the same error as fastavro's --------


@pytest.mark.parametrize("cls", RECORD_CLASSES, ids=lambda c: c.TYPE)
def test_truncated_at_every_position(cls: type[Record]) -> None:
    data = default_codec().encode(example(cls))
    for cut in range(10, len(data)):
        truncated = data[:cut]
        assert reader_of(cls) is None or reader_of(cls)(truncated, 10) is None
        got = outcome(default_codec(), truncated)
        assert got == outcome(FASTAVRO, truncated)
        assert got[0][0] == "error"


@pytest.mark.parametrize("cls", FLAT, ids=lambda c: c.TYPE)
def test_trailing_bytes(cls: type[Record]) -> None:
    data = default_codec().encode(example(cls)) + b"\x00"
    assert reader_of(cls)(data, 10) is None
    assert outcome(default_codec(), data) == outcome(FASTAVRO, data)


def _turn_resumed(ts: bytes, counted: bytes = b"\x00") -> bytes:
    # TurnResumed: session_id, ts, input_id, turn, attempt, counted
    body = avro_str("s") + ts + avro_str("i") + avro_long(1) + avro_long(1) + counted
    return single_object(TurnResumed.TYPE, body)


def _input_settled(code: bytes, seq: bytes = b"\x00") -> bytes:
    # InputSettled: session_id, ts, input_id, outcome, code?, reason?, input_seq?
    body = avro_str("s") + avro_long(1) + avro_str("i") + avro_str("done") + code + b"\x00" + seq
    return single_object(InputSettled.TYPE, body)


GARBLED = {
    "boolean-2": _turn_resumed(avro_long(1), b"\x02"),
    "boolean-ff": _turn_resumed(avro_long(1), b"\xff"),
    "long-10-bytes-max": _turn_resumed(b"\xff" * 9 + b"\x01"),
    "long-10-bytes-over": _turn_resumed(b"\xff" * 9 + b"\x02"),
    "long-11-bytes": _turn_resumed(b"\x80" * 10 + b"\x00"),
    "long-padded": _turn_resumed(b"\x82\x80\x80\x00"),
    "union-index-minus-1": _input_settled(b"\x01" + avro_str("c")),
    "union-index-2": _input_settled(b"\x04" + avro_str("c")),
    "union-index-padded": _input_settled(b"\x82\x00" + avro_str("c")),
    "union-long-index-minus-1": _input_settled(b"\x00", b"\x01" + avro_long(5)),
    "union-last-index-minus-1": _input_settled(b"\x00", b"\x01"),
    "union-last-index-2": _input_settled(b"\x00", b"\x04"),
    "negative-length": single_object(StepResult.TYPE, b"\x03s"),
    "negative-length-then-a-record": single_object(
        StepResult.TYPE, b"\x03s" + avro_long(1) + avro_str("c") + avro_str("n") + avro_str("1")
    ),
    "length-past-the-end": single_object(
        StepResult.TYPE, avro_str("s") + avro_long(1) + avro_str("c") + avro_str("n") + avro_long(3) + b"1"
    ),
    "bad-utf8": _input_settled(b"\x02" + avro_long(2) + b"\xc3\x28"),
    "encoded-surrogate": _input_settled(b"\x02" + avro_long(3) + b"\xed\xa0\x80"),
    "huge-length": single_object(StepResult.TYPE, avro_long(2**40) + b"s"),
    "double-cut": single_object(ModelUsage.TYPE, avro_str("s") + avro_long(1) * 3 + b"\x00" + avro_long(1) * 2
                                + b"\x02" + struct.pack("<d", 1.5)[:5]),
    "json-not-json": single_object(StepResult.TYPE, avro_str("s") + avro_long(1) + avro_str("c") + avro_str("n")
                                   + avro_str("{nope")),
}


@pytest.mark.parametrize("data", GARBLED.values(), ids=GARBLED.keys())
def test_garbled_bytes(data: bytes) -> None:
    assert outcome(default_codec(), data) == outcome(FASTAVRO, data)


def test_what_the_reader_reads_of_odd_varints_is_fastavros() -> None:
    for name in ("long-10-bytes-max", "long-padded"):
        read = reader_of(TurnResumed)(GARBLED[name], 10)
        assert read is not None and strict(read) == strict(fastavro_fields(GARBLED[name]))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_record, st.data())
def test_garbled_records(record: Record, data: st.DataObject) -> None:
    """A record's bytes with a few bytes changed, dropped or added."""
    body = bytearray(default_codec().encode(record))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(10, len(body)))
        how = data.draw(st.sampled_from(["set", "drop", "add"]))
        byte = data.draw(st.integers(0, 255) | st.sampled_from([0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF]))
        if how == "set" and at < len(body):
            body[at] = byte
        elif how == "drop" and at < len(body):
            del body[at]
        else:
            body.insert(at, byte)
    garbled = bytes(body)
    assert outcome(default_codec(), garbled) == outcome(FASTAVRO, garbled)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FLAT), st.binary(max_size=60))
def test_random_bodies(cls: type[Record], body: bytes) -> None:
    data = single_object(cls.TYPE, body)
    assert outcome(default_codec(), data) == outcome(FASTAVRO, data)


GOLDEN = sorted((Path(__file__).resolve().parents[1] / "golden").glob("*.bin"))


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_bytes_of_every_schema_version(path: Path) -> None:
    """A record written with an older schema version is resolved by fastavro: the reader
    of today's schema never sees its bytes (they are not today's layout)."""
    data = path.read_bytes()
    writer = _load_writers()[data[2:10]]
    codec = RecordCodec()
    if writer.parsed is not None:
        codec._readers[writer.schema.record_type] = lambda data, start: pytest.fail("read as today's schema")
    got = outcome(codec, data)
    assert got == outcome(FASTAVRO, data)
    assert got[0][0] == "ok"


def test_a_field_that_is_not_flat_or_not_a_name_gets_no_reader() -> None:
    string = {"name": "session_id", "type": "string"}
    assert reader_source([string, {"name": "xs", "type": {"type": "array", "items": "string"}}]) is None
    assert reader_source([string, {"name": "u", "type": ["null", "string", "long"]}]) is None
    assert reader_source([string, {"name": "u", "type": ["string", "null"]}]) is None
    assert reader_source([string, {"name": "class", "type": "string"}]) is None
    assert reader_source([string]) is not None


def test_the_readers_know_every_primitive_the_writers_take_as_flat() -> None:
    """One rule says which fields are flat (``codec_fast.flat_type``): a primitive it takes
    that the readers had no code for would fail every reader's compile."""
    from harness import codec_fast, codec_fast_read

    assert set(codec_fast_read._READ) == codec_fast.FLAT_PRIMITIVES
