"""A replica whose log lost a torn tail at the broker's restart is listed in
the broker's registration (`torn_partitions`), and the controller elects
it nowhere until it caught up (records of its leader's epoch up to the
leader's high watermark): a partition whose other ISR member is down waits
for that member instead.

The soak (tests/fault, `make soak`) kills a leader and tears a follower's
active segment at once. With the ISR being those two, the partition went
leaderless, the torn follower registered first and was elected ("the best
there is": the only live ISR member), and every other replica truncated to
its cut: 1.15 M of 4.5 M acknowledged records lost in one 300 s run.

A real ClusterLink and PartitionManager (broker 0) on a real etcd, with the
real controller code (LeaderElector) run pass by pass; brokers 1 and 2 are
registrations only.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest
from tidelog.records import encode_batch, iter_batches
from tidelog_broker.replica_state import Role
from tidelog_coordinator.leader_election import LeaderElector
from tidelog_server.etcd.records import BrokerRegistration, PartitionState, TopicAssignment

from tests.support.etcd import EtcdProcess
from tests.unit.broker.in_process_broker import InProcessBroker, eventually

TOPIC = "t"
ME = 0


def replicated(base_offset: int, count: int, epoch: int) -> bytes:
    """A batch as a leader of `epoch` stored it at `base_offset`."""
    return encode_batch(
        [b"replicated"] * count, base_offset=base_offset, partition_leader_epoch=epoch
    )


@pytest.mark.parametrize("catch_up", ["records_of_the_epoch", "the_leaders_log_end"])
def test_a_torn_replica_is_listed_and_not_elected_until_the_other_isr_member_returns(
    etcd: EtcdProcess, tmp_path: Path, catch_up: str
) -> None:
    """`catch_up`: how it becomes electable again: records of its new
    leader's epoch up to the high watermark, or (a leader that writes
    nothing) reaching the log end its leader says it has. Without the
    second, an idle partition's torn replica stayed torn for good, and with
    every ISR member torn the first one led, cut or not (a 900 s soak lost
    acknowledged records that way)."""
    prefix = f"/torn-{uuid.uuid4().hex}"
    data_dir = tmp_path / "broker-0"

    async def run() -> None:
        # First incarnation: leads t-0 alone and writes 3 batches.
        first = InProcessBroker(etcd, prefix, data_dir, ME)
        client, keys = first.client, first.keys
        try:
            await first.start()
            topic = TopicAssignment(TOPIC, uuid.uuid4().hex, ((ME, 1, 2),), {})
            await client.put(keys.topic(TOPIC), topic.encode())
            await client.put(keys.partition_state(TOPIC, 0), PartitionState(ME, 1, (ME,)).encode())
            await eventually(lambda: first.role(TOPIC, 0) is Role.LEADER, "leading")
            partition_log = first.manager.partition_log(TOPIC, 0)
            for i in range(3):
                records = bytearray(encode_batch([b"record-%d" % i] * 10))
                partition_log.append(records, list(iter_batches(records, None)))
            assert partition_log.log_end_offset == 30
            segment = sorted(partition_log.directory.glob("*.log"))[-1]
        finally:
            await first.stop()
        # Its last batch torn (a crash that lost what was not on disk yet).
        os.truncate(segment, segment.stat().st_size - 7)

        # Meanwhile: the ISR was [2, 0], both went down, and the partition
        # is leaderless; broker 2 (which has every record) is not back yet.
        await client.put(keys.broker(1), BrokerRegistration(1, "127.0.0.1", 1).encode())
        await client.put(keys.partition_state(TOPIC, 0), PartitionState(-1, 5, (2, ME)).encode())
        elector = LeaderElector(client, keys, preferred_interval_ms=0)

        async def state() -> PartitionState:
            got = await client.get(keys.partition_state(TOPIC, 0))
            return PartitionState.decode(got.value)

        second = InProcessBroker(etcd, prefix, data_dir, ME)
        try:
            await second.start()
            await eventually(lambda: second.role(TOPIC, 0) is Role.NONE, "hosted, leaderless")
            assert second.manager.partition_log(TOPIC, 0).log_end_offset == 20
            assert second.manager.logs.torn_partitions() == [(TOPIC, 0)]

            async def listed() -> bool:
                got = await client.get(keys.broker(ME))
                return BrokerRegistration.decode(got.value).torn_partitions != ()

            async with asyncio.timeout(20):
                while not await listed():
                    await asyncio.sleep(0.02)
            # Listed once its logs are hosted: no longer starting.
            got = await client.get(keys.broker(ME))
            assert not BrokerRegistration.decode(got.value).starting

            # The torn replica is the only live ISR member: not elected.
            await elector.elect_once(None, preferred=False)
            assert (await state()).leader == -1, await state()

            # Broker 2 returns: it leads, the torn replica stays in the ISR.
            await client.put(keys.broker(2), BrokerRegistration(2, "127.0.0.1", 1).encode())
            await elector.elect_once(None, preferred=False)
            assert await state() == PartitionState(2, 6, (2, ME), 2), await state()

            # Following broker 2, it is torn until it holds records of epoch
            # 6 up to the leader's high watermark; then it is electable.
            await eventually(lambda: second.role(TOPIC, 0) is Role.FOLLOWER, "following 2")
            replicas = second.manager.replicas
            if catch_up == "records_of_the_epoch":
                replicas.append_replicated(TOPIC, 0, replicated(20, 10, epoch=6), 35)
                assert second.manager.logs.torn_partitions() == [(TOPIC, 0)]
                replicas.append_replicated(TOPIC, 0, replicated(30, 5, epoch=6), 35)
            else:
                # Leader 2 holds 25 records (its high watermark 20) and
                # writes nothing in epoch 6. An answer from an older leader
                # (no log end) or with records still to come leaves it torn.
                replicas.append_replicated(TOPIC, 0, b"", 20)
                assert second.manager.logs.torn_partitions() == [(TOPIC, 0)]
                replicas.append_replicated(TOPIC, 0, b"", 20, leader_log_end_offset=25)
                assert second.manager.logs.torn_partitions() == [(TOPIC, 0)]
                replicas.append_replicated(
                    TOPIC, 0, replicated(20, 5, epoch=5), 20, leader_log_end_offset=25
                )
            assert second.manager.logs.torn_partitions() == []
            async with asyncio.timeout(20):
                while await listed():
                    await asyncio.sleep(0.02)
        finally:
            await second.stop()

    asyncio.run(run())
