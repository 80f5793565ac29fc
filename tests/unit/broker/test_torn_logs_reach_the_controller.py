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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from tidelog.admin import _description
from tidelog.cli.topics import partition_table
from tidelog.records import encode_batch, iter_batches
from tidelog.types import TopicDescription
from tidelog.v1 import admin_pb2
from tidelog_broker.replica_state import Role
from tidelog_coordinator.leader_election import LeaderElector
from tidelog_server.etcd import connect
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import BrokerRegistration, PartitionState, TopicAssignment

from tests.support.coordinator_describe import describe_topic
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
            # The coordinator's DescribeTopics names it, and why the
            # partition waits (before, nothing told it from any other
            # leaderless partition).
            described = await describe(client, keys)
            assert list(described.torn_replicas) == [ME]
            assert (
                "in-sync broker 0 may have lost the tail of its log at restart and is not "
                "elected while in-sync "
                "broker 2 may return (start it again;"
            ) in described.error.message, described.error.message
            (partition,) = _description(
                admin_pb2.TopicDescription(partitions=[described])
            ).partitions
            assert partition.torn_replicas == [ME]
            header, row = partition_table(TopicDescription(TOPIC, [partition], {}))
            assert header[-1] == "torn" and row[-1] == "0"

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


async def describe(client: Any, keys: Keys) -> admin_pb2.PartitionDescription:
    """TOPIC's partition 0 as a coordinator's DescribeTopics answers it over
    gRPC (the real servicer, on the test's etcd)."""
    return (await describe_topic(client, keys, TOPIC)).partitions[0]


async def torn_incarnation(
    etcd: EtcdProcess, prefix: str, data_dir: Path, broker: int, batches: int
) -> None:
    """Broker `broker` leads TOPIC-0 alone in epoch 1 and writes `batches`
    batches of 10 records; it stops, and its last batch is torn (a crash
    that lost what was not on disk yet): its log then ends at
    10 * (batches - 1)."""
    first = InProcessBroker(etcd, prefix, data_dir, broker)
    client, keys = first.client, first.keys
    try:
        await first.start()
        await client.put(
            keys.partition_state(TOPIC, 0), PartitionState(broker, 1, (broker,)).encode()
        )
        await eventually(lambda: first.role(TOPIC, 0) is Role.LEADER, f"{broker} leading")
        partition_log = first.manager.partition_log(TOPIC, 0)
        for i in range(batches):
            records = bytearray(encode_batch([b"record-%d" % i] * 10))
            partition_log.append(records, list(iter_batches(records, None)))
        segment = sorted(partition_log.directory.glob("*.log"))[-1]
    finally:
        await first.stop()
    os.truncate(segment, segment.stat().st_size - 7)


@pytest.mark.parametrize("longer", [0, 1])
def test_of_torn_isr_members_all_back_the_one_whose_log_holds_the_most_leads(
    etcd: EtcdProcess, tmp_path: Path, longer: int
) -> None:
    """Leader and follower (ISR [0, 1]) crashed together and each cut its
    own torn tail at restart: the one whose log holds more leads, whatever
    the placement order. Before, the first in placement order (broker 0)
    led, and broker 1 truncated to its shorter log, losing records it had
    acknowledged as an ISR member."""
    prefix = f"/torn-{uuid.uuid4().hex}"
    shorter = 1 - longer

    async def run() -> None:
        client = connect(etcd.endpoint)
        keys = Keys(prefix)
        topic = TopicAssignment(TOPIC, uuid.uuid4().hex, ((0, 1, 2),), {})
        await client.put(keys.topic(TOPIC), topic.encode())
        await torn_incarnation(etcd, prefix, tmp_path / f"broker-{longer}", longer, batches=4)
        await torn_incarnation(etcd, prefix, tmp_path / f"broker-{shorter}", shorter, batches=3)
        # Both crashed while in sync; the partition is leaderless.
        await client.put(keys.partition_state(TOPIC, 0), PartitionState(-1, 5, (0, 1)).encode())
        brokers = [InProcessBroker(etcd, prefix, tmp_path / f"broker-{b}", b) for b in (0, 1)]
        try:
            for broker in brokers:
                await broker.start()

            async def published() -> dict[int, tuple[tuple[str, int, int, int], ...]]:
                figures = {}
                for b in (0, 1):
                    got = await client.get(keys.broker(b))
                    figures[b] = BrokerRegistration.decode(got.value).torn_figures
                return figures

            async with asyncio.timeout(20):
                while not all((await published()).values()):
                    await asyncio.sleep(0.02)
            figures = await published()
            assert figures[longer] == ((TOPIC, 0, 1, 30),), figures
            assert figures[shorter] == ((TOPIC, 0, 1, 20),), figures

            elector = LeaderElector(client, keys, preferred_interval_ms=0)
            await elector.elect_once(None, preferred=False)
            got = await client.get(keys.partition_state(TOPIC, 0))
            assert PartitionState.decode(got.value) == PartitionState(longer, 6, (0, 1), 2)
        finally:
            for broker in brokers:
                await broker.stop()
            await client.close()

    asyncio.run(run())


LEADER = 1
FOLLOWER = 0
ACKED_BATCHES = 4


def test_a_follower_cut_at_a_batch_boundary_waits_for_the_leader_that_kept_more(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """The 900 s soak's loss (9.9 M of 13.5 M acknowledged records): leader
    and follower (the ISR) killed together, and the follower's log cut
    exactly at a batch boundary (where a power loss leaves an ext4 file:
    the size of an earlier write()). Its recovery finds no damage, so it
    was not torn: back first, it was elected as the only live ISR member,
    and the leader, back later, truncated every acknowledged record above
    the cut. Now a log not closed cleanly is torn: the partition waits for
    the leader, and with both back the leader (the longer log) leads and
    is listed torn no more; no acknowledged record is lost."""
    prefix = f"/torn-{uuid.uuid4().hex}"

    async def run() -> None:
        client = connect(etcd.endpoint)
        keys = Keys(prefix)
        elector = LeaderElector(client, keys, preferred_interval_ms=0)

        async def state() -> PartitionState:
            got = await client.get(keys.partition_state(TOPIC, 0))
            return PartitionState.decode(got.value)

        async def listed_torn(broker: int) -> tuple[tuple[str, int], ...] | None:
            got = await client.get(keys.broker(broker))
            if got is None:
                return None
            registration = BrokerRegistration.decode(got.value)
            return None if registration.starting else registration.torn_partitions

        async def until_listed(broker: int, torn: tuple[tuple[str, int], ...]) -> None:
            try:
                async with asyncio.timeout(20):
                    while await listed_torn(broker) != torn:
                        await asyncio.sleep(0.02)
            except TimeoutError:
                raise AssertionError(
                    f"broker {broker} lists {await listed_torn(broker)} torn, not {torn}"
                ) from None

        async def eventually_async(check: Callable[[], Awaitable[object]], what: str) -> None:
            try:
                async with asyncio.timeout(20):
                    while await check() is None:
                        await asyncio.sleep(0.02)
            except TimeoutError:
                raise AssertionError(f"not within 20 s: {what}") from None

        def broker(broker_id: int) -> InProcessBroker:
            return InProcessBroker(etcd, prefix, tmp_path / f"broker-{broker_id}", broker_id)

        topic = TopicAssignment(TOPIC, uuid.uuid4().hex, ((LEADER, FOLLOWER, 2),), {})
        await client.put(keys.topic(TOPIC), topic.encode())
        leader, follower = broker(LEADER), broker(FOLLOWER)
        try:
            await leader.start()
            await follower.start()
            # Written after they registered: a broker leads only by a state
            # newer than its registration.
            await client.put(
                keys.partition_state(TOPIC, 0),
                PartitionState(LEADER, 1, (LEADER, FOLLOWER)).encode(),
            )
            await eventually(lambda: leader.role(TOPIC, 0) is Role.LEADER, "1 leading")
            await eventually(lambda: follower.role(TOPIC, 0) is Role.FOLLOWER, "0 following")
            # The leader appends a batch at a time, the follower replicates
            # each (one write() each: its file's size after each is a batch
            # boundary), and the leader's HW passes them all: acknowledged.
            leader_log = leader.manager.partition_log(TOPIC, 0)
            follower_log = follower.manager.partition_log(TOPIC, 0)
            boundaries = []
            for i in range(ACKED_BATCHES):
                records = bytearray(encode_batch([b"acked-%d" % i] * 10, partition_leader_epoch=1))
                info = leader_log.append(records, list(iter_batches(records, None)))
                stored = leader_log.read(info.first_offset, 1 << 20).records
                follower.manager.replicas.append_replicated(TOPIC, 0, bytes(stored), 0)
                boundaries.append(follower_log.segments[-1].log_path.stat().st_size)
            leader.manager.replicas.on_follower_fetch(TOPIC, 0, FOLLOWER, 40)
            replication = leader.manager.replicas.replication(TOPIC, 0)
            assert replication is not None and replication.high_watermark == 40
            acked = bytes(leader_log.read(0, 1 << 20).records)
            segment = follower_log.segments[-1].log_path
        finally:
            await leader.crash()
            await follower.crash()
        # Cut at the end of the follower's second batch: 20 of 40 records.
        os.truncate(segment, boundaries[1])

        # Both gone: the controller leaves the partition leaderless, ISR kept.
        await elector.elect_once(None, preferred=False)
        got = await state()
        assert (got.leader, got.leader_epoch, got.isr) == (-1, 2, (LEADER, FOLLOWER)), got

        follower, leader = broker(FOLLOWER), broker(LEADER)
        try:
            # The follower is back first: torn (not closed cleanly), though
            # its recovery found nothing to cut.
            await follower.start()
            assert follower.manager.partition_log(TOPIC, 0).log_end_offset == 20
            await eventually_async(lambda: listed_torn(FOLLOWER), "0 registered, not starting")
            await elector.elect_once(None, preferred=False)
            # Before: elected, as the only live ISR member (leader 0).
            assert (await state()).leader == -1, await state()
            assert await listed_torn(FOLLOWER) == ((TOPIC, 0),)

            # The leader is back: torn too, and it holds more: it leads.
            await leader.start()
            await until_listed(LEADER, ((TOPIC, 0),))
            await elector.elect_once(None, preferred=False)
            assert (await state()).leader == LEADER, await state()
            await eventually(lambda: leader.role(TOPIC, 0) is Role.LEADER, "1 leading again")
            # Elected, its log is the reference: no longer listed torn
            # (before, it stayed listed until its broker restarted). The
            # follower stays torn until it caught up.
            await until_listed(LEADER, ())
            assert leader.manager.logs.torn_partitions() == []
            await until_listed(FOLLOWER, ((TOPIC, 0),))
            leader_log = leader.manager.partition_log(TOPIC, 0)
            assert leader_log.log_end_offset == 40
            assert bytes(leader_log.read(0, 1 << 20).records) == acked
        finally:
            await leader.stop()
            await follower.stop()
            await client.close()

    asyncio.run(run())
