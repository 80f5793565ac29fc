"""The high watermark while an ISR change is proposed (replica_state's
"maximal ISR"), on a leader's ReplicaManager over a real log.

Found by a fault run that lost 250 acknowledged records in a reassignment:
the leader proposed adding replica 2, caught up to the HW of then (750);
while the change was on its way to etcd and back, replica 1's fetches moved
the HW to 1,000 over the ISR applied, [0, 1]. etcd's ISR then named replica
2 without records 750-999, and the controller made it leader. Now the HW
waits for a proposed replica from the proposal until the watch brings back a
newer state; a proposal that was not written ends at once.

When a proposal ends, the leader recomputes the HW at once and wakes what
waits on it. It used to wait for the next append or follower fetch: with
replica 2 stopped after being proposed, and no more appends, acks=all
produces timed out and consumers did not see records the ISR held.

The ISR writer (ClusterLink.write_isr, etcd) is the one stand-in here: its
outcome, and when it comes, is the test's to choose.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aetcd.exceptions import ConnectionFailedError
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


#: Generous: an acks=all wait that is woken ends long before.
WAIT_S = 20.0


class Leader:
    """Broker 0 leading t-0 (replicas 0, 1, 2; ISR 0, 1) with LEO records,
    whose ISR writer answers `written` and keeps what it was asked to write.
    `written` None: each write waits for the test to settle its outcome in
    `outcomes` (True, False, or an exception: the etcd write failed)."""

    def __init__(self, path: Path, written: bool | None) -> None:
        self.manager = PartitionManager(BrokerConfig(broker_id=0, data_dir=path), cluster_mode=True)
        self.manager.open()
        self.manager.logs.host_partitions(TopicSpec("t", 1, {}), [0])
        self.replication = self.apply([0, 1], REVISION)
        data = bytearray(encode_batch([b"v%d" % i for i in range(LEO)]))
        self.manager.partition_log("t", 0).append(data, list(iter_batches(data)))
        self.manager.replicas.registration_of = {1: 7, 2: 8}.get
        self.proposals: list[list[int]] = []
        self.outcomes: list[asyncio.Future[bool]] = []

        async def write_isr(_replication: PartitionReplication, isr: list[int]) -> bool:
            self.proposals.append(isr)
            if written is not None:
                return written
            outcome = asyncio.get_running_loop().create_future()
            self.outcomes.append(outcome)
            return await outcome

        self.manager.replicas.isr_writer = write_isr

    @property
    def high_watermark(self) -> int:
        return self.replication.high_watermark

    def apply(self, isr: list[int], revision: int) -> PartitionReplication:
        """The watch brings t-0's state with `isr` at `revision`."""
        return self.manager.replicas.set_role(
            "t",
            0,
            role=Role.LEADER,
            leader_id=0,
            leader_epoch=1,
            replicas=[0, 1, 2],
            isr=isr,
            revision=revision,
        )

    def fetch(self, follower: int, offset: int) -> None:
        self.manager.replicas.on_follower_fetch("t", 0, follower, offset)

    async def propose_replica_2(self) -> None:
        """Both followers reach BEHIND, the HW; replica 2 is proposed for
        the ISR, and the writer runs."""
        self.fetch(1, BEHIND)
        self.fetch(2, BEHIND)
        await asyncio.sleep(0)
        assert self.proposals == [[0, 1, 2]]
        assert self.high_watermark == BEHIND

    def wait_for_acks_all(self) -> asyncio.Task[None]:
        """An acks=all produce of the last record, waiting for the HW."""
        return asyncio.ensure_future(
            self.manager.replicas.wait_for_high_watermark("t", 0, LEO - 1, 1, WAIT_S)
        )


def run_as_leader(
    path: Path, written: bool | None, scenario: Callable[[Leader], Awaitable[None]]
) -> None:
    """Run `scenario` on the leader of t-0 over a real log, closed after;
    `written`: whether its ISR proposals reach etcd (None: as the test
    settles each, Leader.outcomes)."""
    leader = Leader(path, written)
    try:
        asyncio.run(scenario(leader))
    finally:
        leader.manager.close()


def test_a_written_proposal_holds_the_hw_for_its_replica_until_the_watch_brings_it(
    tmp_path: Path,
) -> None:
    async def scenario(leader: Leader) -> None:
        await leader.propose_replica_2()
        # Replica 1 catches up while the change is on its way back from etcd.
        leader.fetch(1, LEO)
        assert leader.high_watermark == BEHIND
        # The watch brings the state the proposal was written against again
        # (a re-listing): not the outcome yet.
        leader.apply([0, 1], REVISION)
        leader.fetch(1, LEO)
        assert leader.high_watermark == BEHIND
        # The outcome: replica 2 is in the ISR, and the HW waits for it as
        # for any member; it moves once replica 2 catches up.
        leader.apply([0, 1, 2], REVISION + 1)
        assert not leader.replication.isr_change_pending
        assert leader.high_watermark == BEHIND
        leader.fetch(2, LEO)
        assert leader.high_watermark == LEO

    run_as_leader(tmp_path, True, scenario)


def test_a_proposal_that_was_not_written_ends_at_once(tmp_path: Path) -> None:
    async def scenario(leader: Leader) -> None:
        await leader.propose_replica_2()
        assert not leader.replication.isr_change_pending
        # Nothing changed in etcd: the HW is the applied ISR's again.
        leader.fetch(1, LEO)
        assert leader.high_watermark == LEO

    run_as_leader(tmp_path, False, scenario)


def test_a_newer_state_that_supersedes_the_proposal_ends_it(tmp_path: Path) -> None:
    async def scenario(leader: Leader) -> None:
        await leader.propose_replica_2()
        assert leader.replication.isr_change_pending
        # The watch brings a later state whose ISR is not the proposal's (the
        # written change and a later one, in one batch): the proposal ends,
        # and the HW is over the ISR that etcd now has.
        leader.apply([0, 1], REVISION + 2)
        assert not leader.replication.isr_change_pending
        leader.fetch(1, LEO)
        assert leader.high_watermark == LEO

    run_as_leader(tmp_path, True, scenario)


@pytest.mark.parametrize("failure", ["refused", "failed"])
def test_an_expansion_that_is_not_written_lets_waiting_acks_all_produces_complete(
    tmp_path: Path, failure: str
) -> None:
    async def scenario(leader: Leader) -> None:
        await leader.propose_replica_2()
        # Replica 1, in the ISR, has every record; the proposal holds the HW
        # at replica 2's log end, and an acks=all produce waits.
        leader.fetch(1, LEO)
        assert leader.high_watermark == BEHIND
        acks_all = leader.wait_for_acks_all()
        await asyncio.sleep(0)
        assert not acks_all.done()
        # Replica 2 stops; the write is refused (its registration changed)
        # or fails. No append or fetch comes after this.
        (outcome,) = leader.outcomes
        if failure == "refused":
            outcome.set_result(False)
        else:
            outcome.set_exception(ConnectionFailedError("etcd unreachable"))
        await acks_all  # RequestTimedOutError after WAIT_S when not woken
        assert not leader.replication.isr_change_pending
        assert leader.high_watermark == LEO
        log = leader.manager.partition_log("t", 0)
        assert leader.manager.replicas.high_watermark(log) == LEO

    run_as_leader(tmp_path, None, scenario)


def test_the_watch_bringing_a_superseding_state_lets_waiting_acks_all_produces_complete(
    tmp_path: Path,
) -> None:
    async def scenario(leader: Leader) -> None:
        await leader.propose_replica_2()
        leader.fetch(1, LEO)
        acks_all = leader.wait_for_acks_all()
        await asyncio.sleep(0)
        (outcome,) = leader.outcomes
        outcome.set_result(True)
        await asyncio.sleep(0)
        assert not acks_all.done()  # written: the HW waits for the watch
        # The watch brings a later state without replica 2 (the written
        # change and a shrink after it, in one batch).
        leader.apply([0, 1], REVISION + 2)
        await acks_all
        assert leader.high_watermark == LEO

    run_as_leader(tmp_path, None, scenario)


def test_a_late_refusal_does_not_end_the_proposal_after_it(tmp_path: Path) -> None:
    async def scenario(leader: Leader) -> None:
        await leader.propose_replica_2()
        (first,) = leader.outcomes
        # A newer state ends the first proposal while its write is still on
        # its way (the write will be refused: the state moved). Replica 2's
        # next fetch proposes it again, against the newer state.
        leader.apply([0, 1], REVISION + 1)
        assert not leader.replication.isr_change_pending
        leader.fetch(2, BEHIND)
        await asyncio.sleep(0)
        assert leader.proposals == [[0, 1, 2], [0, 1, 2]]
        assert leader.replication.isr_change_pending
        # The first write's refusal arrives: it is not the second's outcome,
        # which may be in etcd already; the HW still waits for replica 2.
        first.set_result(False)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert leader.replication.isr_change_pending
        leader.fetch(1, LEO)
        assert leader.high_watermark == BEHIND

    run_as_leader(tmp_path, None, scenario)
