"""Who asks the leaders for DescribeTopics' log figures, and within what
deadline, on a real cluster (etcd, a coordinator, brokers and a gateway as
processes; stand-in leaders over real gRPC registered in etcd).

A coordinator called directly answered its placement with every figure at
0 and no error, as if each log were empty: it now asks each leader, as a
broker and the gateway do, and a partition whose leader cannot tell gets an
error and -1 figures. A broker or the gateway forwarding DescribeTopics to
the coordinator asks the leaders itself and tells the coordinator not to
(`tidelog-local`): each leader is asked once per call."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import grpc
import grpc.aio
import pytest
from tidelog import AdminClient, NewTopic, Producer
from tidelog.errors import error_from_code
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import BrokerRegistration
from tidelog_server.forwarding import LOCAL_METADATA_KEY
from tidelog_server.leader_figures import ask_over_grpc, complete_from_leaders

from tests.integration.coordinator.helpers import etcd_client, eventually
from tests.support.cluster import PRODUCE_TIMEOUT_S, ClusterProcesses, running_cluster
from tests.support.etcd import EtcdProcess
from tests.support.in_process_server import serving

pytestmark = pytest.mark.timeout(180)

TOPIC = "figures"
#: Generous: a cluster settling on a loaded 2-core machine.
SETTLE_S = 60.0
#: Generous: the services answer at once; this only bounds a broken test.
CALL_S = 20.0
#: The stand-in broker's id: not one a real broker of the cluster has.
STAND_IN = 7
#: What the stand-in says of its partition.
STAND_IN_FIGURES = (2, 42, 40, 4096, 1)


def _figures(p: admin_pb2.PartitionDescription) -> tuple[int, ...]:
    return (p.log_start_offset, p.log_end_offset, p.high_watermark, p.size_bytes, p.segment_count)


async def _describe(
    address: str, timeout_s: float = CALL_S, local: bool = False
) -> list[admin_pb2.PartitionDescription]:
    async with grpc.aio.insecure_channel(address) as channel:
        answer = await admin_pb2_grpc.AdminStub(channel).DescribeTopics(
            admin_pb2.DescribeTopicsRequest(names=[TOPIC]),
            timeout=timeout_s,
            metadata=((LOCAL_METADATA_KEY, "1"),) if local else (),
        )
    (topic,) = answer.topics
    assert not topic.HasField("error"), topic
    return sorted(topic.partitions, key=lambda p: p.partition)


def test_a_client_calling_the_coordinator_gets_each_leader_s_figures(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    with running_cluster(tmp_path, etcd=etcd, prefix=prefix, brokers=2) as cluster:
        with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(TOPIC, -1, -1, replica_assignments={0: [0], 1: [1]})])
        with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
            for partition, count in ((0, 3), (1, 2)):
                for _ in range(count):
                    producer.send(TOPIC, b"v", partition=partition).get(PRODUCE_TIMEOUT_S)
        coordinator = cluster.coordinators[0].address

        p0, p1 = asyncio.run(_describe(coordinator))
        for p, end in ((p0, 3), (p1, 2)):
            assert not p.HasField("error"), p
            assert _figures(p)[:3] == (0, end, end), p
            assert p.size_bytes > 0 and p.segment_count >= 1, p
        # Asked as a broker or the gateway forwards it: the placement alone.
        placed = asyncio.run(_describe(coordinator, local=True))
        assert [_figures(p) for p in placed] == [(0, 0, 0, 0, 0)] * 2, placed
        assert [p.leader_id for p in placed] == [0, 1]

        cluster.brokers[1].stop()
        last: list[admin_pb2.PartitionDescription] = []

        async def p1_unknown() -> bool:
            nonlocal last
            last = await _describe(coordinator)
            # Meanwhile it may be described with the failed call to broker 1.
            return last[1].error.message.startswith(f"{TOPIC}-1 is offline")

        asyncio.run(eventually(p1_unknown, SETTLE_S, "partition 1 described offline"))
        p0, p1 = last
        assert not p0.HasField("error"), p0
        assert _figures(p0)[:3] == (0, 3, 3), p0
        # Broker 1 was its only replica: no replica can lead it until it is back.
        assert p1.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER, p1
        assert p1.error.message.startswith(
            f"{TOPIC}-1 is offline: no in-sync replica can serve (broker 1: down (not registered))"
        ), p1.error.message
        assert "start broker 1 again" in p1.error.message, p1.error.message
        assert _figures(p1) == (-1, -1, -1, -1, -1)


def test_a_broker_asked_for_its_own_logs_names_the_leader_it_knows_not_itself(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    # A broker answered its own logs with itself as leader_id for every
    # replica it hosts: a client asking a follower directly read the
    # follower's figures as the leader's.
    with running_cluster(tmp_path, etcd=etcd, prefix=prefix, brokers=2) as cluster:
        with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(TOPIC, -1, -1, replica_assignments={0: [0, 1]})])
        with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
            for _ in range(3):
                producer.send(TOPIC, b"v", partition=0).get(PRODUCE_TIMEOUT_S)
        leader, follower = (b.address for b in cluster.brokers)

        async def scenario() -> None:
            async def local_p0(address: str) -> admin_pb2.PartitionDescription:
                (p0,) = await _describe(address, local=True)
                return p0

            async def follower_caught_up() -> bool:
                # It has fetched the records: it applied its follower role.
                return (await local_p0(follower)).log_end_offset == 3

            await eventually(follower_caught_up, SETTLE_S, "broker 1 follows with 3 records")
            assert (await local_p0(follower)).leader_id == 0
            assert (await local_p0(leader)).leader_id == 0
            # The broker's full answer (not local) is the placement's, as before.
            (p0,) = await _describe(follower)
            assert (p0.leader_id, _figures(p0)[:3]) == (0, (0, 3, 3)), p0

            cluster.brokers[0].stop()

            async def follower_leads() -> bool:
                return (await local_p0(follower)).leader_id == 1

            # The controller elects broker 1 (in the ISR); it says so once it leads.
            await eventually(follower_leads, SETTLE_S, "broker 1 says it leads partition 0")

        asyncio.run(scenario())


def test_a_follower_a_stale_placement_names_leader_does_not_give_its_figures_as_the_leader_s(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    """complete_from_leaders took a partition's figures from whichever
    broker the caller's placement named as leader. With a placement lagging
    an election (the coordinator's or the gateway's view), a follower's
    figures were shown as the leader's, without an error. The stale
    placement here is a real one's shape, naming the follower, completed
    against the real brokers over real gRPC as every caller does."""
    with running_cluster(tmp_path, etcd=etcd, prefix=prefix, brokers=2) as cluster:
        with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(TOPIC, -1, -1, replica_assignments={0: [0, 1]})])
        with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
            for _ in range(3):
                producer.send(TOPIC, b"v", partition=0).get(PRODUCE_TIMEOUT_S)
        leader, follower = (b.address for b in cluster.brokers)
        addresses = {0: leader, 1: follower}

        async def scenario() -> None:
            async def follower_caught_up() -> bool:
                (p0,) = await _describe(follower, local=True)
                return (p0.leader_id, p0.log_end_offset) == (0, 3)

            await eventually(follower_caught_up, SETTLE_S, "broker 1 follows with 3 records")
            channels: list[grpc.aio.Channel] = []

            def stub_of(address: str) -> admin_pb2_grpc.AdminStub:
                channels.append(grpc.aio.insecure_channel(address))
                return admin_pb2_grpc.AdminStub(channels[-1])

            async def completed(placed_leader: int) -> admin_pb2.PartitionDescription:
                response = admin_pb2.DescribeTopicsResponse()
                response.topics.add(name=TOPIC).partitions.add(
                    partition=0, leader_id=placed_leader, replicas=[0, 1], isr=[0, 1]
                )
                await complete_from_leaders(response, addresses.get, ask_over_grpc(stub_of, CALL_S))
                (p0,) = response.topics[0].partitions
                return p0

            try:
                # The placement as it is: broker 0's figures.
                fresh = await completed(0)
                assert not fresh.HasField("error"), fresh
                assert _figures(fresh)[:3] == (0, 3, 3), fresh
                # A placement naming the follower: it answers as a follower of
                # broker 0, so its figures are not the leader's.
                stale = await completed(1)
                assert stale.leader_id == 1, stale  # the placement is not rewritten
                assert _figures(stale) == (-1, -1, -1, -1, -1), stale
                assert stale.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER, stale
                assert stale.error.message == (
                    f"{TOPIC}-0: broker 1 at {follower}, its leader as known here, does not "
                    "lead it by its own answer (it follows broker 0): the leadership moved, "
                    "or the broker has not taken it up yet; its log figures are unknown; retry"
                ), stale.error.message
                # As a client reads it: retriable, as for a leader that is down.
                assert error_from_code(stale.error.code, stale.error.message).retriable
            finally:
                for channel in channels:
                    await channel.close()

        asyncio.run(scenario())


class CountingLeader(admin_pb2_grpc.AdminServicer):
    """Broker STAND_IN answering DescribeTopics from "its own logs" for
    partition 1 of TOPIC (STAND_IN_FIGURES), counting the calls; `hangs`
    makes it never answer (until the caller's deadline cancels the call)."""

    def __init__(self) -> None:
        self.calls = 0
        self.hangs = False

    async def DescribeTopics(
        self, request: admin_pb2.DescribeTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeTopicsResponse:
        self.calls += 1
        if self.hangs:
            await asyncio.Event().wait()
        answer = admin_pb2.DescribeTopicsResponse()
        start, end, hw, size, segments = STAND_IN_FIGURES
        answer.topics.add(name=TOPIC).partitions.add(
            partition=1,
            leader_id=STAND_IN,
            log_start_offset=start,
            log_end_offset=end,
            high_watermark=hw,
            size_bytes=size,
            segment_count=segments,
        )
        return answer


@contextlib.asynccontextmanager
async def stand_in_leads_partition_1(
    cluster: ClusterProcesses, etcd: EtcdProcess, prefix: str, leader: CountingLeader
) -> AsyncIterator[str]:
    """TOPIC created with partition 0 on broker 0 and partition 1 on the
    stand-in `leader` (registered in etcd as broker STAND_IN), once every
    service describes partition 1 with its figures; its address."""
    async with (
        serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, leader)) as address,
        etcd_client(etcd.endpoint) as client,
    ):
        lease = await client.lease(120)
        registration = BrokerRegistration(STAND_IN, "127.0.0.1", int(address.split(":")[1]))
        await client.put(Keys(prefix).broker(STAND_IN), registration.encode(), lease=lease)
        try:
            assignment = [
                admin_pb2.ReplicaAssignment(partition=0, broker_ids=[0]),
                admin_pb2.ReplicaAssignment(partition=1, broker_ids=[STAND_IN]),
            ]

            async def created() -> bool:
                async with grpc.aio.insecure_channel(cluster.brokers[0].address) as channel:
                    answer = await admin_pb2_grpc.AdminStub(channel).CreateTopics(
                        admin_pb2.CreateTopicsRequest(
                            topics=[admin_pb2.NewTopic(name=TOPIC, replica_assignment=assignment)]
                        ),
                        timeout=CALL_S,
                    )
                code = answer.topics[0].error.code
                return code in (common_pb2.NONE, common_pb2.TOPIC_ALREADY_EXISTS)

            # Until the coordinator's view has the stand-in as a live broker.
            await eventually(created, SETTLE_S, "the topic created")
            for entry in _entries(cluster):

                async def described(entry: str = entry) -> bool:
                    p0, p1 = await _describe(entry)
                    return not p0.HasField("error") and _figures(p1) == STAND_IN_FIGURES

                await eventually(described, SETTLE_S, f"the stand-in's figures via {entry}")
            yield address
        finally:
            await client.revoke_lease(lease.id)


def _entries(cluster: ClusterProcesses) -> list[str]:
    """The coordinator, a broker and the gateway."""
    return [
        cluster.coordinators[0].address,
        cluster.brokers[0].address,
        cluster.gateways[0].address,
    ]


def test_each_leader_is_asked_once_per_call_whoever_is_called(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    # A broker or the gateway forwarding the call asks the leaders itself:
    # the coordinator it forwards to must not ask them again.
    with running_cluster(tmp_path, etcd=etcd, prefix=prefix, brokers=1, gateway_args=[]) as cluster:
        leader = CountingLeader()

        async def scenario() -> None:
            async with stand_in_leads_partition_1(cluster, etcd, prefix, leader):
                for entry in _entries(cluster):
                    before = leader.calls
                    p0, p1 = await _describe(entry)
                    assert leader.calls - before == 1, entry
                    assert not p0.HasField("error") and p0.segment_count >= 1, (entry, p0)
                    assert not p1.HasField("error"), (entry, p1)
                    assert _figures(p1) == STAND_IN_FIGURES, (entry, p1)

        asyncio.run(scenario())


#: A client's deadline shorter than a broker's 5 s for each leader (and the
#: coordinator's 10 s, the gateway's 30 s).
SHORT_DEADLINE_S = 2.0


def test_a_hanging_leader_costs_its_partitions_within_the_client_s_deadline(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    # A broker waited 5 s for the leader whatever the client's deadline: a
    # client with 2 s got DEADLINE_EXCEEDED for the whole call.
    with running_cluster(tmp_path, etcd=etcd, prefix=prefix, brokers=1, gateway_args=[]) as cluster:
        leader = CountingLeader()

        async def scenario() -> None:
            async with stand_in_leads_partition_1(cluster, etcd, prefix, leader) as address:
                leader.hangs = True
                for entry in _entries(cluster):
                    p0, p1 = await _describe(entry, timeout_s=SHORT_DEADLINE_S)
                    assert not p0.HasField("error") and p0.segment_count >= 1, (entry, p0)
                    assert p1.error.code == common_pb2.REQUEST_TIMED_OUT, (entry, p1)
                    assert p1.error.message == (
                        f"{TOPIC}-1: leader broker {STAND_IN} at {address} did not answer in "
                        "time (DEADLINE_EXCEEDED): its log figures are unknown; retry"
                    ), entry
                    assert _figures(p1) == (-1, -1, -1, -1, -1), entry

        asyncio.run(scenario())
