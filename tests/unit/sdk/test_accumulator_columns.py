"""`RecordAccumulator.append_columns` and `AsyncProducer.send_batch`'s
checks: records given as columns join the same batches as records appended
one by one, so the idempotent producer numbers and retries them the same
way."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from tidelog import ProducerConfig
from tidelog._accumulator import ProducerBatch, RecordAccumulator, record_size
from tidelog._idempotence import ProducerIdentity
from tidelog.compression import CompressionType
from tidelog.producer import _column_sizes
from tidelog.records import decode_batches, read_header
from tidelog.types import TopicPartition

from tests.unit.sdk.test_accumulator import Clock

pytestmark = pytest.mark.timeout(10)

NONE = CompressionType.NONE


def make(batch_size: int = 1000, linger_ms: int = 5) -> tuple[RecordAccumulator, Clock]:
    clock = Clock()
    acc = RecordAccumulator(
        batch_size=batch_size,
        linger_ms=linger_ms,
        buffer_memory=1 << 20,
        wake=lambda: None,
        clock=clock,
    )
    return acc, clock


def columns(n: int, start: int = 0, keyed: bool = False, headers: bool = False) -> dict[str, Any]:
    values = [b"v%05d" % i for i in range(start, start + n)]
    keys = [b"k%d" % i for i in range(start, start + n)] if keyed else None
    hdrs = [[("i", b"%d" % i)] if i % 2 else None for i in range(start, start + n)]
    return {
        "values": values,
        "keys": keys,
        "headers": hdrs if headers else None,
        "timestamps": list(range(1000 + start, 1000 + start + n)),
        "sizes": _column_sizes(values, keys, hdrs if headers else None),
    }


def add(acc: RecordAccumulator, cols: dict[str, Any], partition: int = 0) -> Any:
    return acc.append_columns(
        "t",
        partition,
        3,
        cols["values"],
        cols["keys"],
        cols["headers"],
        cols["timestamps"],
        cols["sizes"],
        1.0,
    )


def drain_all(acc: RecordAccumulator, clock: Clock) -> list[ProducerBatch]:
    acc.seal_all()
    ready, expired, _ = acc.drain(clock(), 120.0)
    assert not expired
    return ready


def test_columns_fill_batches_in_order_and_round_trip() -> None:
    acc, clock = make(batch_size=400)
    cols = columns(50, keyed=True, headers=True)
    placements = add(acc, cols)
    # Placements cover every record once, in order, and split where a batch fills.
    assert sum(p.length for p in placements) == 50
    assert len(placements) > 1
    batches = drain_all(acc, clock)
    assert [b.result for b in batches] == [p.result for p in placements]
    assert all(p.first == 0 for p in placements)
    assert all(b.size <= 400 for b in batches)
    values, keys, headers, stamps = [], [], [], []
    for batch in batches:
        (decoded,) = decode_batches(batch.encode(NONE))
        values += decoded.values
        keys += decoded.keys
        headers += decoded.headers
        stamps += decoded.timestamps
    assert values == cols["values"]
    assert keys == cols["keys"]
    assert headers == [h or [] for h in cols["headers"]]
    assert stamps == cols["timestamps"]


def test_columns_join_the_open_batch_after_single_records() -> None:
    acc, clock = make(batch_size=10_000)
    single = acc.append("t", 0, 3, b"key", b"one", None, 5, record_size(b"key", b"one", None), 1.0)
    (placement,) = add(acc, columns(3))
    # Same batch, after the single record; keys of the keyless ones are null.
    assert placement.result is single[0] and placement.first == 1 and placement.length == 3
    (batch,) = drain_all(acc, clock)
    (decoded,) = decode_batches(batch.encode(NONE))
    assert decoded.values == [b"one", b"v00000", b"v00001", b"v00002"]
    assert decoded.keys == [b"key", None, None, None]
    placement.result.complete(100)
    assert placement.result.metadata(placement.first + 2).offset == 103


def test_a_record_larger_than_a_batch_goes_alone() -> None:
    acc, clock = make(batch_size=100)
    big = [b"x" * 300]
    cols = {"values": big, "keys": None, "headers": None, "timestamps": [1]}
    cols["sizes"] = _column_sizes(big, None, None)
    before = columns(2)
    add(acc, before)
    (placement,) = add(acc, cols)
    assert placement.length == 1
    batches = drain_all(acc, clock)
    assert [len(b) for b in batches] == [2, 1]


def test_keyless_columns_move_to_a_new_sticky_partition_when_a_batch_fills() -> None:
    acc, _ = make(batch_size=300)
    placements = add(acc, columns(40), partition=-1)
    partitions = [p.result.partition for p in placements]
    assert len(placements) > 1
    # KIP-480: a filled batch moves the sticky partition elsewhere.
    assert all(a != b for a, b in pairwise(partitions))


def test_sequences_continue_across_column_batches_and_single_records() -> None:
    acc, clock = make(batch_size=300)
    identity = ProducerIdentity(None, ProducerConfig(acks="all"))  # type: ignore[arg-type]
    identity.producer_id, identity.epoch = 7, 2
    add(acc, columns(30))
    acc.append("t", 0, 3, None, b"single", None, 5, record_size(None, b"single", None), 1.0)
    add(acc, columns(20, start=30))
    batches = drain_all(acc, clock)
    for batch in batches:
        identity.number(batch)
    expected = 0
    for batch in batches:
        header = read_header(batch.encode(NONE))
        assert (header.producer_id, header.producer_epoch) == (7, 2)
        assert header.base_sequence == expected
        assert header.record_count == batch.record_count()
        expected += batch.record_count()
    assert expected == 51


def test_a_retried_column_batch_resends_the_same_bytes_and_holds_back_later_ones() -> None:
    acc, clock = make(batch_size=300)
    identity = ProducerIdentity(None, ProducerConfig(acks="all"))  # type: ignore[arg-type]
    identity.producer_id, identity.epoch = 7, 0
    add(acc, columns(15))
    acc.seal_all()
    (first,), _, _ = acc.drain(clock(), 120.0)
    identity.number(first)
    sent = first.encode(NONE)
    # The request is lost: the batch waits for its retry, its partition muted.
    acc.requeue([first], clock() + 0.1)
    add(acc, columns(15, start=15))
    acc.seal_all()
    ready, _, _ = acc.drain(clock(), 120.0)
    assert ready == []
    clock.now += 0.2
    (retried,), _, _ = acc.drain(clock(), 120.0)
    assert retried is first
    assert retried.encode(NONE) == sent  # same base sequence, same bytes
    first.result.complete(0)
    assert acc.resolved(first)  # unmuted: the later batch may go now
    (later,), _, _ = acc.drain(clock(), 120.0)
    identity.number(later)
    assert later.tp == TopicPartition("t", 0)
    assert read_header(later.encode(NONE)).base_sequence == 15


def test_column_types_and_lengths_are_checked() -> None:
    with pytest.raises(TypeError, match="values must be bytes"):
        _column_sizes(["text"], None, None)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="keys must be bytes"):
        _column_sizes([b"v"], [1], None)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="2 keys for 1 values"):
        _column_sizes([b"v"], [b"a", b"b"], None)
    with pytest.raises(TypeError, match="header"):
        _column_sizes([b"v"], None, [[("k", "not bytes")]])  # type: ignore[list-item]
    assert _column_sizes([b"v", None], [None, b"kk"], [None, [("h", b"x")]]) == [
        record_size(None, b"v", None),
        record_size(b"kk", None, [("h", b"x")]),
    ]
