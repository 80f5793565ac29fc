"""A standalone broker refusing admin requests that make no sense, as the
coordinator does (tests/integration/coordinator/test_admin_limits.py): over
the CreateTopics limits, min.insync.replicas above its one replica, a topic
or partition named twice in one request; a topic named twice in a Metadata
or DescribeTopics is described once."""

from __future__ import annotations

import grpc
import pytest
from tidelog import AdminClient, NewTopic, Producer
from tidelog.errors import ERROR_CODE_METADATA_KEY, InvalidConfigError
from tidelog.request_limits import MAX_PARTITIONS_PER_TOPIC, MAX_TOPICS_PER_REQUEST
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2, log_pb2, log_pb2_grpc

from tests.support.admin_requests import (
    ALTERED_RETENTION_MS,
    delete_records_request,
    topic_request,
)
from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("topics", "limit"),
    [
        (
            [admin_pb2.NewTopic(name=f"many-{i}") for i in range(MAX_TOPICS_PER_REQUEST + 1)],
            "MAX_TOPICS_PER_REQUEST",
        ),
        (
            [admin_pb2.NewTopic(name="wide", partitions=MAX_PARTITIONS_PER_TOPIC + 1)],
            "MAX_PARTITIONS_PER_TOPIC",
        ),
    ],
)
def test_create_topics_over_a_limit_is_invalid_request_naming_it(
    broker: BrokerProcess, topics: list[admin_pb2.NewTopic], limit: str
) -> None:
    with grpc.insecure_channel(broker.address) as channel, pytest.raises(grpc.RpcError) as info:
        # validate_only: a broker without the limit would create nothing either.
        admin_pb2_grpc.AdminStub(channel).CreateTopics(
            admin_pb2.CreateTopicsRequest(topics=topics, validate_only=True), timeout=30
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    trailing = dict(info.value.trailing_metadata() or ())  # type: ignore[attr-defined]
    assert trailing.get(ERROR_CODE_METADATA_KEY) == "INVALID_REQUEST"
    assert limit in info.value.details()  # type: ignore[attr-defined]


def test_min_insync_replicas_above_the_one_replica_is_refused(
    broker: BrokerProcess, topic_name: str
) -> None:
    with AdminClient(broker.address) as admin:
        with pytest.raises(InvalidConfigError, match="replication factor 1"):
            admin.create_topics([NewTopic(topic_name, 1, 1, {"min.insync.replicas": "2"})])
        admin.create_topics([NewTopic(topic_name, 1, 1)])
        with pytest.raises(InvalidConfigError, match=r"min\.insync\.replicas=2"):
            admin.alter_configs({topic_name: {"min.insync.replicas": "2"}})
        with pytest.raises(InvalidConfigError, match=r"retention\.ms"):
            admin.alter_configs({topic_name: {"retention.ms": "9" * 400}})


@pytest.mark.parametrize("rpc", ["CreateTopics", "DeleteTopics", "AlterConfigs"])
def test_a_topic_named_twice_in_one_request_is_refused_in_each_entry(
    broker: BrokerProcess, topic_name: str, rpc: str
) -> None:
    twice, once = f"{topic_name}-twice", f"{topic_name}-once"
    if rpc != "CreateTopics":
        with AdminClient(broker.address) as admin:
            admin.create_topics([NewTopic(twice, 1, 1), NewTopic(once, 1, 1)])
    request = topic_request(rpc, [twice, once, twice])
    with grpc.insecure_channel(broker.address) as channel:
        reply = getattr(admin_pb2_grpc.AdminStub(channel), rpc)(request, timeout=30)
    answers = [(t.name, t.error.code) for t in reply.topics]
    assert answers == [
        (twice, common_pb2.INVALID_REQUEST),
        (once, common_pb2.NONE),
        (twice, common_pb2.INVALID_REQUEST),
    ], reply
    assert f"named more than once in one {rpc}" in reply.topics[0].error.message
    with AdminClient(broker.address) as admin:
        topics = admin.list_topics()
        assert (twice in topics) is (rpc != "CreateTopics")
        if rpc == "AlterConfigs":
            assert (
                admin.describe_configs([twice])[twice]["retention.ms"].value != ALTERED_RETENTION_MS
            )


def test_a_topic_named_twice_in_one_metadata_or_describe_topics_is_described_once(
    broker: BrokerProcess, topic_name: str
) -> None:
    """Described once per entry, a topic named thousands of times kept a
    broker busy for a minute (found by tests/security in cluster mode)."""
    twice, once = f"{topic_name}-meta-twice", f"{topic_name}-meta-once"
    with AdminClient(broker.address) as admin:
        admin.create_topics([NewTopic(twice, 3, 1), NewTopic(once, 1, 1)])
    with grpc.insecure_channel(broker.address) as channel:
        metadata = log_pb2_grpc.LogStub(channel).Metadata(
            log_pb2.MetadataRequest(topics=[twice, once, twice]), timeout=30
        )
        described = admin_pb2_grpc.AdminStub(channel).DescribeTopics(
            admin_pb2.DescribeTopicsRequest(names=[twice, once, twice]), timeout=30
        )
    for reply in (metadata, described):
        answers = [(t.name, t.error.code, len(t.partitions)) for t in reply.topics]
        assert answers == [(twice, common_pb2.NONE, 3), (once, common_pb2.NONE, 1)], reply


def test_a_partition_named_twice_in_one_delete_records_is_refused_in_each_entry(
    broker: BrokerProcess, topic_name: str
) -> None:
    with AdminClient(broker.address) as admin:
        admin.create_topics([NewTopic(topic_name, 2, 1)])
    with Producer(bootstrap_servers=broker.address, linger_ms=0) as producer:
        for partition in (0, 1):
            for _ in range(10):
                producer.send(topic_name, b"x", partition=partition).get(timeout=10)
    request = delete_records_request(topic_name, [(0, 3), (1, 3), (0, 4)])
    with grpc.insecure_channel(broker.address) as channel:
        reply = admin_pb2_grpc.AdminStub(channel).DeleteRecords(request, timeout=30)
    answers = [(p.partition, p.error.code, p.low_watermark) for p in reply.partitions]
    assert answers == [
        (0, common_pb2.INVALID_REQUEST, 0),
        (1, common_pb2.NONE, 3),
        (0, common_pb2.INVALID_REQUEST, 0),
    ], reply
    # The message names the partition (its topic cut to 64 characters).
    message = reply.partitions[0].error.message
    assert message.startswith(f"partition {topic_name[:64]}-0 ")
    assert "is named more than once in one DeleteRecords" in message
    with AdminClient(broker.address) as admin:
        partitions = admin.describe_topics([topic_name])[0].partitions
    assert {p.partition: p.log_start_offset for p in partitions} == {0: 0, 1: 3}
