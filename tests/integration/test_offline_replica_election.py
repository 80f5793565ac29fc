"""A broker process whose partition log goes offline (a reset that failed
part-way) lists it in its etcd registration, and the coordinator process's
controller then never elects that replica, even where an unclean election
would have picked it: the partition waits, leaderless, and the broker's
restart (which recovers the log) lets it lead.

Before, the controller knew nothing of offline logs: it elected the offline
replica, which could not take the leader role (its log answers
STORAGE_ERROR), and the partition stayed unavailable until that broker
restarted, while the cluster said it had a leader.

Real etcd, a real coordinator and three real brokers. The follower's log
goes offline through the real path: it was away while the leader's log
start moved past its log end (DeleteRecords), so when it fetches again it
resets its log to the leader's log start; a directory stands where the reset
writes its commit point (`reset-offset`'s temporary file), so that write
fails with IsADirectoryError, as a full or failing disk would (the tests
run as root, so permissions would not stop it). The directory is made
while the follower is frozen (SIGSTOP), its log open: opening the log
would trip over it instead.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from tidelog import AdminClient, NewTopic, Producer, TopicPartition
from tidelog.v1 import log_pb2, log_pb2_grpc
from tidelog_server.etcd import connect
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import BrokerRegistration, PartitionState

from tests.support.cluster import ClusterProcesses, start_cluster
from tests.support.etcd import EtcdProcess
from tests.support.polling import read_until
from tests.support.processes import BrokerProcess

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

TOPIC = "fragile"
RECORDS = 20
#: Generous: bounds a broken test only.
DEADLINE_S = 60.0

T = TypeVar("T")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterProcesses]:
    etcd = EtcdProcess.start(tmp_path / "etcd")
    try:
        with start_cluster(tmp_path / "cluster", etcd=etcd, brokers=3) as processes:
            yield processes
    finally:
        etcd.stop()


def read_etcd(cluster: ClusterProcesses, key: Callable[[Keys], bytes]) -> bytes | None:
    async def read() -> bytes | None:
        client = connect(cluster.etcd.endpoint)
        try:
            got = await client.get(key(Keys(cluster.prefix)))
            return None if got is None else bytes(got.value)
        finally:
            await client.close()

    return asyncio.run(read())


def partition_state(cluster: ClusterProcesses) -> PartitionState:
    value = read_etcd(cluster, lambda keys: keys.partition_state(TOPIC, 0))
    assert value is not None
    return PartitionState.decode(value)


def offline_listed(cluster: ClusterProcesses, broker_id: int) -> tuple[tuple[str, int], ...]:
    value = read_etcd(cluster, lambda keys: keys.broker(broker_id))
    return () if value is None else BrokerRegistration.decode(value).offline_partitions


def eventually(read: Callable[[], T], check: Callable[[T], bool], what: str) -> T:
    return read_until(read, check, what, DEADLINE_S)


@dataclass(frozen=True)
class OfflineFollower:
    leader: BrokerProcess
    follower: BrokerProcess
    other: BrokerProcess
    #: The directory that fails the follower's reset (remove it to heal).
    fault: Path


def take_a_follower_log_offline(cluster: ClusterProcesses) -> OfflineFollower:
    """Create TOPIC (one partition, three replicas, unclean election on) and
    make a follower's reset fail part-way (module doc); returns once that
    follower lists its log offline in its registration."""
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 3, {"unclean.leader.election.enable": "true"})])
    state = eventually(
        lambda: partition_state(cluster), lambda s: len(s.isr) == 3, "all replicas in sync"
    )
    by_id = {b.broker_id: b for b in cluster.brokers}
    leader = by_id[state.leader]
    follower, other = (by_id[b] for b in sorted(by_id) if b != state.leader)

    # The follower freezes (its log open) and its lease expires; meanwhile
    # the leader's log start passes the follower's log end.
    os.kill(follower.pid, signal.SIGSTOP)
    try:
        with Producer(cluster.bootstrap, acks="all") as producer:
            for i in range(RECORDS):
                producer.send(TOPIC, b"%d" % i).get(timeout=DEADLINE_S)
        eventually(
            lambda: partition_state(cluster),
            lambda s: follower.broker_id not in s.isr,
            "the frozen follower out of the ISR",
        )
        with AdminClient(cluster.bootstrap) as admin:
            tp = TopicPartition(TOPIC, 0)
            assert admin.delete_records({tp: RECORDS}) == {tp: RECORDS}
        # Where its reset will write its commit point.
        fault = follower.data_dir / f"{TOPIC}-0" / "reset-offset.tmp"
        fault.mkdir()
    finally:
        os.kill(follower.pid, signal.SIGCONT)
    # It registers again, fetches, is told to reset, and the reset fails.
    listed = eventually(
        lambda: offline_listed(cluster, follower.broker_id),
        bool,
        f"broker {follower.broker_id} lists its offline log",
    )
    assert listed == ((TOPIC, 0),)
    return OfflineFollower(leader, follower, other, fault)


def test_an_offline_replica_is_not_elected_and_leads_after_its_restart(
    cluster: ClusterProcesses,
) -> None:
    taken = take_a_follower_log_offline(cluster)
    leader, follower, other, fault = taken.leader, taken.follower, taken.other, taken.fault

    # Only the leader is in sync; it dies. The only live replica is the
    # offline one: an unclean election would pick it, the controller must not.
    other.stop()
    eventually(
        lambda: partition_state(cluster),
        lambda s: s.isr == (leader.broker_id,),
        "the ISR is the leader alone",
    )
    leader.kill()
    fenced = eventually(
        lambda: partition_state(cluster),
        lambda s: s.leader != leader.broker_id,
        "the dead leader replaced or fenced",
    )
    assert fenced.leader == -1, f"elected {fenced.leader}, whose log is offline"
    assert fenced.isr == (leader.broker_id,)

    # Disk fixed, broker restarted: its log opens whole, it lists nothing
    # offline, and the unclean election lets it lead.
    follower.stop()
    fault.rmdir()
    follower.spawn()
    eventually(
        lambda: partition_state(cluster),
        lambda s: s.leader == follower.broker_id,
        f"broker {follower.broker_id} leads after its restart",
    )
    assert offline_listed(cluster, follower.broker_id) == ()


def offline_in_metadata(address: str) -> list[int]:
    """TOPIC-0's offline replicas in the Metadata answer of `address`."""
    with grpc.insecure_channel(address) as channel:
        answer = log_pb2_grpc.LogStub(channel).Metadata(
            log_pb2.MetadataRequest(topics=[TOPIC]), timeout=DEADLINE_S
        )
    return list(answer.topics[0].partitions[0].offline_replicas)


def describe_cli(cluster: ClusterProcesses, *flags: str) -> list[list[str]]:
    """The rows (cells split on spaces) `tidelog topics describe TOPIC` prints."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidelog.cli",
            "topics",
            "describe",
            TOPIC,
            *flags,
            "--bootstrap-server",
            cluster.bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert result.returncode == 0, result.stderr
    return [line.split() for line in result.stdout.splitlines()[1:]]


def test_metadata_and_describe_show_the_offline_replica(
    cluster: ClusterProcesses, tmp_path: Path
) -> None:
    """Where a Kafka operator looks: Metadata's offline_replicas (every
    broker's and the gateway's), AdminClient.describe_topics and `tidelog
    topics describe` (Kafka's "Offline:"); gone after the broker's restart."""
    gateway = cluster.add_gateway(tmp_path / "gw")
    taken = take_a_follower_log_offline(cluster)
    offline_id = taken.follower.broker_id
    addresses = [b.address for b in cluster.brokers] + [gateway.address]
    for address in addresses:
        eventually(
            lambda a=address: offline_in_metadata(a),  # type: ignore[misc]
            lambda got: got == [offline_id],
            f"Metadata from {address} lists broker {offline_id}'s replica offline",
        )
    with AdminClient(cluster.bootstrap) as admin:
        (described,) = admin.describe_topics([TOPIC])
    (info,) = described.partitions
    assert info.offline_replicas == [offline_id]
    assert offline_id in info.replicas and offline_id not in info.isr

    header, row = describe_cli(cluster)
    assert header[-1] == "offline" and row[-1] == str(offline_id)
    (_, under) = describe_cli(cluster, "--under-replicated-partitions")
    assert under[0] == "0"

    # Disk fixed, broker restarted: nothing offline any more.
    taken.follower.stop()
    taken.fault.rmdir()
    taken.follower.spawn()
    for address in addresses:
        eventually(
            lambda a=address: offline_in_metadata(a),  # type: ignore[misc]
            lambda got: got == [],
            f"Metadata from {address} lists nothing offline after the restart",
        )
    with AdminClient(cluster.bootstrap) as admin:
        assert admin.describe_topics([TOPIC])[0].partitions[0].offline_replicas == []
    header, _ = describe_cli(cluster)
    assert "offline" not in header
