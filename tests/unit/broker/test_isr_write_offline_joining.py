"""A leader adds a follower to the ISR only if the follower's registration,
in etcd, is the one the leader judged it by: not listing its log of the
partition offline (ClusterLink.write_isr).

A follower whose log of a partition went offline rewrites its registration
in place to list it (`offline_partitions`: same key, same lease, same create
revision). The controller then leaves it out of the ISR and never elects
it. The leader hides offline replicas from its ISR expansions, but it reads
them from its view of etcd, which its watch may not have brought up to date
yet; and a write fenced only by the follower's create revision passed the
in-place rewrite. The offline replica was back in etcd's ISR within the
epoch: the HW could not pass its log end, so acks=all produces waited until
the controller's next pass (up to a second later: passes run on broker
changes, which this write is not, and every second) or the leader's lag
shrink removed it; a leader whose view stayed behind proposed it again at
the next qualifying fetch.

A real ClusterLink on a real etcd leads t-0 (replicas 0, 1; ISR 0); broker
1 is a registration key, fetching through the ReplicaManager; the
controller's pass is the coordinator's real LeaderElector. The one
stand-in: the link's view applies broker registrations from the watch only
when the test lets it (its watch is behind etcd).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from tidelog.records import encode_batch, iter_batches
from tidelog_broker.cluster_link import ClusterLink
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_state import PartitionReplication
from tidelog_coordinator.leader_election import LeaderElector
from tidelog_server.etcd import WatchBatch
from tidelog_server.etcd.records import BrokerRegistration, PartitionState, TopicAssignment

from tests.support.etcd import EtcdProcess
from tests.unit.broker.in_process_broker import InProcessBroker, eventually

TOPIC = "t"
#: The leader's log end: records 0-9, in broker 1's log too when it fetches.
LEO = 10


Scenario = Callable[[PartitionManager, ClusterLink, PartitionReplication], Awaitable[None]]


def run_leader(etcd: EtcdProcess, tmp_path: Path, scenario: Scenario) -> None:
    """Broker 0 leading t-0 (replicas 0, 1; ISR 0) with LEO records through
    a started ClusterLink; broker 1 registered, not in the ISR. Stopped after."""

    async def run() -> None:
        broker = InProcessBroker(etcd, f"/isr-{uuid.uuid4().hex}", tmp_path, 0)
        manager, link = broker.manager, broker.link
        try:
            await broker.start()
            keys = link.keys
            await put_registration(link)
            topic = TopicAssignment(TOPIC, uuid.uuid4().hex, ((0, 1),), {})
            await link.client.put(keys.topic(TOPIC), topic.encode())
            state = PartitionState(leader=0, leader_epoch=1, isr=(0,))
            await link.client.put(keys.partition_state(TOPIC, 0), state.encode())

            def leading() -> bool:
                r = manager.replicas.replication(TOPIC, 0)
                return r is not None and r.is_leader and link.view.registration_of(1) is not None

            await eventually(leading, "broker 0 leads t-0")
            leader = manager.replicas.replication(TOPIC, 0)
            assert leader is not None
            data = bytearray(encode_batch([b"v%d" % i for i in range(LEO)]))
            manager.partition_log(TOPIC, 0).append(data, list(iter_batches(data)))
            await scenario(manager, link, leader)
        finally:
            await broker.stop()

    asyncio.run(run())


async def put_registration(link: ClusterLink, offline: tuple[tuple[str, int], ...] = ()) -> None:
    """Broker 1's registration; once it exists, put in place (as
    ClusterLink._rewrite_registration does: its create revision stays)."""
    registration = BrokerRegistration(
        broker_id=1, host="127.0.0.1", port=2, offline_partitions=offline
    )
    await link.client.put(link.keys.broker(1), registration.encode())


async def etcd_isr(link: ClusterLink) -> tuple[int, ...]:
    got = await link.client.get(link.keys.partition_state(TOPIC, 0))
    assert got is not None
    return PartitionState.decode(got.value).isr


def answers_of_isr_writer(manager: PartitionManager) -> list[bool]:
    """The ISR writer's answers from now on, as the ReplicaManager gets them."""
    answers: list[bool] = []
    write_isr = manager.replicas.isr_writer
    assert write_isr is not None

    async def answered_write_isr(r: PartitionReplication, isr: list[int]) -> bool:
        answers.append(await write_isr(r, isr))
        return answers[-1]

    manager.replicas.isr_writer = answered_write_isr
    return answers


class HeldRegistrations:
    """The link's view of broker registrations, held behind etcd: the
    watch's batches wait here until `release`."""

    def __init__(self, link: ClusterLink) -> None:
        self.link = link
        self.batches: list[WatchBatch] = []
        self._apply = link.view.apply_brokers
        link.view.apply_brokers = self.batches.append  # type: ignore[method-assign]

    async def wait_for_rewrite(self) -> None:
        await eventually(lambda: bool(self.batches), "the watch brings broker 1's rewrite")
        broker_1 = await self.link.client.get(self.link.keys.broker(1))
        assert broker_1 is not None
        # In place: the registration the view has (and the follower's
        # fetches are bound to) is, by its create revision, still current.
        assert broker_1.create_revision == self.link.view.registration_of(1)
        assert broker_1.mod_revision > broker_1.create_revision

    def release(self) -> None:
        """The view catches up (synchronously: no await in between)."""
        self.link.view.apply_brokers = self._apply  # type: ignore[method-assign]
        for batch in self.batches:
            self._apply(batch)


def controller(link: ClusterLink) -> LeaderElector:
    """The coordinator's election passes (elect_once), unfenced."""
    return LeaderElector(link.client, link.keys, preferred_interval_ms=0)


def test_a_follower_whose_log_went_offline_is_not_added_by_a_leader_behind_etcd(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    async def scenario(
        manager: PartitionManager, link: ClusterLink, leader: PartitionReplication
    ) -> None:
        answers = answers_of_isr_writer(manager)
        held = HeldRegistrations(link)
        # Broker 1's log of t-0 goes offline: its registration lists it.
        await put_registration(link, offline=((TOPIC, 0),))
        await held.wait_for_rewrite()
        # The controller sees it; broker 1 is not in the ISR: nothing to do.
        assert await controller(link).elect_once(None, preferred=False) == 0
        assert not link.view.lists_offline(1, TOPIC, 0)

        # Broker 1's last fetch (from before its log went offline) reached
        # the HW: the leader, whose view is behind, proposes it.
        manager.replicas.on_follower_fetch(TOPIC, 0, 1, LEO)
        await eventually(lambda: bool(answers), "the ISR writer answers")
        assert await etcd_isr(link) == (0,), "the leader added offline broker 1 to the ISR"
        assert answers == [False]
        assert not leader.isr_change_pending
        assert leader.high_watermark == LEO

        # The watch brings the listing: no more proposals of broker 1.
        held.release()
        manager.replicas.on_follower_fetch(TOPIC, 0, 1, LEO)
        assert not leader.isr_change_pending
        assert answers == [False]
        assert await etcd_isr(link) == (0,)

    run_leader(etcd, tmp_path, scenario)


def test_a_view_that_catches_up_between_the_proposal_and_its_write_refuses_it(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """The proposal was judged on the old registration; by the time it is
    written the view lists broker 1's log offline (and etcd agrees)."""

    async def scenario(
        manager: PartitionManager, link: ClusterLink, leader: PartitionReplication
    ) -> None:
        answers = answers_of_isr_writer(manager)
        held = HeldRegistrations(link)
        await put_registration(link, offline=((TOPIC, 0),))
        await held.wait_for_rewrite()
        manager.replicas.on_follower_fetch(TOPIC, 0, 1, LEO)
        assert leader.isr_change_pending  # proposed; its write has not run yet
        held.release()
        await eventually(lambda: bool(answers), "the ISR writer answers")
        assert await etcd_isr(link) == (0,), "the leader added offline broker 1 to the ISR"
        assert answers == [False]

    run_leader(etcd, tmp_path, scenario)


def test_a_refused_expansion_is_retried_once_the_view_has_the_registration(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """Any rewrite in place refuses a write judged on the registration
    before it, here one listing another partition offline; the follower's
    next qualifying fetch, once the view has the rewrite, joins."""

    async def scenario(
        manager: PartitionManager, link: ClusterLink, leader: PartitionReplication
    ) -> None:
        answers = answers_of_isr_writer(manager)
        held = HeldRegistrations(link)
        await put_registration(link, offline=(("other", 0),))
        await held.wait_for_rewrite()
        manager.replicas.on_follower_fetch(TOPIC, 0, 1, LEO)
        await eventually(lambda: bool(answers), "the ISR writer answers")
        assert answers == [False]
        assert await etcd_isr(link) == (0,)

        held.release()
        manager.replicas.on_follower_fetch(TOPIC, 0, 1, LEO)
        await eventually(lambda: leader.isr == [0, 1], "broker 1 joins the ISR")
        assert answers == [False, True]
        assert await etcd_isr(link) == (0, 1)

    run_leader(etcd, tmp_path, scenario)
