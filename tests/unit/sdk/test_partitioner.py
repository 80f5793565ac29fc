"""murmur2 and key partitioning against Kafka's own test vectors (UtilsTest)."""

from __future__ import annotations

import random

import pytest
from tidelog.partitioner import StickyPartitioner, murmur2, partition_for_key

pytestmark = pytest.mark.timeout(10)

KAFKA_VECTORS = [
    ("21", -973932308),
    ("foobar", -790332482),
    ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    ("abc", 479470107),
]


@pytest.mark.parametrize(("text", "expected"), KAFKA_VECTORS)
def test_murmur2_matches_kafka(text: str, expected: int) -> None:
    assert murmur2(text.encode()) == expected


def test_partition_for_key_is_positive_modulo() -> None:
    for text, hashed in KAFKA_VECTORS:
        assert partition_for_key(text.encode(), 7) == (hashed & 0x7FFFFFFF) % 7


def test_sticky_partitioner_moves_to_another_partition_on_new_batch() -> None:
    sticky = StickyPartitioner(random.Random(1))
    first = sticky.partition("t", 4)
    assert sticky.partition("t", 4) == first
    sticky.on_new_batch("t", 4, first)
    assert sticky.partition("t", 4) != first
