"""Consumer groups through real coordinator processes on a real etcd."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from tidelog.errors import IllegalGenerationError, NonEmptyGroupError, UnknownMemberIdError
from tidelog.group import GroupMembership, OffsetAndMetadata, OffsetStoreClient
from tidelog.types import TopicPartition
from tidelog.v1 import common_pb2, group_pb2, group_pb2_grpc

from tests.integration.coordinator.conftest import StartCoordinator
from tests.integration.coordinator.group_support import setup_topic
from tests.integration.coordinator.helpers import etcd_client, eventually
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(60)

SESSION_MS = 2_000
REPO = Path(__file__).resolve().parents[3]


class Recorder:
    """A rebalance listener that remembers every call."""

    def __init__(self) -> None:
        self.revoked: list[frozenset[TopicPartition]] = []
        self.assigned: list[frozenset[TopicPartition]] = []

    def on_partitions_revoked(self, revoked: frozenset[TopicPartition]) -> None:
        self.revoked.append(revoked)

    def on_partitions_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        self.assigned.append(assigned)


def settled(members: Sequence[GroupMembership], partitions: int) -> bool:
    owned = [m.assignment for m in members]
    union = frozenset().union(*owned)
    sizes = [len(o) for o in owned]
    return (
        sum(sizes) == partitions
        and len(union) == partitions
        and max(sizes) - min(sizes) <= 1
        and len({m.member_epoch for m in members}) == 1
    )


async def wait_settled(
    members: Sequence[GroupMembership], partitions: int, timeout_s: float
) -> float:
    async def check() -> bool:
        return settled(members, partitions)

    return await eventually(check, timeout_s, "the group to settle", interval_s=0.01)


async def describe(address: str, group: str) -> group_pb2.DescribeGroupResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        return await group_pb2_grpc.GroupStub(channel).DescribeGroup(
            group_pb2.DescribeGroupRequest(group_id=group)
        )


def test_three_members_then_a_fourth_moves_only_its_share(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()

    async def run() -> None:
        await setup_topic(etcd, prefix, coordinator.address, "t", 12)
        listeners = [Recorder() for _ in range(4)]
        members = [
            GroupMembership(coordinator.address, "g", topics=["t"], session_timeout_ms=SESSION_MS,
                            listener=listeners[i])
            for i in range(4)
        ]  # fmt: skip
        try:
            for m in members[:3]:
                await m.start()
            await wait_settled(members[:3], 12, 30)
            before = [m.assignment for m in members[:3]]
            for listener in listeners[:3]:
                listener.revoked.clear()
            await members[3].start()
            # How long this takes is measured by bench/group_bench.py (rebalance 3->4).
            await wait_settled(members, 12, 30)
            # Cooperative-sticky: each old member gave up exactly one partition,
            # the only ones revoked, and kept the rest without interruption.
            for i in range(3):
                revoked = frozenset().union(*listeners[i].revoked)
                assert revoked == before[i] - members[i].assignment
                assert len(revoked) == 1 and members[i].assignment <= before[i]
            assert (
                listeners[3].assigned
                and frozenset().union(*listeners[3].assigned) == members[3].assignment
            )

            async def stable() -> bool:
                described = await describe(coordinator.address, "g")
                return described.state == "Stable" and len(described.members) == 4

            await eventually(stable, 2, "the coordinator to see every acknowledgement")
        finally:
            for m in members:
                await m.close()

    asyncio.run(run())


def test_a_killed_members_partitions_move_once_its_session_expires(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()

    async def run() -> None:
        await setup_topic(etcd, prefix, coordinator.address, "t", 12)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.integration.coordinator.member_proc",
                 coordinator.address, "g", "t", str(SESSION_MS)],
                stdout=subprocess.PIPE, env=env, cwd=REPO,
            )
            for _ in range(3)
        ]  # fmt: skip
        try:

            async def all_assigned() -> bool:
                d = await describe(coordinator.address, "g")
                return (
                    d.state == "Stable"
                    and len(d.members) == 3
                    and all(len(m.owned) == 4 for m in d.members)
                )

            await eventually(all_assigned, 15, "3 subprocess members to own 4 partitions each")
            os.kill(procs[0].pid, signal.SIGKILL)
            procs[0].wait()

            async def two_own_all() -> bool:
                d = await describe(coordinator.address, "g")
                owned = [frozenset((tp.topic, tp.partition) for tp in m.owned) for m in d.members]
                return (
                    len(d.members) == 2
                    and d.state == "Stable"
                    and len(frozenset().union(*owned)) == 12
                    and sum(map(len, owned)) == 12
                )

            # Only the session's expiry moves them (the member neither left nor
            # heartbeats); bench/group_bench.py measures how long it takes.
            await eventually(two_own_all, 30, "the survivors to own all 12 partitions")
        finally:
            for p in procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                p.wait()

    asyncio.run(run())


def test_static_member_restart_within_timeout_keeps_partitions_without_rebalance(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()

    async def run() -> None:
        await setup_topic(etcd, prefix, coordinator.address, "t", 6)
        members = [
            GroupMembership(coordinator.address, "g", topics=["t"], session_timeout_ms=5_000,
                            group_instance_id=f"pod-{i}")
            for i in range(2)
        ]  # fmt: skip
        replacement = GroupMembership(
            coordinator.address, "g", topics=["t"], session_timeout_ms=5_000,
            group_instance_id="pod-0",
        )  # fmt: skip
        try:
            for m in members:
                await m.start()
            await wait_settled(members, 6, 30)
            epoch = (await describe(coordinator.address, "g")).group_epoch
            mine = members[0].assignment
            old_member_id, old_token = members[0].member_id, members[0].member_token
            await members[0].close()  # static: no leave, the session stays
            await replacement.start()
            await replacement.wait_for(lambda m: m.assignment == mine, timeout_s=5)
            after = await describe(coordinator.address, "g")
            assert after.group_epoch == epoch  # no rebalance
            assert replacement.member_id != old_member_id
            assert (
                members[1].assignment == frozenset(TopicPartition("t", p) for p in range(6)) - mine
            )
            # The old process's member id is fenced.
            offsets = OffsetStoreClient(coordinator.address)
            with pytest.raises(UnknownMemberIdError):
                await offsets.commit("g", {next(iter(mine)): 1}, member_id=old_member_id,
                                     member_epoch=epoch, member_token=old_token)  # fmt: skip
            await offsets.close()
        finally:
            for m in (*members, replacement):
                await m.close(leave=True)

    asyncio.run(run())


def test_zombie_cannot_commit_and_offsets_round_trip(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()

    async def run() -> None:
        await setup_topic(etcd, prefix, coordinator.address, "t", 4)
        offsets = OffsetStoreClient(coordinator.address)
        member = GroupMembership(
            coordinator.address, "g", topics=["t"], session_timeout_ms=SESSION_MS
        )
        try:
            await member.start()
            await member.wait_for(lambda m: len(m.assignment) == 4, timeout_s=5)
            commit = {
                tp: OffsetAndMetadata(10 + tp.partition, f"m{tp.partition}")
                for tp in member.assignment
            }
            await member.commit(commit)
            fetched = await offsets.fetch("g")
            assert fetched == commit
            # A stale epoch is fenced.
            with pytest.raises(IllegalGenerationError):
                await offsets.commit("g", {TopicPartition("t", 0): 1}, member_id=member.member_id,
                                     member_epoch=member.member_epoch - 1,
                                     member_token=member.member_token)  # fmt: skip
            # Admin commits are refused while the group has members.
            with pytest.raises(NonEmptyGroupError):
                await offsets.alter("g", {TopicPartition("t", 0): 0})
            # The member freezes (its process is paused: no heartbeats): its
            # session expires and it becomes a zombie that cannot commit.
            zombie_id, zombie_epoch = member.member_id, member.member_epoch
            zombie_token = member.member_token
            await member._stop_task()

            async def expired() -> bool:
                return not (await describe(coordinator.address, "g")).members

            # Waits for the expiry itself, not for a guess of how long it takes.
            await eventually(expired, 30, "the frozen member's session to expire")
            with pytest.raises((UnknownMemberIdError, IllegalGenerationError)):
                await offsets.commit("g", {TopicPartition("t", 0): 99}, member_id=zombie_id,
                                     member_epoch=zombie_epoch,
                                     member_token=zombie_token)  # fmt: skip
            assert (await offsets.fetch("g", [TopicPartition("t", 0)]))[
                TopicPartition("t", 0)
            ].offset == 10
            # The group is empty now: an admin reset (generation -1) works.
            await offsets.alter("g", {TopicPartition("t", 0): 0})
            assert (await offsets.fetch("g"))[TopicPartition("t", 0)].offset == 0
            async with grpc.aio.insecure_channel(coordinator.address) as channel:
                stub = group_pb2_grpc.GroupStub(channel)
                listed = await stub.ListGroups(group_pb2.ListGroupsRequest())
                assert [(g.group_id, g.state) for g in listed.groups] == [("g", "Empty")]
                deleted = await stub.DeleteGroup(group_pb2.DeleteGroupRequest(group_id="g"))
                assert deleted.error.code == common_pb2.NONE
                again = await stub.DeleteGroup(group_pb2.DeleteGroupRequest(group_id="g"))
                assert again.error.code == common_pb2.GROUP_ID_NOT_FOUND
            assert await offsets.fetch("g") == {}
        finally:
            await member.close(leave=False)
            await offsets.close()

    asyncio.run(run())


def test_commit_is_one_etcd_transaction(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()

    async def run() -> None:
        await setup_topic(etcd, prefix, coordinator.address, "t", 50)
        offsets = OffsetStoreClient(coordinator.address)
        async with etcd_client(etcd.endpoint) as client:

            async def altered() -> bool:
                # The coordinator learns of the new topic by its etcd watch, which may
                # lag CreateTopics' answer under load; a refused alter writes nothing.
                nonlocal before
                before = (await client.get_prefix(f"{prefix}/none".encode())).header.revision
                await offsets.alter("g", {TopicPartition("t", p): p for p in range(50)})
                return True

            before = 0
            await eventually(altered, 30, "the coordinator knows topic t")
            listing = await client.get_prefix(f"{prefix}/offsets/".encode())
            # One transaction = one revision for all 50 keys.
            assert len(listing) == 50 and {kv.mod_revision for kv in listing} == {before + 1}
        await offsets.close()

    asyncio.run(run())


def test_group_recovers_from_an_etcd_restart_and_a_coordinator_failover(
    tmp_path: Path, prefix: str
) -> None:
    from tests.support.coordinator import start_coordinator

    etcd = EtcdProcess.start(tmp_path / "own-etcd")
    started = []
    try:
        first = start_coordinator(
            etcd.endpoint, tmp_path / "logs", prefix=prefix, coordinator_id="a"
        )
        second = start_coordinator(
            etcd.endpoint, tmp_path / "logs", prefix=prefix, coordinator_id="b"
        )
        started = [first, second]

        async def run() -> None:
            await setup_topic(etcd, prefix, first.address, "t", 12)
            bootstrap = [first.address, second.address]
            members = [
                GroupMembership(bootstrap, "g", topics=["t"], session_timeout_ms=5_000)
                for _ in range(3)
            ]
            try:
                for m in members:
                    await m.start()
                await wait_settled(members, 12, 60)
                ids = [m.member_id for m in members]
                etcd.restart()
                # After the restart, the watches resume: a new member is seen
                # and gets its share, with no service restarted.
                fourth = GroupMembership(bootstrap, "g", topics=["t"], session_timeout_ms=5_000)
                members.append(fourth)
                await fourth.start()
                await wait_settled(members, 12, 60)
                assert [m.member_id for m in members[:3]] == ids  # sessions survived
                # The controller role is still held (re-elected if needed).
                async with grpc.aio.insecure_channel(second.address) as channel:
                    from tidelog.v1 import cluster_pb2, cluster_pb2_grpc

                    async def has_controller() -> bool:
                        reply = await cluster_pb2_grpc.ClusterStub(channel).DescribeCluster(
                            cluster_pb2.DescribeClusterRequest(), timeout=2
                        )
                        return reply.controller_id in ("a", "b")

                    await eventually(has_controller, 10, "a controller after the etcd restart")
                # The replica serving the members dies: they move to the other
                # one and keep their partitions (no rebalance needed).
                owned = [m.assignment for m in members]
                first.kill()
                await asyncio.sleep(1.0)
                offsets = OffsetStoreClient(second.address)
                for m in members:
                    await m.commit({next(iter(m.assignment)): 5})
                await offsets.close()
                assert [m.assignment for m in members] == owned
            finally:
                for m in members:
                    await m.close()

        asyncio.run(run())
    finally:
        for process in started:
            process.stop()
        etcd.stop()
