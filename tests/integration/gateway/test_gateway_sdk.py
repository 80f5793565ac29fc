"""The Python SDK, unchanged, through the gateway against a real cluster
(etcd, a coordinator, three brokers): clients are given the gateway's
address only, so every produce, fetch, admin and group call goes through it."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tidelog import AdminClient, Consumer, ConsumerRecord, NewTopic, Producer, TopicPartition
from tidelog.errors import UnknownTopicOrPartitionError
from tidelog.v1 import cluster_pb2, cluster_pb2_grpc, log_pb2, log_pb2_grpc

from tests.support.cluster import ClusterProcesses
from tests.support.gateway import GatewayProcess, start_gateway

pytestmark = pytest.mark.timeout(120)

GATEWAY_NODE_ID = 2**31 - 1


def consume(consumer: Consumer, count: int, timeout_s: float = 30) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            out.extend(records)
    return out


def leaders(gateway: GatewayProcess, topic: str) -> set[int]:
    with AdminClient(gateway.address) as admin:
        (description,) = admin.describe_topics([topic])
    return {p.leader for p in description.partitions}


def test_metadata_and_cluster_name_the_gateway(
    gateway: GatewayProcess, names: tuple[str, str]
) -> None:
    topic, _ = names
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, 6)])
    with grpc.insecure_channel(gateway.address) as channel:
        metadata = log_pb2_grpc.LogStub(channel).Metadata(
            log_pb2.MetadataRequest(topics=[topic]), timeout=10
        )
        cluster = cluster_pb2_grpc.ClusterStub(channel).DescribeCluster(
            cluster_pb2.DescribeClusterRequest(), timeout=10
        )
    assert [b.broker_id for b in metadata.brokers] == [GATEWAY_NODE_ID]
    (described,) = metadata.topics
    assert [p.leader_id for p in described.partitions] == [GATEWAY_NODE_ID] * 6
    assert len(cluster.coordinators) == 1 and cluster.cluster_id
    # Admin answers through the gateway keep the brokers' real ids.
    assert len(leaders(gateway, topic)) == 3


def test_produce_and_assign_consume_across_three_leaders(
    gateway: GatewayProcess, names: tuple[str, str]
) -> None:
    topic, _ = names
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, 6)])
    assert len(leaders(gateway, topic)) == 3, "the partitions should have leaders on 3 brokers"
    sent = {(b"k%d" % i, b"v%d" % i) for i in range(3000)}
    with Producer(gateway.address, linger_ms=5) as producer:
        futures = [producer.send(topic, value, key=key) for key, value in sorted(sent)]
        producer.flush()
        partitions = {f.get(timeout=30).partition for f in futures}
    assert partitions == set(range(6))
    with Consumer(bootstrap_servers=gateway.address) as consumer:
        tps = [TopicPartition(topic, p) for p in range(6)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        got = consume(consumer, len(sent))
    assert {(r.key, r.value) for r in got} == sent
    assert len(got) == len(sent)


def test_group_consumer_commits_through_the_gateway(
    gateway: GatewayProcess, names: tuple[str, str]
) -> None:
    topic, group = names
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, 3)])
    with Producer(gateway.address, linger_ms=2) as producer:
        for i in range(300):
            producer.send(topic, b"%d" % i, key=b"%d" % i)
        producer.flush()
    with Consumer(
        topic,
        bootstrap_servers=gateway.address,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
    ) as consumer:
        got = consume(consumer, 300)
        consumer.commit()
    assert sorted(int(r.value) for r in got) == list(range(300))
    with AdminClient(gateway.address) as admin:
        offsets = admin.list_consumer_group_offsets(group)
        assert sum(o.offset for o in offsets.values()) == 300
        assert group in {g.group_id for g in admin.list_consumer_groups()}


def test_unknown_and_invalid_topics_get_their_typed_errors(
    gateway: GatewayProcess, names: tuple[str, str]
) -> None:
    topic, _ = names
    with (
        Producer(gateway.address, max_block_ms=2000) as producer,
        pytest.raises(UnknownTopicOrPartitionError, match=topic),
    ):
        producer.send(topic, b"x").get(timeout=30)
    # In-band, for a raw client: per partition, the stream stays open.
    with grpc.insecure_channel(gateway.address) as channel:
        stub = log_pb2_grpc.LogStub(channel)
        (answer,) = list(
            stub.Produce(
                iter(
                    [
                        log_pb2.ProduceRequest(
                            correlation_id=7,
                            acks=1,
                            partitions=[log_pb2.PartitionRecords(topic=topic, records=b"")],
                        )
                    ]
                ),
                timeout=10,
            )
        )
        assert answer.correlation_id == 7
        assert answer.partitions[0].error.code == 2  # UNKNOWN_TOPIC_OR_PARTITION
        assert topic in answer.partitions[0].error.message
        offsets = stub.ListOffsets(
            log_pb2.ListOffsetsRequest(
                partitions=[log_pb2.ListOffsetsPartition(topic=topic, timestamp_ms=-1)]
            ),
            timeout=10,
        )
        assert offsets.partitions[0].error.code == 2
        metadata = stub.Metadata(
            log_pb2.MetadataRequest(topics=["no spaces allowed", topic]), timeout=10
        )
        invalid, unknown = metadata.topics
        assert invalid.error.code == 3  # INVALID_TOPIC
        assert unknown.error.code == 2


def test_malformed_requests_get_invalid_argument(
    gateway: GatewayProcess, cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, _ = names
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    with grpc.insecure_channel(gateway.address) as channel:
        stub = log_pb2_grpc.LogStub(channel)
        bad_acks = log_pb2.ProduceRequest(acks=5)
        with pytest.raises(grpc.RpcError) as produce_error:
            list(stub.Produce(iter([bad_acks]), timeout=10))
        assert produce_error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "acks" in (produce_error.value.details() or "")
        too_many = log_pb2.ProduceRequest(
            acks=1,
            partitions=[log_pb2.PartitionRecords(topic=topic, partition=i) for i in range(10_001)],
        )
        with pytest.raises(grpc.RpcError) as limit_error:
            list(stub.Produce(iter([too_many]), timeout=10))
        assert limit_error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "10000" in (limit_error.value.details() or "")
        for request, word in (
            (log_pb2.FetchRequest(credit_bytes=-1), "credit_bytes"),
            (log_pb2.FetchRequest(credit_bytes=2**40), "credit_bytes"),
            (
                log_pb2.FetchRequest(
                    positions=[log_pb2.FetchPosition(topic=topic, fetch_offset=-3)]
                ),
                "fetch_offset",
            ),
        ):
            with pytest.raises(grpc.RpcError) as fetch_error:
                list(stub.Fetch(iter([request]), timeout=10))
            assert fetch_error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request
            assert word in (fetch_error.value.details() or "")
        # A batch the broker refuses fails its partition, in-band.
        (answer,) = list(
            stub.Produce(
                iter(
                    [
                        log_pb2.ProduceRequest(
                            acks=1,
                            partitions=[log_pb2.PartitionRecords(topic=topic, records=b"junk")],
                        )
                    ]
                ),
                timeout=10,
            )
        )
        assert answer.partitions[0].error.code != 0
    # Nothing of this hurt the gateway.
    with Producer(gateway.address) as producer:
        assert producer.send(topic, b"still fine").get(timeout=30).offset == 0


def test_streams_past_the_per_connection_limit_are_refused_naming_it(
    cluster: ClusterProcesses, tmp_path: Path, names: tuple[str, str]
) -> None:
    topic, _ = names
    gateway = start_gateway(
        cluster.etcd.endpoint,
        tmp_path,
        prefix=cluster.prefix,
        extra_args=("--max-streams-per-connection", "2"),
    )
    try:
        with AdminClient(gateway.address) as admin:
            admin.create_topics([NewTopic(topic, 1)])
        with Producer(gateway.address) as producer:
            producer.send(topic, b"x").get(timeout=30)
        idle = log_pb2.FetchRequest(
            positions=[log_pb2.FetchPosition(topic=topic, partition=0, fetch_offset=0)],
            credit_bytes=1024,
        )
        requests: queue.Queue[log_pb2.FetchRequest | None] = queue.Queue()

        def held_open() -> Iterator[log_pb2.FetchRequest]:
            yield idle
            while (request := requests.get()) is not None:
                yield request

        with grpc.insecure_channel(gateway.address) as channel:
            stub = log_pb2_grpc.LogStub(channel)
            open_calls = [stub.Fetch(held_open(), timeout=60) for _ in range(2)]
            for call in open_calls:
                next(call)  # open: it answered (and stays open, holding its slot)
            with pytest.raises(grpc.RpcError) as refused:
                next(stub.Fetch(iter([idle]), timeout=30))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-streams-per-connection=2" in (refused.value.details() or "")
            for call in open_calls:
                call.cancel()
            for _ in open_calls:
                requests.put(None)
    finally:
        gateway.stop()
