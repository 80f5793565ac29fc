"""A leader never proposes a follower for the ISR while the follower's
registration lists its replica of the partition offline
(`ReplicaManager.replica_offline`, from ClusterView.lists_offline).

The controller removes such a replica from the ISR at once (leader_election).
Its last fetches, made before its log went offline, reached the high
watermark and are younger than replica.lag.time.max.ms, so without this the
next fetch of any other follower had the leader write it back into the ISR,
and the two took turns until the lag ran out.

A leader's ReplicaManager over a real log; the ISR writer (etcd) is the one
stand-in: it records what it is asked to write.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tidelog.records import encode_batch, iter_batches
from tidelog_broker.config import BrokerConfig
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_state import PartitionReplication, Role
from tidelog_broker.topic_store import TopicSpec

LEO = 10
REVISION = 100


def proposals_after_the_controller_removed_2(path: Path, listed_offline: bool) -> list[list[int]]:
    """Leader 0 of t-0 (replicas 0, 1, 2), both followers caught up; the
    controller's ISR without 2 is applied; then 1 fetches again. Returns
    the ISRs the leader proposed."""

    async def run() -> list[list[int]]:
        manager = PartitionManager(BrokerConfig(broker_id=0, data_dir=path), cluster_mode=True)
        manager.open()
        try:
            manager.logs.host_partitions(TopicSpec("t", 1, {}), [0])

            def apply(isr: list[int], revision: int) -> None:
                manager.replicas.set_role(
                    "t",
                    0,
                    role=Role.LEADER,
                    leader_id=0,
                    leader_epoch=1,
                    replicas=[0, 1, 2],
                    isr=isr,
                    revision=revision,
                )

            apply([0, 1, 2], REVISION)
            data = bytearray(encode_batch([b"v%d" % i for i in range(LEO)]))
            manager.partition_log("t", 0).append(data, list(iter_batches(data)))
            manager.replicas.registration_of = {1: 7, 2: 8}.get
            manager.replicas.replica_offline = lambda broker, topic, partition: (
                listed_offline and (broker, topic, partition) == (2, "t", 0)
            )
            proposals: list[list[int]] = []

            async def write_isr(_replication: PartitionReplication, isr: list[int]) -> bool:
                proposals.append(list(isr))
                return False

            manager.replicas.isr_writer = write_isr
            manager.replicas.on_follower_fetch("t", 0, 1, LEO)
            manager.replicas.on_follower_fetch("t", 0, 2, LEO)
            assert proposals == []  # everyone is in the ISR

            apply([0, 1], REVISION + 1)  # the controller removed 2
            manager.replicas.on_follower_fetch("t", 0, 1, LEO)
            await asyncio.sleep(0)  # the write task runs
            await manager.replicas.stop_isr_writes()
            return proposals
        finally:
            manager.close()

    return asyncio.run(run())


def test_a_follower_listed_offline_is_not_proposed_for_the_isr(tmp_path: Path) -> None:
    assert proposals_after_the_controller_removed_2(tmp_path, listed_offline=True) == []


def test_without_the_listing_its_recent_progress_would_bring_it_back(tmp_path: Path) -> None:
    # The same follower, not listed (as every broker was before the
    # registration listed offline logs): its progress from before counts.
    proposals = proposals_after_the_controller_removed_2(tmp_path, listed_offline=False)
    assert proposals == [[0, 1, 2]]
