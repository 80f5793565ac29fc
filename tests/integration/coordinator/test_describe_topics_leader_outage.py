"""DescribeTopics while a partition's leader cannot tell its figures, and
Metadata's auto-creation while no coordinator answers, on a real cluster
(etcd, a coordinator, brokers and a gateway as processes).

A broker and the gateway answer DescribeTopics from the coordinator's
placement and ask each leader for its log figures. A partition whose leader
was stopped, or refused the call, kept its figures at 0, as if its log were
empty, with nothing to tell it from a real answer. It now has an error
naming the leader and what happened, and -1 figures; the other partitions
keep their real figures and the topic stays good. A stopped leader that was
the partition's only replica leaves it offline (no replica can lead it), as
its error says. A leader whose log is
offline answered 0s for it, copied as figures; its STORAGE_ERROR is now
passed on. A broker that could not auto-create a topic answered only "does
not exist"."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from functools import partial
from pathlib import Path

import grpc
import grpc.aio
import pytest
from tidelog import AdminClient, AsyncAdminClient, NewTopic, Producer
from tidelog.errors import (
    ERROR_CODE_METADATA_KEY,
    NotLeaderOrFollowerError,
    StorageError,
    TopicAuthorizationFailedError,
)
from tidelog.types import PartitionInfo
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2, log_pb2, log_pb2_grpc
from tidelog_broker.config import BrokerConfig
from tidelog_broker.server import BrokerServer
from tidelog_broker.storage import files
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import BrokerRegistration

from tests.integration.coordinator.helpers import etcd_client, eventually
from tests.support.cluster import PRODUCE_TIMEOUT_S, ClusterProcesses, running_cluster
from tests.support.etcd import EtcdProcess
from tests.support.in_process_server import serving

pytestmark = pytest.mark.timeout(180)

TOPIC = "described"
#: Generous: a cluster settling on a loaded 2-core machine.
SETTLE_S = 60.0
#: The stand-in broker's id: not one a real broker of the cluster has.
STAND_IN = 7
#: Partition 1 once its leader, its only replica, stopped.
STOPPED_LEADER_SAID = (
    f"{TOPIC}-1 is offline: no in-sync replica can serve (broker 1: down (not registered)) "
    "and no other replica can either, so it has no leader until one of them is back: start "
    'broker 1 again (see docs/operations.md, "Is the cluster healthy?"); its log figures are '
    "unknown"
)


def _figures(p: PartitionInfo | admin_pb2.PartitionDescription) -> tuple[int, ...]:
    return (p.log_start_offset, p.log_end_offset, p.high_watermark, p.size_bytes, p.segment_count)


def _partitions(entry: str) -> list[PartitionInfo]:
    with AdminClient(bootstrap_servers=entry) as admin:
        (topic,) = admin.describe_topics([TOPIC])
    return sorted(topic.partitions, key=lambda p: p.partition)


async def _partitions_async(entry: str) -> list[PartitionInfo]:
    async with AsyncAdminClient(bootstrap_servers=entry) as admin:
        (topic,) = await admin.describe_topics([TOPIC])
    return sorted(topic.partitions, key=lambda p: p.partition)


def test_a_stopped_leader_s_partition_is_described_with_an_error_naming_it(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    with running_cluster(tmp_path, etcd=etcd, prefix=prefix, brokers=2, gateway_args=[]) as cluster:
        with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(TOPIC, -1, -1, replica_assignments={0: [0], 1: [1]})])
        with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
            for partition, count in ((0, 3), (1, 2)):
                for _ in range(count):
                    producer.send(TOPIC, b"v", partition=partition).get(PRODUCE_TIMEOUT_S)
        entries = [cluster.brokers[0].address, cluster.gateways[0].address]
        for entry in entries:
            p0, p1 = _partitions(entry)
            assert (p0.error, p1.error) == (None, None), (entry, p0, p1)
            assert (p0.log_end_offset, p1.log_end_offset) == (3, 2), entry

        cluster.brokers[1].stop()

        for entry in entries:
            for describe in (_partitions, lambda e: asyncio.run(_partitions_async(e))):
                p0, p1 = _described_without(describe, entry, cluster)
                # The live leader's partition: its real figures.
                assert p0.error is None, p0
                assert (p0.log_start_offset, p0.log_end_offset, p0.high_watermark) == (0, 3, 3)
                assert p0.size_bytes > 0 and p0.segment_count >= 1, p0
                # The stopped leader's: unknown, and why, naming broker 1.
                # Its only replica: the partition is offline until broker 1
                # is back (retriable: its restart elects it).
                assert isinstance(p1.error, NotLeaderOrFollowerError), p1
                assert p1.error.retriable
                assert p1.error.message == STOPPED_LEADER_SAID, p1.error.message
                assert _figures(p1) == (-1, -1, -1, -1, -1)
        # The CLI: "?" for the unknown figures, and why, under the table.
        shown = subprocess.run(
            [sys.executable, "-m", "tidelog.cli", "topics", "describe", TOPIC,
             "--bootstrap-server", cluster.brokers[0].address],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        rows = {line.split()[0]: line.split() for line in shown.stdout.splitlines()[2:4]}
        # The offline column: broker 1 is down, so its replica cannot serve.
        assert rows["0"][4:6] == ["0", "3"] and rows["0"][-1] == "-", shown.stdout
        assert rows["1"][4:8] == ["?"] * 4 and rows["1"][-1] == "1", shown.stdout
        # Its leader: none (kafka-topics' "Leader: none"), not -1.
        assert (rows["0"][1], rows["1"][1]) == ("0", "none"), shown.stdout
        assert f"partition 1: ? = offline: {STOPPED_LEADER_SAID}" in shown.stdout, shown.stdout


def _described_without(
    describe: object, entry: str, cluster: ClusterProcesses
) -> list[PartitionInfo]:
    """The description once the stopped leader is out of the answering
    service's view (until then, a call to it may still be on its way)."""
    last: list[PartitionInfo] = []

    async def settled() -> bool:
        nonlocal last
        last = await asyncio.to_thread(describe, entry)  # type: ignore[arg-type]
        # Meanwhile it may be described with the failed call to broker 1.
        error = last[1].error
        return error is not None and error.message.startswith(f"{TOPIC}-1 is offline")

    asyncio.run(eventually(settled, SETTLE_S, f"partition 1 described offline via {entry}"))
    return last


class RefusingStandIn(admin_pb2_grpc.AdminServicer):
    """A leader that refuses DescribeTopics as a broker refuses a caller
    not authorized to describe the topic."""

    def __init__(self) -> None:
        self.calls = 0

    async def DescribeTopics(
        self, request: admin_pb2.DescribeTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeTopicsResponse:
        self.calls += 1
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"not authorized to describe {TOPIC!r}",
            trailing_metadata=((ERROR_CODE_METADATA_KEY, "TOPIC_AUTHORIZATION_FAILED"),),
        )
        raise AssertionError("abort returned")


def test_a_leader_that_refuses_is_named_with_its_code(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    """Broker 7, a stand-in over real gRPC registered in etcd as a live
    broker, leads partition 1 and refuses the call for its figures."""
    with running_cluster(tmp_path, etcd=etcd, prefix=prefix, brokers=1, gateway_args=[]) as cluster:
        stand_in = RefusingStandIn()

        async def scenario() -> None:
            async with (
                serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, stand_in)) as address,
                etcd_client(etcd.endpoint) as client,
            ):
                lease = await client.lease(120)
                registration = BrokerRegistration(STAND_IN, "127.0.0.1", int(address.split(":")[1]))
                await client.put(Keys(prefix).broker(STAND_IN), registration.encode(), lease=lease)
                try:
                    await _refused_leader_is_named(cluster, address)
                finally:
                    await client.revoke_lease(lease.id)

        asyncio.run(scenario())
        assert stand_in.calls >= 2


async def _create_led_by_stand_in(broker: str) -> None:
    """TOPIC with partition 0 on broker 0 and partition 1 on the stand-in."""
    assignment = [
        admin_pb2.ReplicaAssignment(partition=0, broker_ids=[0]),
        admin_pb2.ReplicaAssignment(partition=1, broker_ids=[STAND_IN]),
    ]

    async def created() -> bool:
        async with grpc.aio.insecure_channel(broker) as channel:
            answer = await admin_pb2_grpc.AdminStub(channel).CreateTopics(
                admin_pb2.CreateTopicsRequest(
                    topics=[admin_pb2.NewTopic(name=TOPIC, replica_assignment=assignment)]
                ),
                timeout=10,
            )
        code = answer.topics[0].error.code
        assert code in (common_pb2.NONE, common_pb2.TOPIC_ALREADY_EXISTS), answer
        return True

    # Until every service's view has the stand-in as a live broker.
    await eventually(created, SETTLE_S, "the topic created")


async def _refused_leader_is_named(cluster: ClusterProcesses, address: str) -> None:
    broker, gateway = cluster.brokers[0].address, cluster.gateways[0].address
    await _create_led_by_stand_in(broker)
    for entry in (broker, gateway):
        described: admin_pb2.TopicDescription | None = None

        async def answered(entry: str = entry) -> bool:
            nonlocal described
            async with grpc.aio.insecure_channel(entry) as channel:
                answer = await admin_pb2_grpc.AdminStub(channel).DescribeTopics(
                    admin_pb2.DescribeTopicsRequest(names=[TOPIC]), timeout=10
                )
            described = answer.topics[0]
            p0, p1 = described.partitions
            # Broker 0 has opened its partition, and the stand-in was asked.
            return not p0.HasField("error") and "refused" in p1.error.message

        await eventually(answered, SETTLE_S, f"the refusal described via {entry}")
        assert described is not None and not described.HasField("error"), described
        p0, p1 = described.partitions
        assert _figures(p0)[:3] == (0, 0, 0) and p0.segment_count >= 1, p0
        assert p1.leader_id == STAND_IN
        assert p1.error.code == common_pb2.TOPIC_AUTHORIZATION_FAILED, p1
        assert p1.error.message == (
            f"{TOPIC}-1: leader broker {STAND_IN} at {address} refused the call "
            f"(TOPIC_AUTHORIZATION_FAILED: not authorized to describe {TOPIC!r}): "
            "its log figures are unknown"
        )
        assert _figures(p1) == (-1, -1, -1, -1, -1)
        # The SDK: the partition's typed error, the call itself does not raise.
        p0_sdk, p1_sdk = await _partitions_async(entry)
        assert p0_sdk.error is None
        assert isinstance(p1_sdk.error, TopicAuthorizationFailedError), p1_sdk
        assert p1_sdk.error.message == p1.error.message
        assert _figures(p1_sdk) == (-1, -1, -1, -1, -1)


def test_a_leader_whose_log_is_offline_is_described_with_its_storage_error(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    """Broker 7, a real broker (alone, in this process, over real gRPC)
    registered in etcd as a live broker, leads partition 1 while its log of
    it could not be opened: as a leader whose log has just gone offline, until
    its registration lists it and the controller moves the leadership. It
    answered 0s for that log, copied as figures: an empty log. Now its
    STORAGE_ERROR, passed on with -1 figures."""
    with running_cluster(tmp_path, etcd=etcd, prefix=prefix, brokers=1, gateway_args=[]) as cluster:
        config = BrokerConfig(broker_id=STAND_IN, port=0, data_dir=tmp_path / "stand-in")

        async def scenario() -> None:
            stand_in = BrokerServer(config)
            await stand_in.start()
            stand_in.manager.logs.create_topic(TOPIC, 2)
            await stand_in.stop()
            log_dir = config.data_dir / files.log_dir_name(TOPIC, 1)
            (log_dir / files.RESET_OFFSET_FILE).write_text("not a checkpoint\n")
            stand_in = BrokerServer(config)
            await stand_in.start()
            try:
                assert stand_in.manager.logs.offline_partitions() == [(TOPIC, 1)]
                async with etcd_client(etcd.endpoint) as client:
                    lease = await client.lease(120)
                    registration = BrokerRegistration(STAND_IN, "127.0.0.1", stand_in.bound_port)
                    await client.put(
                        Keys(prefix).broker(STAND_IN), registration.encode(), lease=lease
                    )
                    try:
                        await _offline_leader_is_described(cluster)
                    finally:
                        await client.revoke_lease(lease.id)
            finally:
                await stand_in.stop()

        asyncio.run(scenario())


async def _offline_leader_is_described(cluster: ClusterProcesses) -> None:
    broker, gateway = cluster.brokers[0].address, cluster.gateways[0].address
    await _create_led_by_stand_in(broker)
    said = f"the log of {TOPIC}-1 on broker {STAND_IN} is offline (opening it failed: "
    for entry in (broker, gateway):
        partitions: list[PartitionInfo] = []

        async def described(entry: str = entry) -> bool:
            nonlocal partitions
            partitions = await _partitions_async(entry)
            return partitions[0].error is None and isinstance(partitions[1].error, StorageError)

        await eventually(described, SETTLE_S, f"the offline log described via {entry}")
        p0, p1 = partitions
        assert p0.segment_count >= 1 and p1.leader == STAND_IN
        assert p1.error is not None and p1.error.message.startswith(said), p1.error
        assert _figures(p1) == (-1, -1, -1, -1, -1)
    # The CLI: "?" for the figures, and that the log is offline, under the table.
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tidelog.cli", "topics", "describe", TOPIC,
         "--bootstrap-server", broker],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    row = next(line.split() for line in shown.stdout.splitlines() if line.split()[:1] == ["1"])
    assert row[4:8] == ["?"] * 4, shown.stdout
    assert f"partition 1: ? = offline: {said}" in shown.stdout, shown.stdout


def test_a_topic_a_broker_could_not_auto_create_says_why(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    # The broker answered "topic 'new' does not exist", as if it had not tried.
    with running_cluster(
        tmp_path, etcd=etcd, prefix=prefix, brokers=1, broker_args=["--auto-create-topics"]
    ) as cluster:
        cluster.coordinators[0].stop()
        reply: log_pb2.TopicMetadata | None = None

        async def said_why() -> bool:
            nonlocal reply
            async with grpc.aio.insecure_channel(cluster.brokers[0].address) as channel:
                answer = await log_pb2_grpc.LogStub(channel).Metadata(
                    log_pb2.MetadataRequest(topics=["new"], allow_auto_topic_creation=True),
                    timeout=20,
                )
            reply = answer.topics[0]
            return "was not auto-created" in reply.error.message

        asyncio.run(eventually(said_why, SETTLE_S, "Metadata saying why 'new' was not created"))
        assert reply is not None
        assert reply.error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION, reply
        assert reply.error.message.startswith(
            "topic 'new' does not exist and was not auto-created: "
            "cannot forward CreateTopics to a coordinator: "
        ), reply.error.message
        assert reply.error.message.endswith("; retry"), reply.error.message
