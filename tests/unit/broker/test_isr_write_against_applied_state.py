"""A leader writes an ISR change only against the partition state it
computed the change from (ClusterLink.write_isr; Kafka's AlterPartition
carries the partition epoch for the same reason).

The controller only ever shrinks an ISR within a leader epoch; here it
removes broker 1, which restarted with an empty log (a torn one), after the
leader had counted broker 1's records into the HW. The leader's watch puts
that state into the link's view and then applies it to the partition; in
between (the link awaits: hosting another partition of the batch, a loop
slice between partitions of a burst), broker 2 caught up and was proposed
for the ISR. The proposal was the ISR applied, [0, 1], plus 2, and the link
wrote it against the newer state it had in view, whose ISR was [0]: broker
1 was back in etcd's ISR, with its registration now older than the state,
so that the controller no longer saw it as restarted. Had the leader died
then, the controller would have elected broker 1 (the first replica in the
ISR): every acknowledged record lost.

A real ClusterLink on a real etcd leads t-0 (replicas 0, 1, 2; ISR 0, 1);
brokers 1 and 2 are registration keys and fetch through the ReplicaManager;
the controller's pass is the coordinator's real LeaderElector. The one
stand-in: the link's application of the controller's state to the
partition (ReplicaManager.set_role) is held back while the test runs the
fetch that falls into that window.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tidelog.records import encode_batch, iter_batches
from tidelog_broker.cluster_link import ClusterLink
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_state import PartitionReplication
from tidelog_coordinator.leader_election import LeaderElector
from tidelog_server.etcd.records import BrokerRegistration, PartitionState, TopicAssignment

from tests.support.etcd import EtcdProcess
from tests.unit.broker.in_process_broker import InProcessBroker, eventually

TOPIC = "t"
#: The leader's log end: records 0-9, all acknowledged (in every ISR member's log).
LEO = 10


def run_leader(
    etcd: EtcdProcess,
    tmp_path: Path,
    scenario: Callable[[PartitionManager, ClusterLink, PartitionReplication], Awaitable[None]],
) -> None:
    """Broker 0 leading t-0 through a started ClusterLink (`restarted_follower`
    done), stopped after."""

    async def run() -> None:
        broker = InProcessBroker(etcd, f"/isr-{uuid.uuid4().hex}", tmp_path, 0)
        manager, link = broker.manager, broker.link
        try:
            await broker.start()
            leader = await restarted_follower(manager, link)
            await scenario(manager, link, leader)
        finally:
            await broker.stop()

    asyncio.run(run())


async def register(link: ClusterLink, broker_id: int) -> None:
    await link.client.put(
        link.keys.broker(broker_id),
        BrokerRegistration(broker_id=broker_id, host="127.0.0.1", port=2).encode(),
    )


async def etcd_isr(link: ClusterLink) -> tuple[int, ...]:
    got = await link.client.get(link.keys.partition_state(TOPIC, 0))
    assert got is not None
    return PartitionState.decode(got.value).isr


async def restarted_follower(manager: PartitionManager, link: ClusterLink) -> PartitionReplication:
    """Broker 0 leads t-0 (replicas 0, 1, 2; ISR 0, 1) with LEO records, all
    acknowledged; then broker 1 restarts with an empty log (a new
    registration; its first fetch under it is from offset 0)."""
    client, keys = link.client, link.keys
    await register(link, 1)
    await register(link, 2)
    topic = TopicAssignment(TOPIC, uuid.uuid4().hex, ((0, 1, 2),), {})
    await client.put(keys.topic(TOPIC), topic.encode())
    state = PartitionState(leader=0, leader_epoch=1, isr=(0, 1))
    await client.put(keys.partition_state(TOPIC, 0), state.encode())

    def leading() -> bool:
        r = manager.replicas.replication(TOPIC, 0)
        return r is not None and r.is_leader and link.view.registration_of(2) is not None

    await eventually(leading, "broker 0 leads t-0")
    leader = manager.replicas.replication(TOPIC, 0)
    assert leader is not None
    data = bytearray(encode_batch([b"v%d" % i for i in range(LEO)]))
    manager.partition_log(TOPIC, 0).append(data, list(iter_batches(data)))
    # Broker 1 has every record: the HW passes them all (acks=all answered).
    manager.replicas.on_follower_fetch(TOPIC, 0, 1, LEO)
    assert leader.high_watermark == LEO

    first_registration = link.view.registration_of(1)
    await client.delete(keys.broker(1))
    await register(link, 1)
    await eventually(
        lambda: link.view.registration_of(1) not in (None, first_registration),
        "the link sees broker 1's new registration",
    )
    manager.replicas.on_follower_fetch(TOPIC, 0, 1, 0)
    return leader


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


def controller(link: ClusterLink) -> LeaderElector:
    """The coordinator's election passes (elect_once), unfenced."""
    return LeaderElector(link.client, link.keys, preferred_interval_ms=0)


def test_an_isr_change_is_written_only_against_the_state_it_was_computed_from(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    async def scenario(
        manager: PartitionManager, link: ClusterLink, leader: PartitionReplication
    ) -> None:
        answers = answers_of_isr_writer(manager)
        # The link's application of new states to t-0 waits, from here.
        held: list[dict[str, Any]] = []
        set_role = manager.replicas.set_role

        def held_set_role(topic: str, partition: int, **kwargs: Any) -> Any:
            held.append({"topic": topic, "partition": partition, **kwargs})
            return leader

        manager.replicas.set_role = held_set_role  # type: ignore[method-assign]

        # The controller's pass: broker 1 registered after the state was
        # written, so it leaves the ISR, in the same epoch.
        assert await controller(link).elect_once(None, preferred=False) == 1
        assert await etcd_isr(link) == (0,)
        await eventually(lambda: bool(held), "the link's view has ISR [0]")
        view_state = link.view.state(link.view.topics[TOPIC], 0)
        assert view_state is not None and view_state.isr == [0]
        assert leader.isr == [0, 1]

        # Broker 2 catches up now: it is proposed for the ISR.
        manager.replicas.on_follower_fetch(TOPIC, 0, 2, LEO)
        await eventually(lambda: bool(answers), "the ISR writer answers")
        # etcd's ISR must not name broker 1 again: its log is empty.
        assert 1 not in await etcd_isr(link), "the leader's write put broker 1 back into the ISR"

        # Once the state is applied, broker 2's next fetch joins it.
        manager.replicas.set_role = set_role  # type: ignore[method-assign]
        for call in held:
            set_role(**call)
        assert leader.isr == [0]
        manager.replicas.on_follower_fetch(TOPIC, 0, 2, LEO)
        await eventually(lambda: leader.isr == [0, 2], "broker 2 joins the ISR")
        assert await etcd_isr(link) == (0, 2)

    run_leader(etcd, tmp_path, scenario)


def test_an_isr_change_does_not_keep_a_member_that_restarted_since_the_state(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """The leader's write comes before the controller's pass: it must not
    keep broker 1 (registered after the state it writes against), or the
    ISR would name broker 1 in a state newer than its registration, and the
    controller would no longer see that it restarted."""

    async def scenario(
        manager: PartitionManager, link: ClusterLink, leader: PartitionReplication
    ) -> None:
        answers = answers_of_isr_writer(manager)
        # Broker 2 catches up: it is proposed for the ISR, [0, 1, 2].
        manager.replicas.on_follower_fetch(TOPIC, 0, 2, LEO)
        await eventually(lambda: bool(answers), "the ISR writer answers")
        # Refused: the state is still older than broker 1's registration.
        state = await link.client.get(link.keys.partition_state(TOPIC, 0))
        broker_1 = await link.client.get(link.keys.broker(1))
        assert state is not None and broker_1 is not None
        assert state.mod_revision < broker_1.create_revision, (
            f"the leader's write kept broker 1 in ISR {await etcd_isr(link)}: it no longer "
            "looks restarted to the controller"
        )
        assert answers == [False]
        # The controller's pass removes broker 1; then broker 2 joins.
        assert await controller(link).elect_once(None, preferred=False) == 1
        await eventually(lambda: leader.isr == [0], "the watch brings ISR [0]")
        manager.replicas.on_follower_fetch(TOPIC, 0, 2, LEO)
        await eventually(lambda: leader.isr == [0, 2], "broker 2 joins the ISR")
        assert await etcd_isr(link) == (0, 2)

    run_leader(etcd, tmp_path, scenario)
