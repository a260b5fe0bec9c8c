"""Straight-line Avro writers for flat record schemas: the hot path of ``encode``.

fastavro's ``schemaless_writer`` is general: it takes a dict, walks the parsed schema and
picks each union branch by looking at the value. For a record of a few strings and longs
that generality is most of the cost (about 4 us here for a step result, 3x that right after
an fsync, when the CPU's caches and branch predictors are cold). Every record type but the
model response is flat: strings, longs, booleans and doubles, each possibly in a
``["null", X]`` union. For those, :func:`compile_writer` builds one Python function that
writes the record's fields in schema order, straight from its attributes.

It writes exactly fastavro's bytes, or nothing: a value whose type is not exactly the one
the schema says (a ``bool`` for a long, an ``int`` for a double, a ``str`` subclass, a long
outside 64 bits, a string UTF-8 cannot encode) makes the writer return ``None``, and the
codec encodes that record with fastavro, which then writes it or refuses it as it always
did. So the fast path changes no byte and no error; ``tests/unit/test_codec_fast.py``
compares the two on generated records of every type.
"""

from __future__ import annotations

import keyword
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["FLAT_PRIMITIVES", "compile_writer", "flat_type", "writer_source"]

Writer = Callable[[Any, bytes], "bytes | None"]
"""``writer(record, header)``: ``header`` + the record's Avro body, or None (use fastavro)."""

_SMALL = tuple(bytes((n,)) for n in range(0x80))
"""The one-byte varints."""
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_pack_double = struct.Struct("<d").pack


_CONTINUED = tuple(bytes((n | 0x80,)) for n in range(0x80))
"""A varint's first byte when more follow."""
_last_high: list[tuple[int, bytes]] = [(-1, b"")]
"""The last multi-byte varint's part after its first byte: a timestamp in ms has six
bytes, and only its first changes from one record to the next. (One tuple, replaced
whole: threads never see a value with another's bytes.)"""


def _varint(n: int) -> bytes:
    """``n`` (>= 0, < 2**64) as an Avro varint."""
    if n < 0x80:
        return _SMALL[n]
    if n < 0x4000:
        return _CONTINUED[n & 0x7F] + _SMALL[n >> 7]
    high = n >> 7
    last, tail = _last_high[0]
    if high != last:
        tail = _varint_loop(high)
        _last_high[0] = (high, tail)
    return _CONTINUED[n & 0x7F] + tail


def _varint_loop(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Each flat type: the statements that check field ``i``'s value ``v{i}`` and bind its
# bytes as ``p{i}`` (a tuple of parts), returning None for a value that is not exactly
# the schema's type. ``{opt}`` is the union branch's index when the field is optional.
_CHECK_WRITE = {
    "string": (
        "if type(v{i}) is not str: return None\n"
        "d{i} = v{i}.encode('utf-8')\n"
        "n{i} = len(d{i})\n"
        # (a length's varint: one byte under 64, two written out under 8192, else _varint)
        "p{i} = ({opt}_SMALL[n{i} << 1], d{i}) if n{i} < 0x40 else "
        "({opt}_CONTINUED[(n{i} << 1) & 0x7F], _SMALL[n{i} >> 6], d{i}) if n{i} < 0x2000 else "
        "({opt}_varint(n{i} << 1), d{i})"
    ),
    "long": (
        "if type(v{i}) is not int or not _LONG_MIN <= v{i} <= _LONG_MAX: return None\n"
        "p{i} = ({opt}_varint((v{i} << 1) ^ (v{i} >> 63)),)"
    ),
    "boolean": (
        "if type(v{i}) is not bool: return None\n"
        "p{i} = ({opt}b'\\x01' if v{i} else b'\\x00',)"
    ),
    "double": (
        "if type(v{i}) is not float: return None\n"
        "p{i} = ({opt}_pack_double(v{i}),)"
    ),
}


FLAT_PRIMITIVES = frozenset(_CHECK_WRITE)
"""The Avro primitives a straight-line writer or reader handles."""


def flat_type(avro_type: Any) -> tuple[str, bool] | None:
    """``(primitive, optional)`` of a flat field type (one of :data:`FLAT_PRIMITIVES`,
    possibly in a ``["null", X]`` union); None for any other. The writers and the readers
    (:mod:`harness.codec_fast_read`) take the same fields."""
    if isinstance(avro_type, str) and avro_type in FLAT_PRIMITIVES:
        return avro_type, False
    if (
        isinstance(avro_type, list)
        and len(avro_type) == 2
        and avro_type[0] == "null"
        and isinstance(avro_type[1], str)
        and avro_type[1] in FLAT_PRIMITIVES
    ):
        return avro_type[1], True
    return None  # arrays, records, maps, enums, other unions: fastavro's


def writer_source(fields: list[dict[str, Any]], json_fields: tuple[str, ...]) -> str | None:
    """The Python source of ``writer(record, header)`` for a record schema's ``fields``
    (the ``.avsc``'s list, in order), or None when a field is not flat."""
    lines = ["def writer(record, header):", "    try:"]
    parts = ["header"]
    for i, field in enumerate(fields):
        name = field["name"]
        flat = flat_type(field["type"])
        if flat is None or not name.isidentifier() or keyword.iskeyword(name):
            return None
        if name in json_fields and flat != ("string", False):
            return None
        kind, optional = flat
        lines.append(f"        v{i} = _dumps(record.{name})" if name in json_fields else f"        v{i} = record.{name}")
        body = _CHECK_WRITE[kind].format(i=i, opt="b'\\x02', " if optional else "").splitlines()
        if optional:
            lines += [f"        if v{i} is None:", f"            p{i} = (b'\\x00',)", "        else:"]
            lines += ["            " + line for line in body]
        else:
            lines += ["        " + line for line in body]
        parts.append(f"*p{i}")
    lines.append(f"        return b''.join(({', '.join(parts)},))")
    lines.append("    except UnicodeEncodeError:  # a lone surrogate: fastavro refuses it")
    lines.append("        return None")
    return "\n".join(lines)


def compile_writer(
    fields: list[dict[str, Any]], json_fields: tuple[str, ...], dumps: Callable[[Any], str]
) -> Writer | None:
    """The writer of a record schema's ``fields``, or None when a field is not flat. A
    field named in ``json_fields`` is a string holding ``dumps(value)``; an error of
    ``dumps`` propagates (the codec reports it as it always did)."""
    source = writer_source(fields, json_fields)
    if source is None:
        return None
    namespace: dict[str, Any] = {
        "_SMALL": _SMALL,
        "_CONTINUED": _CONTINUED,
        "_varint": _varint,
        "_LONG_MIN": _LONG_MIN,
        "_LONG_MAX": _LONG_MAX,
        "_pack_double": _pack_double,
        "_dumps": dumps,
    }
    exec(compile(source, "<harness.codec_fast writer>", "exec"), namespace)  # (our own source, from a schema)
    return namespace["writer"]  # type: ignore[no-any-return]
