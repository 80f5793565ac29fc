"""murmur2 and key partitioning against Kafka's own test vectors (UtilsTest), in C
(tidelog._cproduce, where compiled) and in the Python twins, which agree on random keys."""

from __future__ import annotations

import random

import pytest
from tidelog import partitioner
from tidelog.partitioner import (
    MAX_PARTITION_COUNT,
    StickyPartitioner,
    murmur2,
    murmur2_py,
    partition_for_key,
    partition_for_key_py,
)

pytestmark = pytest.mark.timeout(10)

KAFKA_VECTORS = [
    ("21", -973932308),
    ("foobar", -790332482),
    ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    ("abc", 479470107),
]


@pytest.mark.parametrize("hash_of", [murmur2, murmur2_py], ids=["default", "python"])
@pytest.mark.parametrize(("text", "expected"), KAFKA_VECTORS)
def test_murmur2_matches_kafka(hash_of: object, text: str, expected: int) -> None:
    assert hash_of(text.encode()) == expected  # type: ignore[operator]


@pytest.mark.parametrize(
    "choose", [partition_for_key, partition_for_key_py], ids=["default", "python"]
)
def test_partition_for_key_is_positive_modulo(choose: object) -> None:
    for text, hashed in KAFKA_VECTORS:
        assert choose(text.encode(), 7) == (hashed & 0x7FFFFFFF) % 7  # type: ignore[operator]
    for count in (0, -1, MAX_PARTITION_COUNT + 1):
        with pytest.raises(ValueError, match="partition count"):
            choose(b"k", count)  # type: ignore[operator]


@pytest.mark.skipif(partitioner._cproduce is None, reason="tidelog._cproduce not built")
def test_the_c_hash_is_the_python_one() -> None:
    rng = random.Random(3)
    for _ in range(5000):
        key = rng.randbytes(rng.randrange(0, 300))
        count = rng.choice([1, 2, 3, 7, 100, 4096, MAX_PARTITION_COUNT])
        assert murmur2(key) == murmur2_py(key)
        assert partition_for_key(key, count) == partition_for_key_py(key, count)
    # Any bytes-like key, as the Python twin takes one.
    assert murmur2(bytearray(b"foobar")) == murmur2(memoryview(b"foobar")) == -790332482
    assert murmur2 is not murmur2_py


def test_sticky_partitioner_moves_to_another_partition_on_new_batch() -> None:
    sticky = StickyPartitioner(random.Random(1))
    first = sticky.partition("t", 4)
    assert sticky.partition("t", 4) == first
    sticky.on_new_batch("t", 4, first)
    assert sticky.partition("t", 4) != first
