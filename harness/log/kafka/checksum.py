"""The per-record checksum of the sessions topic: header ``harness.crc32``.

Every record the harness writes carries a ``harness.crc32`` header: the CRC-32 (the
zlib / IEEE 802.3 polynomial: ``java.util.zip.CRC32``, Go's ``crc32.ChecksumIEEE``) of
the message value, as 4 big-endian bytes. Readers verify it, so a value changed
anywhere between the writer and the reader is a ``CorruptRecord`` at its offset,
never a silently different record. The value's framing (Avro single-object or
registry) is unchanged. Producers in other languages should add the header; a record
without it is read unchecked (Kafka's own batch CRC, which every harness consumer
verifies with ``check.crcs``, still covers the broker's disk).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from harness.ids import RECORD_CRC_HEADER, RECORD_TYPE_HEADER

__all__ = ["crc_problem", "record_headers"]


def record_headers(record_type: str, value: bytes) -> list[tuple[str, bytes]]:
    """The headers of a session record: its type and the CRC-32 of its value."""
    return [
        (RECORD_TYPE_HEADER, record_type.encode()),
        (RECORD_CRC_HEADER, zlib.crc32(value).to_bytes(4, "big")),
    ]


def crc_problem(headers: Sequence[tuple[str, Any]] | None, value: bytes) -> str | None:
    """Why the value does not match its ``harness.crc32`` header, or None (also when absent)."""
    for name, given in headers or ():
        if name == RECORD_CRC_HEADER:
            if given is None or len(given) != 4:
                return "its harness.crc32 header is not 4 bytes"
            if int.from_bytes(given, "big") != zlib.crc32(value):
                return "its value does not match its harness.crc32 header (a changed byte)"
            return None
    return None
