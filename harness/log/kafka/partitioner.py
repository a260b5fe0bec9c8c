"""Which partition of the sessions topic holds a session: Kafka's own keyed partitioner.

The harness produces with an EXPLICIT partition, computed here exactly as Kafka's Java
producer does for a keyed record (``BuiltInPartitioner.partitionForKey``:
``toPositive(murmur2(key)) % numPartitions``). librdkafka's ``murmur2_random``
partitioner computes the same thing. So an external producer of inputs (a Java service
with the default partitioner, or any librdkafka client with
``partitioner=murmur2_random``) puts a session's inputs in the same partition as its
owner's records; a session never spans two partitions.

NEVER change this function: moving a session to another partition splits its log.
Pure Python, no Kafka import, so it can be unit tested anywhere.
"""

from __future__ import annotations

from functools import lru_cache

from harness.ids import message_key

__all__ = ["murmur2", "partition_for", "to_positive"]

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (a signed 32-bit int, as Java returns it)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    tail = length & ~3
    for i in range(0, tail, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24  # Java's >>> on an int: a logical shift of the unsigned value
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    # Java's switch falls through: 3 -> 2 -> 1, then one multiply.
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(n: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``)."""
    return n & 0x7FFFFFFF


@lru_cache(maxsize=65536)
def partition_for(session_id: str, partitions: int) -> int:
    """The partition of ``session_id`` among ``partitions`` (keyed by ``ids.message_key``)."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return to_positive(murmur2(message_key(session_id))) % partitions
