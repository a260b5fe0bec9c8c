"""Kafka's keyed partitioner in pure Python, against values computed by Kafka's Java client.

The vectors come from ``org.apache.kafka.common.utils.Utils.murmur2`` /
``toPositive(murmur2(key)) % 12`` of kafka-clients 4.1.1 (the first six are also the
cases of Kafka's own ``UtilsTest.testMurmur2``). librdkafka's ``murmur2_random`` is
checked against the same function on a real broker in tests/integration/test_kafka_log.py.
"""

from __future__ import annotations

import pytest

from harness.log.kafka.partitioner import murmur2, partition_for, to_positive

JAVA = [
    ("21", -973932308, 0),
    ("foobar", -790332482, 6),
    ("a-little-bit-long-string", -985981536, 8),
    ("a-little-bit-longer-string", -1486304829, 11),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971, 5),
    ("abc", 479470107, 3),
    ("s", -342070737, 11),
    ("session-1", -783537844, 4),
    ("ünïcødé-€", 212670459, 3),
    ("", 275646681, 9),
    ("x\x00y", 632346061, 1),
]


@pytest.mark.parametrize(("key", "java_murmur2", "java_partition_of_12"), JAVA)
def test_murmur2_and_partition_match_the_java_client(
    key: str, java_murmur2: int, java_partition_of_12: int
) -> None:
    assert murmur2(key.encode("utf-8")) == java_murmur2
    assert partition_for(key, 12) == java_partition_of_12


def test_to_positive_clears_the_sign_bit_like_java() -> None:
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(2**31)) == 0
    assert to_positive(5) == 5


def test_one_partition_and_bad_counts() -> None:
    assert partition_for("anything", 1) == 0
    with pytest.raises(ValueError):
        partition_for("s", 0)
