"""A partition log that a storage failure takes offline is listed in the
broker's etcd registration (`offline_partitions`), and the controller's
election pass, reading it there, drops the replica from the ISR (a
follower) or moves leadership off it (a leader) in a new epoch, which the
broker's watch then applies.

Before, nobody told the controller: the offline follower stayed in the ISR
for replica.lag.time.max.ms (electable meanwhile, if the leader died), and
an offline leader kept leading while answering STORAGE_ERROR to everything.

A real ClusterLink and PartitionManager (broker 0) on a real etcd, with the
real controller code (LeaderElector) run pass by pass; brokers 1 and 2 are
registrations only. The logs go offline through the real reset path: a
directory stands where the reset writes its commit point (`reset-offset`'s
temporary file), so the write fails with IsADirectoryError even as root.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from tidelog.errors import StorageError
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_state import Role
from tidelog_broker.storage import files
from tidelog_coordinator.leader_election import LeaderElector
from tidelog_server.atomic_files import TEMP_SUFFIX
from tidelog_server.etcd.records import BrokerRegistration, PartitionState, TopicAssignment

from tests.support.etcd import EtcdProcess
from tests.unit.broker.in_process_broker import WAIT_S, InProcessBroker, eventually

TOPIC = "t"
ME = 0


def take_offline(manager: PartitionManager, partition: int) -> None:
    """Reset the log of TOPIC-`partition` with its commit point unwritable."""
    directory = manager.partition_log(TOPIC, partition).directory
    (directory / (files.RESET_OFFSET_FILE + TEMP_SUFFIX)).mkdir()
    with pytest.raises(StorageError, match="offline until the broker restarts"):
        manager.replicas.reset_replica(TOPIC, partition, 5)
    assert (TOPIC, partition) in manager.logs.offline_partitions()


def test_offline_logs_are_listed_in_the_registration_and_the_controller_acts(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    async def run() -> None:
        broker = InProcessBroker(etcd, f"/off-{uuid.uuid4().hex}", tmp_path, ME)
        manager, link = broker.manager, broker.link
        client, keys = link.client, link.keys
        elector = LeaderElector(client, keys, preferred_interval_ms=0)

        async def state(partition: int) -> PartitionState:
            got = await client.get(keys.partition_state(TOPIC, partition))
            return PartitionState.decode(got.value)

        async def my_registration() -> tuple[BrokerRegistration, int, int]:
            got = await client.get(keys.broker(ME))
            return BrokerRegistration.decode(got.value), got.create_revision, got.lease

        async def listed(expected: tuple[tuple[str, int], ...]) -> None:
            async with asyncio.timeout(WAIT_S):
                while (await my_registration())[0].offline_partitions != expected:
                    await asyncio.sleep(0.02)

        try:
            await broker.start()
            for other in (1, 2):
                registration = BrokerRegistration(other, "127.0.0.1", 1)
                await client.put(keys.broker(other), registration.encode())
            # t-0: broker 1 leads, we follow; t-1: we lead. Everyone in sync.
            topic = TopicAssignment(TOPIC, uuid.uuid4().hex, ((1, ME, 2), (ME, 1, 2)), {})
            await client.put(keys.topic(TOPIC), topic.encode())
            await client.put(
                keys.partition_state(TOPIC, 0), PartitionState(1, 3, (1, ME, 2)).encode()
            )
            await client.put(
                keys.partition_state(TOPIC, 1), PartitionState(ME, 3, (ME, 1, 2)).encode()
            )

            def role(partition: int) -> Role | None:
                r = manager.replicas.replication(TOPIC, partition)
                return None if r is None else r.role

            await eventually(
                lambda: role(0) is Role.FOLLOWER and role(1) is Role.LEADER, "roles applied"
            )
            before, created, lease = await my_registration()
            assert before.offline_partitions == ()
            assert await elector.elect_once(None, preferred=False) == 0

            # The follower's log goes offline: listed, and it leaves the ISR
            # in the same epoch (only the leader adds to an ISR in an epoch).
            take_offline(manager, 0)
            await listed(((TOPIC, 0),))
            assert await elector.elect_once(None, preferred=False) == 1
            assert await state(0) == PartitionState(1, 3, (1, 2), 2)
            assert await state(1) == PartitionState(ME, 3, (ME, 1, 2))

            # The leader's log goes offline: listed, and broker 1 leads t-1
            # in a new epoch, which this broker applies (it follows now).
            take_offline(manager, 1)
            await listed(((TOPIC, 0), (TOPIC, 1)))
            assert await elector.elect_once(None, preferred=False) == 1
            assert await state(1) == PartitionState(1, 4, (1, 2), 2)
            await eventually(lambda: role(1) is Role.FOLLOWER, "leadership moved off")

            # Still the same registration (same key incarnation and lease):
            # followers' fetches and ISR expansions bound to it stay valid.
            after, created_after, lease_after = await my_registration()
            assert (created_after, lease_after) == (created, lease)
            assert (after.host, after.port, after.max_partitions) == (
                before.host,
                before.port,
                before.max_partitions,
            )
            assert link.view.registration_of(ME) == created
        finally:
            await broker.stop()

    asyncio.run(run())
