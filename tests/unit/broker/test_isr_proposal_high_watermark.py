"""The high watermark while an ISR change is proposed (replica_state's
"maximal ISR"), on a leader's ReplicaManager over a real log.

Found by a fault run that lost 250 acknowledged records in a reassignment:
the leader proposed adding replica 2, caught up to the HW of then (750);
while the change was on its way to etcd and back, replica 1's fetches moved
the HW to 1,000 over the ISR applied, [0, 1]. etcd's ISR then named replica
2 without records 750-999, and the controller made it leader. Now the HW
waits for a proposed replica from the proposal until the watch brings back a
newer state; a proposal that was not written ends at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from tidelog.records import encode_batch, iter_batches
from tidelog_broker.config import BrokerConfig
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_state import PartitionReplication, Role
from tidelog_broker.topic_store import TopicSpec

#: The leader's log end: records 0-9.
LEO = 10
#: Where both followers stand when replica 2 is proposed for the ISR.
BEHIND = 4
#: The partition state's mod revision when the leader took over.
REVISION = 100


def _leading(path: Path, written: bool) -> tuple[PartitionManager, PartitionReplication]:
    """Broker 0 leads t-0 (replicas 0, 1, 2; ISR 0, 1) with LEO records; its
    ISR writer answers `written`."""
    manager = PartitionManager(BrokerConfig(broker_id=0, data_dir=path), cluster_mode=True)
    manager.open()
    manager.logs.host_partitions(TopicSpec("t", 1, {}), [0])
    replication = manager.replicas.set_role(
        "t",
        0,
        role=Role.LEADER,
        leader_id=0,
        leader_epoch=1,
        replicas=[0, 1, 2],
        isr=[0, 1],
        revision=REVISION,
    )
    data = bytearray(encode_batch([b"v%d" % i for i in range(LEO)]))
    manager.partition_log("t", 0).append(data, list(iter_batches(data)))
    manager.replicas.registration_of = {1: 7, 2: 8}.get
    proposals: list[list[int]] = []

    async def write_isr(_replication: PartitionReplication, isr: list[int]) -> bool:
        proposals.append(isr)
        return written

    manager.replicas.isr_writer = write_isr
    manager.proposals = proposals  # type: ignore[attr-defined]
    return manager, replication


def _run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def _fetch(manager: PartitionManager, follower: int, offset: int) -> None:
    manager.replicas.on_follower_fetch("t", 0, follower, offset)


def _apply(manager: PartitionManager, isr: list[int], revision: int) -> None:
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


def test_a_written_proposal_holds_the_hw_for_its_replica_until_the_watch_brings_it(
    tmp_path: Path,
) -> None:
    manager, replication = _leading(tmp_path, written=True)

    async def scenario() -> None:
        _fetch(manager, 1, BEHIND)
        _fetch(manager, 2, BEHIND)  # caught up to the HW: proposed for the ISR
        await asyncio.sleep(0)  # the writer runs
        assert manager.proposals == [[0, 1, 2]]  # type: ignore[attr-defined]
        assert replication.high_watermark == BEHIND
        # Replica 1 catches up while the change is on its way back from etcd.
        _fetch(manager, 1, LEO)
        assert replication.high_watermark == BEHIND
        # The watch brings the state the proposal was written against again
        # (a re-listing): not the outcome yet.
        _apply(manager, [0, 1], REVISION)
        _fetch(manager, 1, LEO)
        assert replication.high_watermark == BEHIND
        # The outcome: replica 2 is in the ISR, and the HW waits for it as
        # for any member; it moves once replica 2 catches up.
        _apply(manager, [0, 1, 2], REVISION + 1)
        assert not replication.isr_change_pending
        assert replication.high_watermark == BEHIND
        _fetch(manager, 2, LEO)
        assert replication.high_watermark == LEO

    try:
        _run(scenario)
    finally:
        manager.close()


def test_a_proposal_that_was_not_written_ends_at_once(tmp_path: Path) -> None:
    manager, replication = _leading(tmp_path, written=False)

    async def scenario() -> None:
        _fetch(manager, 1, BEHIND)
        _fetch(manager, 2, BEHIND)
        await asyncio.sleep(0)
        assert not replication.isr_change_pending
        # Nothing changed in etcd: the HW is the applied ISR's again.
        _fetch(manager, 1, LEO)
        assert replication.high_watermark == LEO

    try:
        _run(scenario)
    finally:
        manager.close()


def test_a_newer_state_that_supersedes_the_proposal_ends_it(tmp_path: Path) -> None:
    manager, replication = _leading(tmp_path, written=True)

    async def scenario() -> None:
        _fetch(manager, 1, BEHIND)
        _fetch(manager, 2, BEHIND)
        await asyncio.sleep(0)
        assert replication.isr_change_pending
        # The watch brings a later state whose ISR is not the proposal's (the
        # written change and a later one, in one batch): the proposal ends,
        # and the HW is over the ISR that etcd now has.
        _apply(manager, [0, 1], REVISION + 2)
        assert not replication.isr_change_pending
        _fetch(manager, 1, LEO)
        assert replication.high_watermark == LEO

    try:
        _run(scenario)
    finally:
        manager.close()
