"""A partition log that fails to OPEN on a broker (an unreadable checkpoint
here; EIO or a deleted topic's directory that cannot be renamed aside go
the same way) is hosted offline: the broker hosts the topic's other
partitions, lists that one in its registration's `offline_partitions`, and
the controller elects another replica for it, or moves leadership off it.

Before, the topic's requested partitions opened "all of them, or none":
the hosting of the whole topic failed (logged, retried only at the next
etcd change of the topic or a restart), so its healthy partitions on this
broker were not hosted either, and the failing one was not listed offline,
so the controller elected this broker for it (a leader that cannot serve)
or left it leading.

A real ClusterLink and PartitionManager (broker 0) on a real etcd, with the
coordinator's real LeaderElector run pass by pass; broker 1 is a
registration only. The unreadable checkpoint is the cleaner's (garbage in
`cleaner-checkpoint`, which open refuses as damage from outside, even as
root), or the reset's commit point (`reset-offset`).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from tidelog.errors import StorageError
from tidelog.records import encode_batch, iter_batches
from tidelog_broker.replica_state import Role
from tidelog_broker.storage import files
from tidelog_coordinator.leader_election import LeaderElector
from tidelog_server.etcd.records import BrokerRegistration, PartitionState, TopicAssignment

from tests.support.etcd import EtcdProcess
from tests.unit.broker.in_process_broker import InProcessBroker, eventually

TOPIC = "t"
ME = 0
OTHER = 1


def spoil(data_dir: Path, partition: int, checkpoint: str = files.CLEANER_CHECKPOINT_FILE) -> Path:
    """Make the log directory of TOPIC-`partition` fail to open: garbage in
    `checkpoint`, a file written atomically whose damage open refuses to
    guess around. Returns the file."""
    directory = data_dir / files.log_dir_name(TOPIC, partition)
    directory.mkdir(exist_ok=True)
    path = directory / checkpoint
    path.write_text("not a checkpoint\n")
    return path


class Broker(InProcessBroker):
    """Broker ME in process: manager and cluster link on `data_dir`."""

    def __init__(self, etcd: EtcdProcess, prefix: str, data_dir: Path) -> None:
        super().__init__(etcd, prefix, data_dir, ME)

    async def hosts(self, partitions: list[int]) -> None:
        await eventually(
            lambda: self.manager.logs.hosted_partitions(TOPIC) == partitions,
            f"broker {ME} hosts {TOPIC} {partitions}",
        )

    async def state(self, partition: int) -> PartitionState:
        got = await self.client.get(self.keys.partition_state(TOPIC, partition))
        return PartitionState.decode(got.value)


def test_one_log_that_cannot_be_opened_leaves_the_others_hosted_and_is_listed_offline(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """t-0 (leaderless, this broker first in the ISR) and t-3 (led by this
    broker) cannot be opened; t-1 (led here) and t-2 (followed) can."""

    async def run() -> None:
        broker = Broker(etcd, f"/openfail-{uuid.uuid4().hex}", tmp_path)
        client, keys = broker.client, broker.keys
        elector = LeaderElector(client, keys, preferred_interval_ms=0)
        try:
            await broker.start()
            # After the start: its first listing deletes the logs of topics
            # etcd does not have (strays).
            spoil(tmp_path, 0)
            spoil(tmp_path, 3, files.RESET_OFFSET_FILE)
            await client.put(keys.broker(OTHER), BrokerRegistration(OTHER, "127.0.0.1", 1).encode())
            replicas = ((ME, OTHER), (ME, OTHER), (OTHER, ME), (ME, OTHER))
            topic = TopicAssignment(TOPIC, uuid.uuid4().hex, replicas, {})
            await client.put(keys.topic(TOPIC), topic.encode())
            states = {
                0: PartitionState(-1, 3, (ME, OTHER)),
                1: PartitionState(ME, 3, (ME, OTHER)),
                2: PartitionState(OTHER, 3, (OTHER, ME)),
                3: PartitionState(ME, 3, (ME, OTHER)),
            }
            for partition, state in states.items():
                await client.put(keys.partition_state(TOPIC, partition), state.encode())

            # Every partition hosted; the two that cannot be opened offline,
            # and listed so in the registration.
            await broker.hosts([0, 1, 2, 3])
            await broker.until_listed(((TOPIC, 0), (TOPIC, 3)))
            assert broker.manager.logs.offline_partitions() == [(TOPIC, 0), (TOPIC, 3)]
            with pytest.raises(StorageError, match=r"opening it failed.*cleaner-checkpoint"):
                broker.manager.partition_log(TOPIC, 0)
            with pytest.raises(StorageError, match=r"opening it failed.*reset-offset"):
                broker.manager.partition_log(TOPIC, 3)

            # The others serve in their roles; the leader's epoch, recorded
            # while its log opened, is in its history.
            await eventually(
                lambda: (
                    broker.role(TOPIC, 1) is Role.LEADER and broker.role(TOPIC, 2) is Role.FOLLOWER
                ),
                "roles of the healthy partitions applied",
            )
            led = broker.manager.partition_log(TOPIC, 1)
            assert led.leader_epochs.entries == [(3, 0)]
            data = bytearray(encode_batch([b"a", b"b"]))
            assert led.append(data, list(iter_batches(data))).last_offset == 1
            assert broker.manager.partition_log(TOPIC, 2).offline is None

            # The controller elects the other replica for t-0, not this
            # broker, and moves t-3's leadership off it; t-1 and t-2 stay.
            await elector.elect_once(None, preferred=False)
            for partition in (0, 3):
                state = await broker.state(partition)
                assert state.leader == OTHER, (partition, state)
                assert state.leader_epoch == 4, (partition, state)
                assert ME not in state.isr, (partition, state)
            assert await broker.state(1) == states[1]
            assert await broker.state(2) == states[2]
            # This broker follows them now (an offline log may follow; the
            # fetcher leaves it alone), and keeps leading t-1.
            await eventually(
                lambda: (
                    broker.role(TOPIC, 0) is Role.FOLLOWER
                    and broker.role(TOPIC, 3) is Role.FOLLOWER
                ),
                "the offline logs follow the new leader",
            )
            assert broker.role(TOPIC, 1) is Role.LEADER
            assert await broker.listed_offline() == ((TOPIC, 0), (TOPIC, 3))
        finally:
            await broker.stop()

    asyncio.run(run())


def test_a_restart_with_one_unreadable_log_hosts_the_rest_and_a_repaired_one_comes_back(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """Cluster mode opens its logs at the first listing after start-up: one
    that cannot be opened is listed offline, the rest are hosted; once the
    damage is repaired, the next restart opens it and lists nothing."""
    prefix = f"/openfail-{uuid.uuid4().hex}"

    async def run() -> None:
        broker = Broker(etcd, prefix, tmp_path)
        try:
            await broker.start()
            topic = TopicAssignment(TOPIC, uuid.uuid4().hex, ((ME,), (ME,)), {})
            await broker.client.put(broker.keys.topic(TOPIC), topic.encode())
            for partition in (0, 1):
                await broker.client.put(
                    broker.keys.partition_state(TOPIC, partition),
                    PartitionState(ME, 1, (ME,)).encode(),
                )
            await eventually(
                lambda: (
                    broker.role(TOPIC, 0) is Role.LEADER and broker.role(TOPIC, 1) is Role.LEADER
                ),
                "leading both",
            )
            for partition in (0, 1):
                partition_log = broker.manager.partition_log(TOPIC, partition)
                data = bytearray(encode_batch([b"x%d" % partition]))
                partition_log.append(data, list(iter_batches(data)))
        finally:
            await broker.stop()

        spoiled = spoil(tmp_path, 0)
        broker = Broker(etcd, prefix, tmp_path)
        try:
            await broker.start()
            await broker.hosts([0, 1])
            await broker.until_listed(((TOPIC, 0),))
            assert broker.manager.logs.hosted_log(TOPIC, 0).offline is not None
            assert broker.manager.partition_log(TOPIC, 1).log_end_offset == 1
        finally:
            await broker.stop()
        # Its files untouched by the broker that could not open it.
        assert spoiled.read_text() == "not a checkpoint\n"

        spoiled.unlink()
        broker = Broker(etcd, prefix, tmp_path)
        try:
            await broker.start()
            await broker.hosts([0, 1])
            assert broker.manager.logs.offline_partitions() == []
            assert await broker.listed_offline() == ()
            assert broker.manager.partition_log(TOPIC, 0).log_end_offset == 1
        finally:
            await broker.stop()

    asyncio.run(run())
