"""Cluster metadata on a real etcd through real coordinator processes."""

from __future__ import annotations

import asyncio
import collections

import grpc
import pytest
from tidelog.v1 import admin_pb2, admin_pb2_grpc, cluster_pb2, cluster_pb2_grpc, common_pb2

from tests.integration.coordinator.conftest import StartCoordinator
from tests.integration.coordinator.helpers import etcd_client, eventually, register_broker
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(60)


def test_broker_registration_vanishes_when_its_lease_expires(
    etcd: EtcdProcess, prefix: str
) -> None:
    async def run() -> None:
        async with etcd_client(etcd.endpoint) as client:
            await register_broker(client, prefix, 7, ttl_s=2)
            key = f"{prefix}/brokers/ids/7".encode()
            assert await client.get(key) is not None
            # Nobody refreshes the lease (the broker "died"): the key goes.
            await eventually(lambda: _absent(client, key), 30, "registration to expire")

    asyncio.run(run())


async def _absent(client: object, key: bytes) -> bool:
    return await client.get(key) is None  # type: ignore[attr-defined]


def test_create_describe_delete_topics_with_placement(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()

    async def run() -> None:
        async with etcd_client(etcd.endpoint) as client:
            for broker_id in (1, 2, 3):
                await register_broker(client, prefix, broker_id)
            async with grpc.aio.insecure_channel(coordinator.address) as channel:
                admin = admin_pb2_grpc.AdminStub(channel)
                created = await admin.CreateTopics(
                    admin_pb2.CreateTopicsRequest(
                        topics=[
                            admin_pb2.NewTopic(
                                name="orders",
                                partitions=12,
                                replication_factor=3,
                                configs={"retention.ms": "60000"},
                            ),
                            admin_pb2.NewTopic(name="bad/name", partitions=1),
                            admin_pb2.NewTopic(name="too-many", partitions=1, replication_factor=4),
                            admin_pb2.NewTopic(name="bad-config", configs={"segment.bytes": "1"}),
                        ]
                    )
                )
                codes = {t.name: t.error.code for t in created.topics}
                assert codes == {
                    "orders": common_pb2.NONE,
                    "bad/name": common_pb2.INVALID_TOPIC,
                    "too-many": common_pb2.INVALID_REPLICATION_FACTOR,
                    "bad-config": common_pb2.INVALID_CONFIG,
                }
                again = await admin.CreateTopics(
                    admin_pb2.CreateTopicsRequest(topics=[admin_pb2.NewTopic(name="orders")])
                )
                assert again.topics[0].error.code == common_pb2.TOPIC_ALREADY_EXISTS

                described = await admin.DescribeTopics(
                    admin_pb2.DescribeTopicsRequest(names=["orders"])
                )
                topic = described.topics[0]
                assert topic.configs["retention.ms"] == "60000"
                assert topic.configs["cleanup.policy"] == "delete"
                leaders = collections.Counter(p.leader_id for p in topic.partitions)
                assert leaders == {1: 4, 2: 4, 3: 4}
                for p in topic.partitions:
                    assert sorted(p.replicas) == [1, 2, 3] and list(p.isr) == list(p.replicas)
                    assert p.leader_id == p.replicas[0]
                state = await client.get(f"{prefix}/partitions/orders/0/state".encode())
                assert state is not None and b'"leader_epoch":0' in state.value

                deleted = await admin.DeleteTopics(
                    admin_pb2.DeleteTopicsRequest(names=["orders", "nope"])
                )
                assert [t.error.code for t in deleted.topics] == [
                    common_pb2.NONE,
                    common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                ]
                assert not await client.get_prefix(f"{prefix}/partitions/orders/".encode())
                gone = await admin.DescribeTopics(admin_pb2.DescribeTopicsRequest(names=["orders"]))
                assert gone.topics[0].error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION

    asyncio.run(run())


def test_rack_aware_placement(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()
    racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}

    async def run() -> None:
        async with etcd_client(etcd.endpoint) as client:
            for broker_id, rack in racks.items():
                await register_broker(client, prefix, broker_id, rack=rack)
            async with grpc.aio.insecure_channel(coordinator.address) as channel:
                admin = admin_pb2_grpc.AdminStub(channel)
                await admin.CreateTopics(
                    admin_pb2.CreateTopicsRequest(
                        topics=[admin_pb2.NewTopic(name="r", partitions=12, replication_factor=3)]
                    )
                )
                described = await admin.DescribeTopics(admin_pb2.DescribeTopicsRequest(names=["r"]))
                for p in described.topics[0].partitions:
                    assert len({racks[b] for b in p.replicas}) == 3, list(p.replicas)

    asyncio.run(run())


def test_controller_fails_over_to_the_other_replica(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    first = coordinators(session_ttl_s=2)
    second = coordinators(session_ttl_s=2)

    async def controller(address: str) -> str:
        async with grpc.aio.insecure_channel(address) as channel:
            reply = await cluster_pb2_grpc.ClusterStub(channel).DescribeCluster(
                cluster_pb2.DescribeClusterRequest(), timeout=2
            )
            return reply.controller_id

    async def run() -> None:
        async with etcd_client(etcd.endpoint) as client:
            for broker_id in (1, 2, 3):
                await register_broker(client, prefix, broker_id)
        await eventually(lambda: _is(controller(first.address), "c0"), 5, "c0 to be controller")
        async with grpc.aio.insecure_channel(second.address) as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            await admin.CreateTopics(
                admin_pb2.CreateTopicsRequest(
                    topics=[admin_pb2.NewTopic(name="keep", partitions=6)]
                )
            )
        first.kill()  # SIGKILL: no resignation, the lease must expire
        # How long this takes is measured by bench/group_bench.py (controller fail-over).
        await eventually(lambda: _is(controller(second.address), "c1"), 30, "c1 to take over")
        async with grpc.aio.insecure_channel(second.address) as channel:
            described = await admin_pb2_grpc.AdminStub(channel).DescribeTopics(
                admin_pb2.DescribeTopicsRequest(names=["keep"])
            )
            assert len(described.topics[0].partitions) == 6
            cluster = await cluster_pb2_grpc.ClusterStub(channel).DescribeCluster(
                cluster_pb2.DescribeClusterRequest()
            )
            assert [c.id for c in cluster.coordinators] == ["c1"]
            assert [b.broker_id for b in cluster.brokers] == [1, 2, 3]

    asyncio.run(run())


async def _is(value: object, expected: str) -> bool:
    return await value == expected  # type: ignore[misc]
