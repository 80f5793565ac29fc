"""The services on a three-member etcd cluster, one member SIGKILLed.

Real processes: three etcd members, a coordinator, three brokers and a
gateway, each given every member (`--etcd m0,m1,m2`). They all use the
first member until it dies; killing it must not cost a broker or the
coordinator its lease (the registration keys keep their lease and create
revision, so nobody re-registered), and through the gateway a topic can
still be created and produced to with acks=all, and a group still commits
offsets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tidelog import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tidelog_server.etcd import connect
from tidelog_server.etcd.keys import Keys

from tests.support.cluster import BROKER_SESSION_TTL_S, ClusterProcesses, start_cluster
from tests.support.etcd import EtcdCluster
from tests.support.gateway import GatewayProcess, start_gateway

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

DEADLINE_S = 60.0


@pytest.fixture
def etcd3(tmp_path: Path) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster.start(tmp_path / "etcd", members=3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster(etcd3: EtcdCluster, tmp_path: Path) -> Iterator[ClusterProcesses]:
    processes = start_cluster(tmp_path / "cluster", etcd=etcd3, brokers=3)
    try:
        yield processes
    finally:
        processes.stop()


@pytest.fixture
def gateway(cluster: ClusterProcesses, tmp_path: Path) -> Iterator[GatewayProcess]:
    process = start_gateway(cluster.etcd.endpoint, tmp_path / "gateway", prefix=cluster.prefix)
    try:
        yield process
    finally:
        process.stop()


def registrations(endpoints: str, prefix: str) -> dict[bytes, tuple[int, int]]:
    """key -> (lease, create revision) of every broker and coordinator."""
    keys = Keys(prefix)

    async def read() -> dict[bytes, tuple[int, int]]:
        client = connect(endpoints)
        try:
            out = {}
            for under in (keys.brokers, keys.coordinators):
                for kv in await client.get_prefix(under):
                    out[bytes(kv.key)] = (kv.lease, kv.create_revision)
            return out
        finally:
            await client.close()

    return asyncio.run(read())


def test_services_keep_their_leases_and_serve_when_an_etcd_member_dies(
    etcd3: EtcdCluster, cluster: ClusterProcesses, gateway: GatewayProcess
) -> None:
    before = registrations(etcd3.endpoint, cluster.prefix)
    assert len(before) == 4, before  # three brokers, one coordinator

    # The member every service uses, and the raft leader: the harder case
    # (the survivors elect a new leader while the services fail over).
    etcd3.make_leader(0)
    etcd3.kill(0)
    # Several session TTLs: a keep-alive that stayed on the dead member
    # would have let its lease expire by now.
    time.sleep(BROKER_SESSION_TTL_S * 3)
    alive = ",".join(m.endpoint for m in etcd3.members[1:])
    assert registrations(alive, cluster.prefix) == before

    topic, group = "after-member-death", "group-after-member-death"
    with AdminClient(gateway.address, request_timeout_ms=int(DEADLINE_S * 1000)) as admin:
        admin.create_topics([NewTopic(topic, 3, 3, topic_configs={"min.insync.replicas": "2"})])
    with Producer(gateway.address, acks="all") as producer:
        futures = [producer.send(topic, b"v%d" % i, key=b"k%d" % i) for i in range(300)]
        producer.flush()
        for future in futures:
            future.get(timeout=DEADLINE_S)

    with Consumer(
        topic, bootstrap_servers=gateway.address, group_id=group, enable_auto_commit=False
    ) as consumer:
        got = 0
        deadline = time.monotonic() + DEADLINE_S
        while got < 300 and time.monotonic() < deadline:
            got += sum(len(r) for r in consumer.poll(timeout_ms=500).values())
        assert got == 300
        consumer.commit()
    with AdminClient(gateway.address) as admin:
        committed = admin.list_consumer_group_offsets(group)
    assert sum(o.offset for o in committed.values()) == 300
    assert set(committed) == {TopicPartition(topic, p) for p in range(3)}
