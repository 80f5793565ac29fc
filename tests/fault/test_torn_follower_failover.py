"""A follower cut at a batch boundary by a crash is not elected while its
leader may return: real broker processes, real replication, a real acks=all
producer (the in-process tests/unit/broker/test_torn_logs_reach_the_controller
covers the same with one broker in-process).

Topic `torn`, one partition, replication factor 2 on three brokers (the
third hosts no replica of it: it answers Metadata while the other two are
down), min.insync.replicas 2: every acknowledged record was on both the
leader L and the follower F when it was acknowledged, and F cannot have
left the ISR while acks=all went through, so F is an ISR member the
controller may elect and the only records F lacks afterwards are those the
test cuts. (With min.insync.replicas 1, F could have dropped out of the ISR
under load and the leader gone on acknowledging alone: F would then not be
elected for a reason that has nothing to do with its log, and the test
could pass on code that elects a torn replica.)

Both are SIGKILLed while the coordinator is frozen (SIGSTOP; its session
outlives the freeze), so that the controller sees both registrations gone in
one pass, as after a power loss of both: leader -1, ISR [L, F] kept. With
the coordinator running, whichever lease expired first decided the run: F
first, and F left the ISR (not electable for any reason); L first, and F
was elected before it died. F's active segment is then cut at a batch
boundary below its end (what ext4 leaves after a power loss: recovery finds
nothing wrong) and F restarted alone. F must not be elected while L may
return; on the code before the fix F recovered "clean", was elected as the
only live ISR member, and L truncated to it once back (a 900 s soak lost
9.9 M acknowledged records that way). Then L restarts: L leads (its log
holds the most), every acknowledged record reads back, and F catches up.

Every process is started by the test and stopped through its own PID.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from tidelog import AdminClient
from tidelog_server.etcd import connect
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import BrokerRegistration, PartitionState

from tests.fault.replication_support import (
    BATCH_PREFIX,
    AckedProducer,
    ReplicatedCluster,
    _batch_starts,
    compare,
    describe_losses,
    read_back,
)
from tests.support.etcd import EtcdProcess
from tests.support.processes import BrokerProcess

TOPIC = "torn"
RECORDS = 20_000
#: How long F, back and hosting its logs, must stay unelected: the
#: controller passes every second and on every broker change, and on the
#: code before the fix it elected F within a second of its registration.
WATCH_S = 5.0
DEADLINE_S = 60.0

T = TypeVar("T")


@pytest.fixture
def cluster(etcd: EtcdProcess, tmp_path: Path) -> Iterator[ReplicatedCluster]:
    processes = ReplicatedCluster(etcd, tmp_path, "/torn-follower")
    try:
        # The coordinator is frozen for a few seconds: its session must outlive that.
        processes.start(3, coordinator_session_ttl_s=30)
        yield processes
    finally:
        processes.stop()


def read_key(cluster: ReplicatedCluster, key: Callable[[Keys], bytes]) -> bytes | None:
    async def read() -> bytes | None:
        client = connect(cluster.etcd.endpoint)
        try:
            got = await client.get(key(Keys(cluster.prefix)))
            return None if got is None else bytes(got.value)
        finally:
            await client.close()

    return asyncio.run(read())


def registration(cluster: ReplicatedCluster, broker_id: int) -> BrokerRegistration | None:
    value = read_key(cluster, lambda keys: keys.broker(broker_id))
    return None if value is None else BrokerRegistration.decode(value)


def partition_state(cluster: ReplicatedCluster) -> PartitionState:
    value = read_key(cluster, lambda keys: keys.partition_state(TOPIC, 0))
    assert value is not None
    return PartitionState.decode(value)


def eventually(read: Callable[[], T], check: Callable[[T], bool], what: str) -> T:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = read()
        if check(value):
            return value
        assert time.monotonic() < deadline, f"not within {DEADLINE_S:.0f} s: {what}; last {value}"
        time.sleep(0.1)


def cut_at_a_batch_boundary(broker: BrokerProcess) -> tuple[int, int]:
    """Cut the active segment of `broker`'s log of partition 0 at the start
    of its middle batch; (the offset the log now ends at, bytes cut)."""
    segments = sorted((broker.data_dir / f"{TOPIC}-0").glob("*.log"))
    active = segments[-1]
    data = active.read_bytes()
    starts = _batch_starts(data)
    assert len(starts) >= 2, f"{active}: {len(starts)} batches, too few to cut between"
    cut = starts[len(starts) // 2]
    base_offset = BATCH_PREFIX.unpack_from(data, cut)[0]
    os.truncate(active, cut)
    return base_offset, len(data) - cut


@pytest.mark.timeout(180)
def test_a_follower_cut_at_a_batch_boundary_waits_for_its_leader(
    cluster: ReplicatedCluster,
) -> None:
    cluster.create_topic(TOPIC, 1, 2, {"min.insync.replicas": "2"})
    reply = cluster.metadata(TOPIC)
    assert reply is not None
    meta = reply.topics[0].partitions[0]
    leader = cluster.brokers[meta.leader_id]
    follower_id = next(r for r in meta.replicas if r != meta.leader_id)
    follower = cluster.brokers[follower_id]
    (other,) = (b for b in cluster.brokers if b.broker_id not in meta.replicas)

    producer = AckedProducer(cluster.bootstrap, TOPIC, 1, RECORDS, 2.0, acks="all", linger_ms=5)
    producer.start()
    producer.join(DEADLINE_S)
    assert producer.error is None, producer.error
    assert producer.failed == 0, producer.errors.most_common(3)
    acked = len(producer.acked[0])
    assert acked == RECORDS
    # Both in the ISR when they die: F is a replica the controller may elect.
    assert sorted(partition_state(cluster).isr) == sorted([leader.broker_id, follower_id])

    assert cluster.coordinator is not None
    coordinator_pid = cluster.coordinator.pid
    os.kill(coordinator_pid, signal.SIGSTOP)
    try:
        follower.kill()
        leader.kill()
        for gone in (follower, leader):
            eventually(
                lambda b=gone: registration(cluster, b.broker_id),
                lambda r: r is None,
                f"broker {gone.broker_id}'s registration expires",
            )
        ends_at, cut_bytes = cut_at_a_batch_boundary(follower)
    finally:
        os.kill(coordinator_pid, signal.SIGCONT)
    assert 0 < ends_at < acked, (ends_at, acked)
    print(
        f"\nL=broker {leader.broker_id}, F=broker {follower_id}, third=broker "
        f"{other.broker_id}: {acked} records acknowledged; F cut at offset {ends_at} "
        f"({cut_bytes} bytes)"
    )
    orphaned = eventually(
        lambda: partition_state(cluster),
        lambda s: s.leader == -1,
        "the controller sees the leader gone",
    )
    assert sorted(orphaned.isr) == sorted([leader.broker_id, follower_id]), orphaned

    follower.spawn()
    eventually(
        lambda: registration(cluster, follower_id),
        lambda r: r is not None and not r.starting,
        f"broker {follower_id} registers having hosted its logs",
    )
    seen = []
    watch_until = time.monotonic() + WATCH_S
    while time.monotonic() < watch_until:
        state = partition_state(cluster)
        seen.append((state.leader, state.leader_epoch, list(state.isr)))
        assert state.leader == -1, f"the torn follower was elected: {seen}"
        time.sleep(0.2)
    reply = cluster.metadata(TOPIC)  # the third broker's (or F's) view
    assert reply is not None and reply.topics[0].partitions[0].leader_id == -1, reply
    listed = registration(cluster, follower_id)
    assert listed is not None and (TOPIC, 0) in listed.torn_partitions, listed
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        (description,) = admin.describe_topics([TOPIC])
    assert description.partitions[0].torn_replicas == [follower_id], description

    leader.spawn()
    eventually(
        lambda: partition_state(cluster),
        lambda s: s.leader == leader.broker_id,
        f"broker {leader.broker_id} (the longer log) leads",
    )
    eventually(
        lambda: cluster.leaders_serving(TOPIC),
        bool,
        f"broker {leader.broker_id} serves as the leader",
    )
    read = read_back(cluster.bootstrap, TOPIC, 1, DEADLINE_S)
    verdict = compare(producer.acked, read)
    print(verdict)
    if verdict.lost:
        print(describe_losses(producer.acked, read))
    assert verdict.lost == 0, verdict
    assert verdict.duplicates == 0, verdict

    # F catches up: back in the ISR (if it left it), no longer listed torn.
    eventually(
        lambda: (partition_state(cluster), registration(cluster, follower_id)),
        lambda sr: (
            sorted(sr[0].isr) == sorted([leader.broker_id, follower_id])
            and sr[1] is not None
            and (TOPIC, 0) not in sr[1].torn_partitions
        ),
        f"broker {follower_id} catches up",
    )
    assert partition_state(cluster).leader == leader.broker_id
