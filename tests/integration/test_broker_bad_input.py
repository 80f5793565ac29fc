"""Bad input to the broker: a precise error, nothing written, the broker stays up.

These talk to a real broker process through the raw generated gRPC stubs, as
a client in any other language would, so they pin the wire behaviour: the
typed ErrorCode per partition and, for whole-call errors, the gRPC status.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tidelog import records
from tidelog.errors import error_from_code
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2, log_pb2, log_pb2_grpc

from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(60)

SMALL_MAX_MESSAGE_BYTES = 2048


@pytest.fixture
def channel(broker: BrokerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(broker.address) as ch:
        yield ch


@pytest.fixture
def log_stub(channel: grpc.Channel) -> log_pb2_grpc.LogStub:
    return log_pb2_grpc.LogStub(channel)


@pytest.fixture
def admin(channel: grpc.Channel) -> admin_pb2_grpc.AdminStub:
    return admin_pb2_grpc.AdminStub(channel)


@pytest.fixture
def topic(admin: admin_pb2_grpc.AdminStub, topic_name: str) -> str:
    reply = admin.CreateTopics(
        admin_pb2.CreateTopicsRequest(
            topics=[
                admin_pb2.NewTopic(
                    name=topic_name,
                    partitions=2,
                    configs={"max.message.bytes": str(SMALL_MAX_MESSAGE_BYTES)},
                )
            ]
        ),
        timeout=10,
    )
    assert not reply.topics[0].HasField("error"), reply
    return topic_name


def produce_one(
    stub: log_pb2_grpc.LogStub, topic: str, partition: int, data: bytes
) -> log_pb2.PartitionProduceResult:
    request = log_pb2.ProduceRequest(
        correlation_id=7,
        acks=1,
        partitions=[log_pb2.PartitionRecords(topic=topic, partition=partition, records=data)],
    )
    (response,) = list(stub.Produce(iter([request]), timeout=10))
    assert response.correlation_id == 7
    return response.partitions[0]


def log_end_offset(admin: admin_pb2_grpc.AdminStub, topic: str, partition: int) -> int:
    reply = admin.DescribeTopics(admin_pb2.DescribeTopicsRequest(names=[topic]), timeout=10)
    return reply.topics[0].partitions[partition].log_end_offset


def assert_still_serving(broker: BrokerProcess, stub: log_pb2_grpc.LogStub, topic: str) -> None:
    """The process is alive, healthy, and still takes a good batch."""
    assert broker.proc is not None and broker.proc.poll() is None
    with grpc.insecure_channel(broker.address) as ch:
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    result = produce_one(stub, topic, 0, records.encode_batch([b"still fine"]))
    assert not result.HasField("error"), result


def assert_error(result: log_pb2.PartitionProduceResult, code: int, *fragments: str) -> None:
    assert result.HasField("error"), result
    assert result.error.code == code, result.error
    for fragment in fragments:
        assert fragment in result.error.message, result.error.message
    assert result.base_offset == -1


def test_invalid_topic_name_on_create(
    admin: admin_pb2_grpc.AdminStub, broker: BrokerProcess
) -> None:
    names = ["has space", "a" * 250, "..", "", "slash/name"]
    reply = admin.CreateTopics(
        admin_pb2.CreateTopicsRequest(topics=[admin_pb2.NewTopic(name=n) for n in names]),
        timeout=10,
    )
    for result in reply.topics:
        assert result.error.code == common_pb2.INVALID_TOPIC, result
        assert "topic name" in result.error.message
    # The SDK turns the code into its typed error, whose gRPC status is precise.
    error = error_from_code(reply.topics[0].error.code, reply.topics[0].error.message)
    assert error.grpc_status == grpc.StatusCode.INVALID_ARGUMENT
    listed = admin.DescribeTopics(admin_pb2.DescribeTopicsRequest(), timeout=10)
    assert not {t.name for t in listed.topics} & set(names)


def test_invalid_topic_name_on_produce(
    log_stub: log_pb2_grpc.LogStub, topic: str, broker: BrokerProcess
) -> None:
    result = produce_one(log_stub, "bad*name", 0, records.encode_batch([b"x"]))
    assert_error(result, common_pb2.INVALID_TOPIC, "bad*name", "'*'")
    assert_still_serving(broker, log_stub, topic)


def test_unknown_partition(
    log_stub: log_pb2_grpc.LogStub,
    admin: admin_pb2_grpc.AdminStub,
    topic: str,
    broker: BrokerProcess,
) -> None:
    result = produce_one(log_stub, topic, 9, records.encode_batch([b"x"]))
    assert_error(result, common_pb2.UNKNOWN_TOPIC_OR_PARTITION, "partitions 0 to 1", "9")
    assert_still_serving(broker, log_stub, topic)


def test_unknown_topic_without_auto_create(
    log_stub: log_pb2_grpc.LogStub, broker: BrokerProcess, topic: str
) -> None:
    # The module's broker auto-creates on produce; ListOffsets never creates.
    reply = log_stub.ListOffsets(
        log_pb2.ListOffsetsRequest(
            partitions=[
                log_pb2.ListOffsetsPartition(topic="never-created", partition=0, timestamp_ms=-1)
            ]
        ),
        timeout=10,
    )
    assert reply.partitions[0].error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
    assert "never-created" in reply.partitions[0].error.message
    error = error_from_code(reply.partitions[0].error.code, reply.partitions[0].error.message)
    assert error.grpc_status == grpc.StatusCode.NOT_FOUND and error.retriable


def test_offset_out_of_range_names_the_valid_range(
    log_stub: log_pb2_grpc.LogStub, topic: str, broker: BrokerProcess
) -> None:
    produce_one(log_stub, topic, 1, records.encode_batch([b"a", b"b", b"c"]))

    def requests() -> Iterator[log_pb2.FetchRequest]:
        yield log_pb2.FetchRequest(
            positions=[log_pb2.FetchPosition(topic=topic, partition=1, fetch_offset=50)],
            credit_bytes=1 << 20,
            max_wait_ms=100,
        )

    call = log_stub.Fetch(requests(), timeout=10)
    response = next(call)
    call.cancel()
    data = response.partitions[0]
    assert data.error.code == common_pb2.OFFSET_OUT_OF_RANGE
    assert "50" in data.error.message and "0 to 3" in data.error.message, data.error.message
    assert_still_serving(broker, log_stub, topic)


def test_batch_over_max_message_bytes(
    log_stub: log_pb2_grpc.LogStub,
    admin: admin_pb2_grpc.AdminStub,
    topic: str,
    broker: BrokerProcess,
) -> None:
    before = log_end_offset(admin, topic, 0)
    big = records.encode_batch([b"x" * (SMALL_MAX_MESSAGE_BYTES + 1)])
    result = produce_one(log_stub, topic, 0, big)
    assert_error(result, common_pb2.MESSAGE_TOO_LARGE, "max.message.bytes=2048", str(len(big)))
    assert log_end_offset(admin, topic, 0) == before
    assert_still_serving(broker, log_stub, topic)


def test_crc_mismatch(
    log_stub: log_pb2_grpc.LogStub,
    admin: admin_pb2_grpc.AdminStub,
    topic: str,
    broker: BrokerProcess,
) -> None:
    before = log_end_offset(admin, topic, 0)
    good = records.encode_batch([b"first"])
    corrupt = bytearray(records.encode_batch([b"payload"]))
    corrupt[-1] ^= 0xFF
    # A good batch before the corrupt one is not written either: all or nothing.
    result = produce_one(log_stub, topic, 0, good + bytes(corrupt))
    assert_error(result, common_pb2.CORRUPT_MESSAGE, "CRC32C")
    assert log_end_offset(admin, topic, 0) == before
    assert_still_serving(broker, log_stub, topic)


def test_truncated_batch(
    log_stub: log_pb2_grpc.LogStub,
    admin: admin_pb2_grpc.AdminStub,
    topic: str,
    broker: BrokerProcess,
) -> None:
    before = log_end_offset(admin, topic, 0)
    batch = records.encode_batch([b"some value"])
    for cut in (10, records.HEADER_SIZE - 1, len(batch) - 1):
        result = produce_one(log_stub, topic, 0, batch[:cut])
        assert_error(result, common_pb2.INVALID_RECORD, "truncated")
    assert log_end_offset(admin, topic, 0) == before
    assert_still_serving(broker, log_stub, topic)


def test_malformed_batch(
    log_stub: log_pb2_grpc.LogStub,
    admin: admin_pb2_grpc.AdminStub,
    topic: str,
    broker: BrokerProcess,
) -> None:
    before = log_end_offset(admin, topic, 0)
    bad_magic = bytearray(records.encode_batch([b"v"]))
    bad_magic[16] = 99
    result = produce_one(log_stub, topic, 0, bytes(bad_magic))
    assert_error(result, common_pb2.INVALID_RECORD, "magic 99")
    empty = produce_one(log_stub, topic, 0, b"")
    assert_error(empty, common_pb2.INVALID_RECORD, "empty")
    garbage = produce_one(log_stub, topic, 0, b"\x00" * 100)
    assert_error(garbage, common_pb2.INVALID_RECORD)
    assert log_end_offset(admin, topic, 0) == before
    assert_still_serving(broker, log_stub, topic)


def test_bad_produce_request_fails_the_call_with_invalid_argument(
    log_stub: log_pb2_grpc.LogStub, topic: str, broker: BrokerProcess
) -> None:
    request = log_pb2.ProduceRequest(correlation_id=1, acks=5)
    with pytest.raises(grpc.RpcError) as caught:
        list(log_stub.Produce(iter([request]), timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "acks must be" in caught.value.details()
    assert ("tidelog-error-code", "INVALID_REQUEST") in tuple(caught.value.trailing_metadata())
    assert_still_serving(broker, log_stub, topic)


def test_bad_fetch_request_fails_the_call_with_invalid_argument(
    log_stub: log_pb2_grpc.LogStub, topic: str, broker: BrokerProcess
) -> None:
    request = log_pb2.FetchRequest(
        positions=[log_pb2.FetchPosition(topic=topic, partition=0, fetch_offset=-5)],
        credit_bytes=1000,
    )
    with pytest.raises(grpc.RpcError) as caught:
        list(log_stub.Fetch(iter([request]), timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "fetch_offset must be >= 0" in caught.value.details()
    assert_still_serving(broker, log_stub, topic)


def test_invalid_topic_config(admin: admin_pb2_grpc.AdminStub) -> None:
    reply = admin.CreateTopics(
        admin_pb2.CreateTopicsRequest(
            topics=[
                admin_pb2.NewTopic(name="cfg-unknown", configs={"retention.mss": "1"}),
                admin_pb2.NewTopic(name="cfg-range", configs={"segment.bytes": "12"}),
            ]
        ),
        timeout=10,
    )
    unknown, out_of_range = reply.topics
    assert unknown.error.code == common_pb2.INVALID_CONFIG
    assert "retention.mss" in unknown.error.message
    assert out_of_range.error.code == common_pb2.INVALID_CONFIG
    assert "segment.bytes=12" in out_of_range.error.message and "1024" in out_of_range.error.message
