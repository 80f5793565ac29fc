"""ListOffsets on a standalone broker, at a bounded cost per request: a
partition may be named more than once (earliest and latest in one request),
each distinct entry is looked up once, at most MAX_TIMESTAMPS_PER_PARTITION
distinct timestamps per partition and MAX_LIST_OFFSETS_ENTRIES entries per
request; the SDK splits its requests so that it never meets that limit. A
timestamp lookup answers the first record reaching it, wherever it is.
(Through a cluster's broker and the gateway: coordinator/test_admin_limits.py.)"""

from __future__ import annotations

import random
import threading
import time

import grpc
import pytest
from tidelog import AdminClient, Consumer, NewTopic, OffsetSpec, Producer, TopicPartition
from tidelog.compression import CompressionType
from tidelog.errors import ERROR_CODE_METADATA_KEY
from tidelog.records import encode_batch
from tidelog.request_limits import MAX_LIST_OFFSETS_ENTRIES, MAX_TIMESTAMPS_PER_PARTITION
from tidelog.v1 import common_pb2, log_pb2, log_pb2_grpc

from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(120)

EARLIEST, LATEST = -2, -1
#: Records of the batch a timestamp lookup decodes in the repeated-entry
#: test: with a timestamp each, ~17 bytes a record, within the default
#: max.message.bytes (1 MiB). One lookup decoded all of it: ~20 ms here.
BIG_BATCH_RECORDS = 60_000
#: Generous: the repeated-entry request is one lookup now, ~20 ms; looked up
#: once per entry (the old code) it took MAX_LIST_OFFSETS_ENTRIES lookups,
#: ~20 s of the broker's event loop, and every other call waited.
NOT_STALLED_DEADLINE_S = 10.0
#: How often the other client asks for Metadata meanwhile.
METADATA_INTERVAL_S = 0.05


def produce_batch(address: str, topic: str, partition: int, timestamps: list[int]) -> None:
    """One batch of one-byte records with these timestamps, from offset 0."""
    produce_records(
        address, topic, partition, encode_batch([b"x"] * len(timestamps), timestamps=timestamps)
    )


def produce_records(address: str, topic: str, partition: int, batches: bytes) -> None:
    """Batches (encoded, back to back) in one produce request, from offset 0."""
    request = log_pb2.ProduceRequest(
        acks=1,
        partitions=[log_pb2.PartitionRecords(topic=topic, partition=partition, records=batches)],
    )
    with grpc.insecure_channel(address) as channel:
        (answer,) = list(log_pb2_grpc.LogStub(channel).Produce(iter([request]), timeout=30))
    assert answer.partitions[0].error.code == common_pb2.NONE, answer
    assert answer.partitions[0].base_offset == 0


def ask_list_offsets(
    address: str, entries: list[tuple[str, int, int]], timeout_s: float = 30
) -> log_pb2.ListOffsetsResponse:
    """ListOffsets of each (topic, partition, timestamp_ms), one answer each."""
    request = log_pb2.ListOffsetsRequest(
        partitions=[
            log_pb2.ListOffsetsPartition(topic=t, partition=p, timestamp_ms=ts)
            for t, p, ts in entries
        ]
    )
    with grpc.insecure_channel(address) as channel:
        reply = log_pb2_grpc.LogStub(channel).ListOffsets(request, timeout=timeout_s)
    assert [(r.topic, r.partition) for r in reply.partitions] == [(t, p) for t, p, _ in entries]
    return reply  # type: ignore[no-any-return]


def list_offsets(
    address: str, entries: list[tuple[str, int, int]], timeout_s: float = 30
) -> list[tuple[int, int, int]]:
    """(error code, offset, timestamp) for each (topic, partition, timestamp_ms)."""
    reply = ask_list_offsets(address, entries, timeout_s)
    return [(r.error.code, r.offset, r.timestamp_ms) for r in reply.partitions]


def test_earliest_latest_and_a_timestamp_of_one_partition_in_one_request(
    broker: BrokerProcess, topic_name: str
) -> None:
    """The reverted fix refused a partition named twice; asking it for
    earliest and latest at once is what tests/fault and users do."""
    with AdminClient(broker.address) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    start = int(time.time() * 1000) - 10_000
    produce_batch(broker.address, topic_name, 0, [start + 10 * i for i in range(10)])
    asked = [EARLIEST, LATEST, start + 25, LATEST, EARLIEST, start + 25, start + 1_000_000]
    answers = list_offsets(broker.address, [(topic_name, 0, ts) for ts in asked])
    assert answers == [
        (common_pb2.NONE, 0, -1),
        (common_pb2.NONE, 10, -1),
        (common_pb2.NONE, 3, start + 30),
        (common_pb2.NONE, 10, -1),
        (common_pb2.NONE, 0, -1),
        (common_pb2.NONE, 3, start + 30),
        # After the last record: none found.
        (common_pb2.NONE, -1, -1),
    ]


def test_a_timestamp_finds_the_first_record_reaching_it_in_any_batch(
    broker: BrokerProcess, topic_name: str
) -> None:
    """Timestamps out of order within batches (CreateTime is the
    producers'), batches compressed or not: each lookup answers the first
    record, in offset order, whose timestamp reaches the target (as Kafka
    does), not the nearest one; past every record, none."""
    with AdminClient(broker.address) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    start = int(time.time() * 1000) - 100_000
    rng = random.Random(1128)
    timestamps: list[int] = []
    batches = []
    for codec in (CompressionType.NONE, CompressionType.GZIP, CompressionType.NONE):
        # Rising from batch to batch, shuffled within each.
        stamps = [start + len(timestamps) * 10 + rng.randrange(3_000) for _ in range(300)]
        batches.append(encode_batch([b"x"] * len(stamps), timestamps=stamps, codec=codec))
        timestamps += stamps
    produce_records(broker.address, topic_name, 0, b"".join(batches))
    asked = sorted(rng.sample(range(start - 5, max(timestamps) + 5), MAX_TIMESTAMPS_PER_PARTITION))
    expected = []
    for target in asked:
        found = next((i for i, t in enumerate(timestamps) if t >= target), None)
        answer = (-1, -1) if found is None else (found, timestamps[found])
        expected.append((common_pb2.NONE, *answer))
    assert list_offsets(broker.address, [(topic_name, 0, t) for t in asked]) == expected
    assert list_offsets(broker.address, [(topic_name, 0, max(timestamps) + 1)]) == [
        (common_pb2.NONE, -1, -1)
    ]


def test_distinct_timestamps_past_the_limit_are_refused_naming_it(
    broker: BrokerProcess, topic_name: str
) -> None:
    with AdminClient(broker.address) as admin:
        admin.create_topics([NewTopic(topic_name, 2, 1)])
    start = int(time.time() * 1000) - 100_000
    count = MAX_TIMESTAMPS_PER_PARTITION + 3
    for partition in (0, 1):
        produce_batch(broker.address, topic_name, partition, [start + i for i in range(count)])
    within = [(topic_name, 0, start + i) for i in range(MAX_TIMESTAMPS_PER_PARTITION)]
    past = [(topic_name, 0, start + i) for i in range(MAX_TIMESTAMPS_PER_PARTITION, count)]
    entries = [
        *within,
        *past,
        (topic_name, 0, EARLIEST),
        (topic_name, 0, LATEST),
        within[0],  # a timestamp already looked up: its answer again
        past[0],  # one refused: refused again
        (topic_name, 1, start + count - 1),  # another partition: its own count
    ]
    reply = ask_list_offsets(broker.address, entries)
    answers = [(r.error.code, r.offset, r.timestamp_ms) for r in reply.partitions]
    expected = [(common_pb2.NONE, i, start + i) for i in range(MAX_TIMESTAMPS_PER_PARTITION)]
    expected += [(common_pb2.INVALID_REQUEST, -1, -1)] * len(past)
    expected += [
        (common_pb2.NONE, 0, -1),
        (common_pb2.NONE, count, -1),
        (common_pb2.NONE, 0, start),
        (common_pb2.INVALID_REQUEST, -1, -1),
        (common_pb2.NONE, count - 1, start + count - 1),
    ]
    assert answers == expected
    message = reply.partitions[MAX_TIMESTAMPS_PER_PARTITION].error.message
    assert "MAX_TIMESTAMPS_PER_PARTITION" in message
    assert f"{topic_name}-0" in message


def test_a_timestamp_repeated_in_every_entry_is_looked_up_once(
    broker: BrokerProcess, topic_name: str
) -> None:
    """The largest request, every entry the same timestamp lookup of a
    partition whose batch is large: answered in full, and another client's
    Metadata, sent meanwhile, is answered too. Looked up once per entry,
    the request held the broker's event loop for MAX_LIST_OFFSETS_ENTRIES
    decodes of the batch (seconds): the Metadata waited behind it."""
    with AdminClient(broker.address) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    start = int(time.time() * 1000) - BIG_BATCH_RECORDS
    produce_batch(broker.address, topic_name, 0, [start + i for i in range(BIG_BATCH_RECORDS)])
    last = start + BIG_BATCH_RECORDS - 1  # the last record: the whole batch is scanned
    answers: list[list[tuple[int, int, int]]] = []
    failures: list[BaseException] = []

    def ask() -> None:
        try:
            entries = [(topic_name, 0, last)] * MAX_LIST_OFFSETS_ENTRIES
            answers.append(list_offsets(broker.address, entries, NOT_STALLED_DEADLINE_S))
        except BaseException as exc:
            failures.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    try:
        with grpc.insecure_channel(broker.address) as channel:
            stub = log_pb2_grpc.LogStub(channel)
            # Asked until the ListOffsets is answered: one asked while the
            # broker works on it must be answered too.
            while True:
                metadata = stub.Metadata(
                    log_pb2.MetadataRequest(topics=[topic_name]), timeout=NOT_STALLED_DEADLINE_S
                )
                assert [len(t.partitions) for t in metadata.topics] == [1]
                if not asking.is_alive():
                    break
                time.sleep(METADATA_INTERVAL_S)
    finally:
        asking.join()
    assert not failures, failures
    assert answers == [[(common_pb2.NONE, BIG_BATCH_RECORDS - 1, last)] * MAX_LIST_OFFSETS_ENTRIES]


def test_a_request_over_the_entry_limit_is_refused_naming_it(
    broker: BrokerProcess, topic_name: str
) -> None:
    with AdminClient(broker.address) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    at_limit = [(topic_name, 0, LATEST)] * MAX_LIST_OFFSETS_ENTRIES
    assert list_offsets(broker.address, at_limit) == [(common_pb2.NONE, 0, -1)] * len(at_limit)
    with pytest.raises(grpc.RpcError) as info:
        list_offsets(broker.address, [*at_limit, (topic_name, 0, EARLIEST)])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    trailing = dict(info.value.trailing_metadata() or ())  # type: ignore[attr-defined]
    assert trailing.get(ERROR_CODE_METADATA_KEY) == "INVALID_REQUEST"
    assert "MAX_LIST_OFFSETS_ENTRIES" in info.value.details()  # type: ignore[attr-defined]


def test_the_sdk_splits_its_requests_at_the_entry_limit(
    broker: BrokerProcess, topic_name: str
) -> None:
    """One leader of more partitions than one request may name: the admin
    client's and the consumer's lookups are split, not refused. (A seek
    resets each partition with a ListOffsets of its own.)"""
    partitions = MAX_LIST_OFFSETS_ENTRIES + 5
    tps = [TopicPartition(topic_name, p) for p in range(partitions)]
    written = {0: 1, MAX_LIST_OFFSETS_ENTRIES - 1: 2, partitions - 1: 3}
    with AdminClient(broker.address) as admin:
        admin.create_topics([NewTopic(topic_name, partitions, 1)])
    with Producer(bootstrap_servers=broker.address, linger_ms=0) as producer:
        for partition, count in written.items():
            for _ in range(count):
                producer.send(topic_name, b"x", partition=partition).get(timeout=30)
    ends = {tp: written.get(tp.partition, 0) for tp in tps}
    with AdminClient(broker.address) as admin:
        latest = admin.list_offsets(dict.fromkeys(tps, OffsetSpec.latest()))
        earliest = admin.list_offsets(dict.fromkeys(tps, OffsetSpec.earliest()))
    assert {tp: info.offset for tp, info in latest.items()} == ends
    assert {tp: info.offset for tp, info in earliest.items()} == dict.fromkeys(tps, 0)
    with Consumer(bootstrap_servers=broker.address) as consumer:
        assert consumer.end_offsets(tps) == ends
        found = consumer.offsets_for_times(dict.fromkeys(tps, 0))
        assert {tp: at.offset for tp, at in found.items() if at is not None} == {
            TopicPartition(topic_name, p): 0 for p in written
        }
