"""ConsumerRecord as the consumer builds it from a fetched buffer
(`SubscriptionState._decode`): the leader epoch comes from the batch header,
and the serialized sizes are those of the stored bytes (-1 for a null), with
or without a deserializer."""

from __future__ import annotations

import copy
import pickle
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
from tidelog._subscription import SubscriptionState
from tidelog.config import ConsumerConfig
from tidelog.records import encode_batch
from tidelog.types import ConsumerRecord, TopicPartition

pytestmark = pytest.mark.timeout(10)

TP = TopicPartition("t", 0)
# Two batches from leaders of different epochs: key, value per record.
FIRST = [(b"key-1", b"v" * 300), (None, None), (b"", b"")]
SECOND = [(None, b"abc")]
SIZES = [(5, 300), (-1, -1), (0, 0), (-1, 3)]


def _decode(**deserializers: Callable[[bytes], Any]) -> list[ConsumerRecord]:
    buf = encode_batch(
        [v for _, v in FIRST], keys=[k for k, _ in FIRST], partition_leader_epoch=7
    ) + encode_batch(
        [v for _, v in SECOND],
        keys=[k for k, _ in SECOND],
        base_offset=len(FIRST),
        partition_leader_epoch=9,
    )
    config = ConsumerConfig(bootstrap_servers="127.0.0.1:1", **deserializers)
    state = SubscriptionState(config, deque(), lambda name, args: None)
    records, error = state._decode(TP, buf, 0)
    assert error is None
    return records


def test_records_carry_the_batch_leader_epoch_and_the_stored_sizes() -> None:
    records = _decode()
    assert [r.offset for r in records] == [0, 1, 2, 3]
    assert [r.leader_epoch for r in records] == [7, 7, 7, 9]
    assert [(r.serialized_key_size, r.serialized_value_size) for r in records] == SIZES
    assert records[0]._asdict()["serialized_value_size"] == 300
    # Positional code written against the first eight fields keeps working.
    topic, partition, offset, _, _, key, value, headers = records[0][:8]
    assert (topic, partition, offset, key, value, headers) == ("t", 0, 0, b"key-1", b"v" * 300, ())


def test_sizes_are_those_of_the_stored_bytes_with_a_deserializer() -> None:
    records = _decode(key_deserializer=lambda k: k.decode() * 2, value_deserializer=len)
    assert [r.value for r in records] == [300, None, 0, 3]
    assert [r.key for r in records] == ["key-1key-1", None, "", None]
    assert [r.leader_epoch for r in records] == [7, 7, 7, 9]
    assert [(r.serialized_key_size, r.serialized_value_size) for r in records] == SIZES
    assert all(isinstance(r, ConsumerRecord) for r in records)
    first = records[0]
    assert first._asdict()["serialized_key_size"] == 5
    assert repr(first).startswith("ConsumerRecord(topic='t', partition=0, offset=0,")
    # Copies, pickles and _replace keep the stored sizes (not len of the value).
    for again in (copy.copy(first), pickle.loads(pickle.dumps(first)), first._replace(offset=1)):
        assert (again.serialized_key_size, again.serialized_value_size) == (5, 300)
        assert again.value == 300


def test_a_record_built_by_hand_takes_its_sizes_from_key_and_value() -> None:
    record = ConsumerRecord("t", 0, 0, 0, 0, None, b"", ())
    assert (record.leader_epoch, record.serialized_key_size, record.serialized_value_size) == (
        -1,
        -1,
        0,
    )


def test_a_partitions_records_are_decoded_inside_the_response_and_only_its_span() -> None:
    """The consumer decodes a partition's records where the fetch answer
    holds them (no copy of the answer): nothing before or after its span
    (another partition's batches) is read."""
    ours = encode_batch([b"ours-0", b"ours-1"], base_offset=10)
    theirs = encode_batch([b"theirs"], base_offset=11)
    response = theirs + ours + theirs
    config = ConsumerConfig(bootstrap_servers="127.0.0.1:1")
    state = SubscriptionState(config, deque(), lambda name, args: None)
    begin = len(theirs)
    records, error = state._decode(TP, response, 0, begin, begin + len(ours))
    assert error is None
    assert [(r.offset, r.value) for r in records] == [(10, b"ours-0"), (11, b"ours-1")]
    assert all(type(r.value) is bytes for r in records)
