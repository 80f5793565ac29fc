"""Adding partitions, deleting records and electing preferred leaders
(issue 13), on a real cluster: etcd, a coordinator and three brokers as
processes, driven through the SDK's AdminClient as a user would.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tidelog import AdminClient, Consumer, NewPartitions, NewTopic, Producer, TopicPartition
from tidelog.errors import (
    ElectionNotNeededError,
    InvalidPartitionsError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    PreferredLeaderNotAvailableError,
)

from tests.integration.coordinator.admin_support import (
    admin_client,
    local_partition,
    partition,
    running_admin_cluster,
    wait_until,
)
from tests.support.cluster import ClusterProcesses
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterProcesses]:
    with running_admin_cluster(
        etcd, tmp_path_factory.mktemp("partition-admin"), "/partition-admin"
    ) as processes:
        yield processes


@pytest.fixture
def admin(cluster: ClusterProcesses) -> Iterator[AdminClient]:
    with admin_client(cluster) as client:
        yield client


# ---------------------------------------------------------------- create_partitions


def test_create_partitions_grows_a_topic_and_producers_and_groups_use_the_new_ones(
    cluster: ClusterProcesses, admin: AdminClient
) -> None:
    topic = "grow"
    admin.create_topics([NewTopic(topic, 2, 2)])
    with Consumer(
        topic,
        group_id="grow-group",
        bootstrap_servers=cluster.bootstrap,
        metadata_max_age_ms=500,
    ) as consumer:
        wait_until(
            lambda: (consumer.poll(timeout_ms=100), len(consumer.assignment()) == 2)[1],
            "the member owns both partitions",
        )
        assert admin.create_partitions({topic: NewPartitions(4)}) == {topic: None}
        described = admin.describe_topics([topic])[0]
        assert [p.partition for p in described.partitions] == [0, 1, 2, 3]
        assert all(len(p.replicas) == 2 for p in described.partitions)
        wait_until(
            lambda: all(p.leader >= 0 for p in partition_list(admin, topic)),
            "every new partition has a leader",
        )
        # Keyed records now spread over four partitions: a producer that
        # refreshes its metadata sends to the new ones too.
        with Producer(bootstrap_servers=cluster.bootstrap, metadata_max_age_ms=500) as producer:

            def lands_in_new_partitions() -> bool:
                used = {
                    producer.send(topic, b"v", key=f"k{i}".encode()).get(timeout=30).partition
                    for i in range(40)
                }
                return bool(used & {2, 3})

            wait_until(lands_in_new_partitions, "keyed records reach partitions 2 and 3")
        # The group's member is given the new partitions (a rebalance).
        wait_until(
            lambda: (consumer.poll(timeout_ms=100), len(consumer.assignment()) == 4)[1],
            "the member owns the four partitions",
        )


def partition_list(admin: AdminClient, topic: str):  # type: ignore[no-untyped-def]
    return admin.describe_topics([topic])[0].partitions


def test_create_partitions_refuses_a_smaller_or_equal_count(admin: AdminClient) -> None:
    topic = "no-shrink"
    admin.create_topics([NewTopic(topic, 3, 1)])
    for count in (2, 3):
        with pytest.raises(InvalidPartitionsError, match="can only grow"):
            admin.create_partitions({topic: count})
    assert len(partition_list(admin, topic)) == 3


def test_create_partitions_with_an_assignment_places_them_as_given(admin: AdminClient) -> None:
    topic = "grow-assigned"
    admin.create_topics([NewTopic(topic, 1, 2)])
    admin.create_partitions({topic: NewPartitions(3, [[2, 0], [1, 2]])})
    parts = partition_list(admin, topic)
    assert [p.replicas for p in parts[1:]] == [[2, 0], [1, 2]]
    with pytest.raises(InvalidRequestError, match="replication factor is 2"):
        admin.create_partitions({topic: NewPartitions(4, [[0]])})
    with pytest.raises(InvalidRequestError, match="not a live broker"):
        admin.create_partitions({topic: NewPartitions(4, [[0, 7]])})
    assert len(partition_list(admin, topic)) == 3


# ---------------------------------------------------------------- delete_records


def test_delete_records_moves_the_log_start_on_every_replica_durably(
    cluster: ClusterProcesses, admin: AdminClient
) -> None:
    topic = "trim"
    tp = TopicPartition(topic, 0)
    admin.create_topics([NewTopic(topic, 1, 3, topic_configs={"segment.bytes": "4096"})])
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=0) as producer:
        for _ in range(300):
            producer.send(topic, b"x" * 100, partition=0).get(timeout=30)
    before = partition(admin, tp)
    assert before.high_watermark == 300 and before.segment_count > 3

    assert admin.delete_records({tp: 150}) == {tp: 150}
    after = partition(admin, tp)
    assert after.log_start_offset == 150
    assert after.segment_count < before.segment_count  # whole segments below 150 went
    # Followers follow the leader's log start offset.
    for broker in cluster.brokers:
        wait_until(
            lambda b=broker: (local_partition(b.address, tp) or before).log_start_offset == 150,
            f"broker {broker.broker_id} moves its log start to 150",
        )
    # A read below it is out of range; the earliest offset is 150.
    with Consumer(
        bootstrap_servers=cluster.bootstrap, auto_offset_reset="none", consumer_timeout_ms=3000
    ) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 10)
        with pytest.raises(OffsetOutOfRangeError):
            consumer.poll(timeout_ms=5000)
        consumer.seek(tp, 150)
        first = next(iter(consumer))
        assert first.offset == 150
    # Past the high watermark: refused, naming it; nothing changes.
    with pytest.raises(OffsetOutOfRangeError, match="high watermark 300"):
        admin.delete_records({tp: 301})
    # Durable: the leader, killed (SIGKILL) and restarted, still starts at 150.
    leader = next(b for b in cluster.brokers if b.broker_id == after.leader)
    leader.kill()
    leader.spawn()
    cluster.wait_registered(3)
    wait_until(
        lambda: (local_partition(leader.address, tp) or before).log_start_offset == 150,
        "the restarted leader's log still starts at 150",
    )
    # -1: everything up to the high watermark.
    wait_until(lambda: partition(admin, tp).leader >= 0, "a leader again")
    assert wait_until(lambda: admin.delete_records({tp: -1}), "delete up to the HW") == {tp: 300}


# ---------------------------------------------------------------- elect_leaders


def test_elect_leaders_moves_leadership_back_to_the_preferred_replica(
    cluster: ClusterProcesses, admin: AdminClient
) -> None:
    topic = "elect"
    tp = TopicPartition(topic, 0)
    admin.create_topics([NewTopic(topic, -1, -1, replica_assignments={0: [1, 2, 0]})])
    wait_until(lambda: partition(admin, tp).isr == [1, 2, 0], "the full ISR")
    result = admin.elect_leaders([tp])
    assert isinstance(result[tp], ElectionNotNeededError)

    preferred = next(b for b in cluster.brokers if b.broker_id == 1)
    preferred.stop()
    wait_until(lambda: partition(admin, tp).leader in (0, 2), "a fail-over")
    result = admin.elect_leaders([tp])
    assert isinstance(result[tp], PreferredLeaderNotAvailableError)
    assert "not alive" in str(result[tp])

    preferred.spawn()
    wait_until(lambda: 1 in partition(admin, tp).isr, "broker 1 back in the ISR")
    # The coordinator of this cluster never moves leaders back by itself.
    assert partition(admin, tp).leader != 1
    assert admin.elect_leaders([tp]) == {tp: None}
    wait_until(lambda: partition(admin, tp).leader == 1, "broker 1 leads again")
    # Every partition when none is named: this one needs no election now.
    everything = admin.elect_leaders()
    assert isinstance(everything[tp], ElectionNotNeededError)
