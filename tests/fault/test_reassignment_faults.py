"""Replica reassignment under faults (issue 13): four real brokers, a
producer with acks=all writing throughout, and SIGKILL of

- the controller (a coordinator) right after a reassignment started: the
  standby coordinator becomes controller and completes it;
- the leader, a replica that the reassignment removes, while the new
  replicas are still copying (throttled): an in-sync replica takes over, the
  move completes from it, and the killed broker, restarted, deletes its
  stale replica;
- a new replica while it copies: the move waits (the partition stays led by
  its original replicas) and a cancel restores them.

After each, every partition has a live leader, and every acknowledged
record is read back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tidelog import AdminClient, NewTopic, TopicPartition

from tests.fault.replication_support import (
    AckedProducer,
    ReplicatedCluster,
    compare,
    read_back,
    running_replicated_cluster,
)
from tests.support.coordinator import start_coordinator
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(300)

TOPIC = "moving"
PARTITIONS = 2
DEADLINE_S = 90.0


@pytest.fixture
def cluster(
    etcd: EtcdProcess, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[ReplicatedCluster]:
    """Four brokers: a move needs somewhere to go."""
    with running_replicated_cluster(
        etcd, tmp_path, f"/{request.node.name[:40]}", count=4
    ) as processes:
        yield processes


def wait_for(check, what: str, timeout_s: float = DEADLINE_S):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as exc:  # a leader or coordinator moving
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what} (last: {last!r})")


def replicas(admin: AdminClient) -> list[list[int]]:
    return [p.replicas for p in admin.describe_topics([TOPIC])[0].partitions]


def assert_led_by_live_replicas(admin: AdminClient, live: set[int]) -> None:
    def led() -> bool:
        parts = admin.describe_topics([TOPIC])[0].partitions
        return all(p.leader in live and p.leader in p.replicas for p in parts)

    wait_for(led, f"every partition led by a live replica of {sorted(live)}")


def finish_and_compare(cluster: ReplicatedCluster, producer: AckedProducer) -> None:
    producer.join(DEADLINE_S)
    assert producer.error is None, producer.error
    assert producer.acked_count() > 0
    read = read_back(cluster.bootstrap, TOPIC, PARTITIONS, DEADLINE_S)
    verdict = compare(producer.acked, read)
    assert verdict.lost == 0, verdict


def start_producer(cluster: ReplicatedCluster, total: int, duration_s: float) -> AckedProducer:
    producer = AckedProducer(
        cluster.bootstrap,
        TOPIC,
        PARTITIONS,
        total=total,
        duration_s=duration_s,
        acks="all",
    )
    producer.start()
    return producer


def test_controller_killed_mid_reassignment_the_standby_completes_it(
    cluster: ReplicatedCluster,
) -> None:
    standby = start_coordinator(
        cluster.etcd.endpoint,
        cluster.root / "logs",
        prefix=cluster.prefix,
        coordinator_id="c1",
        session_ttl_s=2,
    )
    try:
        with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
            admin.create_topics(
                [NewTopic(TOPIC, -1, -1, replica_assignments={0: [0, 1], 1: [1, 2]})]
            )
            producer = start_producer(cluster, total=4000, duration_s=8)
            time.sleep(1.5)
            moves = {TopicPartition(TOPIC, 0): [2, 3], TopicPartition(TOPIC, 1): [3, 0]}
            # Throttled, so that the copies are still going when c0 dies.
            admin.alter_partition_reassignments(moves, throttle_bytes_per_s=10_000)
            assert cluster.coordinator is not None
            cluster.coordinator.kill()  # SIGKILL: its lease lapses, c1 takes over
            assert set(admin.list_partition_reassignments()) == set(moves)  # mid-move
            wait_for(lambda: replicas(admin) == [[2, 3], [3, 0]], "both moves complete")
            assert admin.list_partition_reassignments() == {}
            assert_led_by_live_replicas(admin, {0, 1, 2, 3})
            finish_and_compare(cluster, producer)
    finally:
        standby.stop()


def test_leaving_leader_killed_while_new_replicas_copy(cluster: ReplicatedCluster) -> None:
    tp = TopicPartition(TOPIC, 0)
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, -1, -1, replica_assignments={0: [0, 1], 1: [1, 2]})])
        producer = start_producer(cluster, total=30_000, duration_s=10)
        time.sleep(2)
        # Slow enough that the copy is under way when the leader dies.
        admin.alter_partition_reassignments({tp: [2, 3]}, throttle_bytes_per_s=20_000)
        wait_for(
            lambda: any(
                p.log_end_offset > 0
                for p in admin.list_partition_reassignments()[tp].progress.values()
            ),
            "the new replicas start copying",
        )
        leader = cluster.brokers[0]
        leader.kill()
        assert tp in admin.list_partition_reassignments()  # still copying
        wait_for(lambda: replicas(admin)[0] == [2, 3], "the move completes from broker 1")
        assert_led_by_live_replicas(admin, {1, 2, 3})
        finish_and_compare(cluster, producer)
        # The killed broker comes back: its replica was moved away, so its
        # log goes at its first listing.
        leader.spawn()
        stale = leader.data_dir / f"{TOPIC}-0"
        wait_for(lambda: not stale.exists(), f"broker 0 deletes {stale}")


def test_new_replica_killed_while_copying_then_cancel(cluster: ReplicatedCluster) -> None:
    tp = TopicPartition(TOPIC, 0)
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, -1, -1, replica_assignments={0: [0, 1], 1: [1, 2]})])
        producer = start_producer(cluster, total=3000, duration_s=6)
        time.sleep(1)
        admin.alter_partition_reassignments({tp: [0, 3]}, throttle_bytes_per_s=5_000)
        cluster.brokers[3].kill()
        time.sleep(3)  # the move cannot complete without broker 3
        assert tp in admin.list_partition_reassignments()
        assert_led_by_live_replicas(admin, {0, 1, 2})
        assert admin.alter_partition_reassignments({tp: None}) == {tp: None}
        assert replicas(admin)[0] == [0, 1]
        assert_led_by_live_replicas(admin, {0, 1, 2})
        finish_and_compare(cluster, producer)
