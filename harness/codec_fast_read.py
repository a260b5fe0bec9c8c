"""Straight-line Avro readers for flat record schemas: the hot path of ``decode``.

The reading twin of :mod:`harness.codec_fast`. fastavro's ``schemaless_reader`` walks the
parsed schema for every record and reads from a file object; for a record of a few
strings and longs that is most of its cost. For the flat record types (strings, longs,
booleans and doubles, each possibly in a ``["null", X]`` union) :func:`compile_reader`
builds one Python function that reads the fields in schema order straight from the bytes
into the dict fastavro would give.

It reads exactly fastavro's values, or nothing: anything it is not sure of (a truncated
body, trailing bytes, a negative length, a union branch other than 0 or 1, a boolean byte
other than 0 or 1, a varint of more than 64 bits, UTF-8 that does not decode) makes the
reader return ``None``, and the codec reads that record with fastavro, which then reads it
or refuses it as it always did. So the fast path changes no value and no error;
``tests/unit/test_codec_fast_read.py`` compares the two on generated records of every type
and on truncated and garbled bytes.
"""

from __future__ import annotations

import keyword
import struct
from collections.abc import Callable
from typing import Any

from harness.codec_fast import flat_type

__all__ = ["compile_reader", "reader_source"]

Reader = Callable[[bytes, int], "dict[str, Any] | None"]
"""``reader(data, start)``: the fields of the record whose Avro body is ``data[start:]``
(all of it), in schema order, or None (use fastavro)."""

_unpack_double = struct.Struct("<d").unpack_from
_U64 = 1 << 64  # a varint from here on is more than a long: fastavro's


# Each flat type: the statements that read field ``i`` at ``pos`` into ``v{i}``, moving
# ``pos`` past it, returning None for what fastavro must judge. ``n`` is a varint's value
# before the zigzag decoding (a timestamp in ms has six bytes: the loop, written out, is
# cheaper than a call).
_VARINT = (
    "n = data[pos]\n"
    "pos += 1\n"
    "if n >= 0x80:\n"
    "    n &= 0x7F\n"
    "    shift = 7\n"
    "    while True:\n"
    "        b = data[pos]\n"
    "        pos += 1\n"
    "        n |= (b & 0x7F) << shift\n"
    "        if b < 0x80: break\n"
    "        shift += 7\n"
    "        if shift > 63: return None\n"  # an eleventh byte
    "    if n >= _U64: return None\n"
)
_READ = {
    "string": (
        _VARINT
        + "if n & 1: return None\n"  # a negative length
        # (a length past the end: the slice is short, ``pos`` passes ``end``, and a later
        # read or the last check leaves the record to fastavro)
        "e = pos + (n >> 1)\n"
        "v{i} = data[pos:e].decode('utf-8')\n"
        "pos = e"
    ),
    "long": _VARINT + "v{i} = (n >> 1) ^ -(n & 1)",
    "boolean": (
        "n = data[pos]\n"
        "if n > 1: return None\n"
        "v{i} = n == 1\n"
        "pos += 1"
    ),
    "double": (
        "v{i} = _unpack_double(data, pos)[0]\n"
        "pos += 8"
    ),
}


def reader_source(fields: list[dict[str, Any]]) -> str | None:
    """The Python source of ``reader(data, start)`` for a record schema's ``fields``
    (the ``.avsc``'s list, in order), or None when a field is not flat."""
    lines = ["def reader(data, pos):", "    end = len(data)", "    try:"]
    names = []
    for i, field in enumerate(fields):
        name = field["name"]
        flat = flat_type(field["type"])
        if flat is None or not name.isidentifier() or keyword.iskeyword(name):
            return None
        kind, optional = flat
        body = _READ[kind].format(i=i).splitlines()
        if optional:  # the union's branch: 0 null, 1 the value (a one-byte varint: 0 or 2)
            lines += [
                "        n = data[pos]",
                "        pos += 1",
                "        if n == 0:",
                f"            v{i} = None",
                "        elif n == 2:",
            ]
            lines += ["            " + line for line in body]
            lines += ["        else:", "            return None"]
        else:
            lines += ["        " + line for line in body]
        names.append(f"{name!r}: v{i}")
    lines.append("    except (IndexError, struct_error, UnicodeDecodeError):  # the bytes end first, bad UTF-8")
    lines.append("        return None")
    lines.append("    if pos != end:  # trailing bytes, or a string's length past the end")
    lines.append("        return None")
    lines.append(f"    return {{{', '.join(names)}}}")
    return "\n".join(lines)


def compile_reader(fields: list[dict[str, Any]]) -> Reader | None:
    """The reader of a record schema's ``fields``, or None when a field is not flat."""
    source = reader_source(fields)
    if source is None:
        return None
    namespace: dict[str, Any] = {
        "_U64": _U64,
        "_unpack_double": _unpack_double,
        "struct_error": struct.error,
    }
    exec(compile(source, "<harness.codec_fast_read reader>", "exec"), namespace)  # (our own source, from a schema)
    return namespace["reader"]  # type: ignore[no-any-return]
