"""When hosting a topic fails as a whole (out of descriptors, or refused past
max.partitions) while part of it is already hosted here (partitions were
added, and opening the new ones failed), the hosted partitions keep their
roles: a follower keeps fetching from its leader, and a leadership change of
a hosted partition applies at once, whether its state change comes alone or
with a new partition's state (which reconciles the whole topic). The
unhosted partitions get no role; the retry hosts them once the shortage ends.
A hosted partition moved to another broker meanwhile is closed and its log
deleted at once, as when hosting succeeds.

Before, the failure dropped the topic's followed partitions: the replica
fetchers stopped fetching the hosted follower (it would fall out of the ISR)
and its role changes were skipped until a retry succeeded, up to 30 s
without a serving leader.

A real ClusterLink and PartitionManager (broker 0) on a real etcd; broker 1,
the leader, is only named in the partition states (never registered, so its
fetcher dials nothing). The shortage is a real RLIMIT_NOFILE or a real
max.partitions.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from tidelog_broker.replica_state import Role
from tidelog_server.etcd.records import PartitionState, TopicAssignment

from tests.support.etcd import EtcdProcess
from tests.unit.broker.in_process_broker import WAIT_S, InProcessBroker, eventually
from tests.unit.broker.test_a_failed_hosting_is_retried import few_descriptors

TOPIC = "t"
ME = 0
LEADER = 1
ADDED = 8  # more than INLINE_OPEN_MAX: opened in worker threads
#: How far off the next retry must be before a role change is made that a
#: retry must not apply: the change takes milliseconds, a loaded CI machine
#: may take a second or more to deliver it.
RETRY_MARGIN_S = 3.0


class Broker(InProcessBroker):
    def __init__(self, etcd: EtcdProcess, tmp_path: Path, **config: Any) -> None:
        super().__init__(etcd, f"/keepfollowing-{uuid.uuid4().hex}", tmp_path, ME, **config)
        self.topic_id = uuid.uuid4().hex

    def _record(self, partitions: int) -> bytes:
        replicas = tuple((LEADER, ME) for _ in range(partitions))
        return TopicAssignment(TOPIC, self.topic_id, replicas, {}).encode()

    async def create_followed_topic(self) -> None:
        """Topic TOPIC of one partition, led by broker 1 and followed here."""
        await self.client.put(self.keys.topic(TOPIC), self._record(1))
        await self.client.put(self.keys.partition_state(TOPIC, 0), led_by(LEADER, 1))
        await eventually(lambda: self.followed() == {0: 1}, f"{TOPIC}-0 followed")
        assert self.role(TOPIC, 0) is Role.FOLLOWER

    async def add_partitions(self, total: int) -> None:
        """Partitions added up to `total`: the record, then their states in
        one transaction (one watch batch), as many as the test needs."""
        before = len(self.link.view.topics[TOPIC].replicas)
        await self.client.put(self.keys.topic(TOPIC), self._record(total))
        await eventually(
            lambda: len(self.link.view.topics[TOPIC].replicas) == total, "partitions added"
        )
        tx = self.client.transactions
        await self.client.transaction(
            compare=[],
            success=[
                tx.put(self.keys.partition_state(TOPIC, p), led_by(LEADER, 1))
                for p in range(before, total)
            ],
            failure=[],
        )

    async def retry_not_due_soon(self) -> object:
        """The record of TOPIC's failed hosting once its next retry is
        RETRY_MARGIN_S away or more (a retry that fails again replaces it;
        the waits double: 1, 2, then 4 s)."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(WAIT_S):
            while self.link._hosting_failed[TOPIC].due - loop.time() < RETRY_MARGIN_S:
                await asyncio.sleep(0.02)
        return self.link._hosting_failed[TOPIC]

    def followed(self) -> dict[int, int]:
        """Partitions of TOPIC the replica fetcher of broker 1 fetches, with
        the leader epoch it fetches them in."""
        fetcher = self.link.fetchers._fetchers.get(LEADER)
        if fetcher is None:
            return {}
        return {p: epoch for (name, p), epoch in fetcher.partitions.items() if name == TOPIC}


def led_by(leader: int, epoch: int) -> bytes:
    return PartitionState(leader, epoch, (leader, ME) if leader != ME else (ME,)).encode()


def test_a_follower_keeps_fetching_while_added_partitions_fail_to_open(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    async def run() -> None:
        broker = Broker(etcd, tmp_path)
        try:
            await broker.start()
            await broker.create_followed_topic()
            with few_descriptors():
                await broker.add_partitions(1 + ADDED)
                await broker.hosting_failed(TOPIC)
                hosted = broker.manager.logs.hosted_partitions(TOPIC)
                assert 0 in hosted and len(hosted) < 1 + ADDED
                # Still fetched from its leader, as is any added partition
                # that opened before the shortage; the others get no role.
                assert broker.followed() == {p: 1 for p in hosted}
                assert broker.role(TOPIC, 0) is Role.FOLLOWER
                assert all(
                    broker.role(TOPIC, p) is None for p in range(1 + ADDED) if p not in hosted
                )
            # The shortage is over: the retry hosts the rest, all followed.
            await eventually(
                lambda: broker.followed() == {p: 1 for p in range(1 + ADDED)},
                "every partition hosted and followed after the retry",
            )
            assert broker.manager.logs.hosted_partitions(TOPIC) == list(range(1 + ADDED))
            assert TOPIC not in broker.link._hosting_failed
            assert all(broker.role(TOPIC, p) is Role.FOLLOWER for p in range(1 + ADDED))
        finally:
            await broker.stop()

    asyncio.run(run())


@pytest.mark.parametrize("with_new_state", [False, True], ids=["alone", "with_a_new_state"])
def test_a_leadership_change_of_a_hosted_partition_applies_while_added_ones_are_refused(
    etcd: EtcdProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture, with_new_state: bool
) -> None:
    """Past max.partitions (room for TOPIC-0 and another topic's two): the
    added partitions are refused, and broker 0 elected leader of TOPIC-0
    leads it at once. `with_new_state`: the state change comes in one batch
    with a new partition's state, which reconciles the whole topic (and fails
    again) rather than apply the roles of the changed partitions alone."""

    async def run() -> None:
        broker = Broker(etcd, tmp_path, max_partitions=3)
        try:
            await broker.start()
            await broker.client.put(
                broker.keys.topic("kept"),
                TopicAssignment("kept", uuid.uuid4().hex, ((ME,), (ME,)), {}).encode(),
            )
            for p in (0, 1):
                await broker.client.put(
                    broker.keys.partition_state("kept", p), PartitionState(ME, 1, (ME,)).encode()
                )
            await eventually(
                lambda: broker.manager.logs.hosted_partitions("kept") == [0, 1], "kept hosted"
            )
            await broker.create_followed_topic()
            await broker.add_partitions(2)
            await broker.hosting_failed(TOPIC)
            assert broker.manager.logs.hosted_partitions(TOPIC) == [0]
            assert broker.followed() == {0: 1}
            caplog.set_level(logging.INFO, logger="tidelog.broker")
            caplog.clear()
            # No retry comes in between (RETRY_MARGIN_S or more away, and
            # this takes milliseconds), unless the change itself reconciles
            # the whole topic: so, alone, it is applied by `_reconcile_roles`.
            failed = await broker.retry_not_due_soon()
            # Broker 0 elected leader of TOPIC-0; TOPIC-1, unhosted, changes too.
            tx = broker.client.transactions
            changes = [
                tx.put(broker.keys.partition_state(TOPIC, 0), led_by(ME, 2)),
                tx.put(broker.keys.partition_state(TOPIC, 1), led_by(LEADER, 2)),
            ]
            if with_new_state:
                await broker.client.put(broker.keys.topic(TOPIC), broker._record(3))
                await eventually(
                    lambda: len(broker.link.view.topics[TOPIC].replicas) == 3, "partition added"
                )
                changes.append(tx.put(broker.keys.partition_state(TOPIC, 2), led_by(LEADER, 1)))
            await broker.client.transaction(compare=[], success=changes, failure=[])
            await eventually(lambda: broker.role(TOPIC, 0) is Role.LEADER, f"{TOPIC}-0 led at once")
            # The fetchers are pointed after the changed partitions' roles are
            # applied, which yield to the loop between partitions.
            await eventually(lambda: broker.followed() == {}, f"{TOPIC}-0 no longer followed")
            # Alone, by `_reconcile_roles` (no retry came in between); with a
            # new state, by the whole topic's reconcile, which failed again.
            retried = broker.link._hosting_failed[TOPIC] is not failed
            assert retried is with_new_state
            # Still refused (no room freed): the role came without a retry.
            assert TOPIC in broker.link._hosting_failed
            assert broker.manager.logs.hosted_partitions(TOPIC) == [0]
            # An unhosted partition gets no role, and no error is logged for it.
            assert broker.role(TOPIC, 1) is None
            errors = [r.message for r in caplog.records if r.levelno >= logging.ERROR]
            assert not [m for m in errors if f"{TOPIC}-1" in m], errors
            # Room freed: the retry hosts the rest, in their roles.
            await broker.client.delete_prefix(broker.keys.partition_states("kept"))
            await broker.client.delete(broker.keys.topic("kept"))
            added = [1, 2] if with_new_state else [1]
            await eventually(
                lambda: broker.manager.logs.hosted_partitions(TOPIC) == [0, *added],
                f"{TOPIC} {added} hosted once room freed up",
            )
            assert TOPIC not in broker.link._hosting_failed
            assert broker.role(TOPIC, 0) is Role.LEADER
            expected = {1: 2, 2: 1} if with_new_state else {1: 2}
            await eventually(lambda: broker.followed() == expected, f"{TOPIC} {added} followed")
            assert all(broker.role(TOPIC, p) is Role.FOLLOWER for p in added)
        finally:
            await broker.stop()

    asyncio.run(run())


@pytest.mark.parametrize("added", [4, 3], ids=["still_refused", "hosted_in_its_room"])
def test_a_hosted_partition_moved_away_while_added_ones_are_refused_is_dropped(
    etcd: EtcdProcess, tmp_path: Path, added: int
) -> None:
    """Past max.partitions (room for 3): TOPIC-0 is followed here, `added`
    partitions are refused, then TOPIC-0 is reassigned away from this broker.
    Its log is closed (no role, not fetched) and deleted at once, as a
    success deletes a replica moved away; with room for the added ones then,
    they are hosted. Before, a failure left it hosted, in its old role, until
    a retry succeeded: never, when only its room made the retry fit."""

    async def run() -> None:
        broker = Broker(etcd, tmp_path, max_partitions=3)
        try:
            await broker.start()
            await broker.create_followed_topic()
            await broker.add_partitions(1 + added)
            await broker.hosting_failed(TOPIC)
            assert broker.manager.logs.hosted_partitions(TOPIC) == [0]
            # TOPIC-0 reassigned to broker 1 alone: its record, then its state
            # (as a finished reassignment leaves them).
            moved = TopicAssignment(
                TOPIC,
                broker.topic_id,
                ((LEADER,), *((LEADER, ME) for _ in range(added))),
                {},
            )
            await broker.client.put(broker.keys.topic(TOPIC), moved.encode())
            await broker.client.put(
                broker.keys.partition_state(TOPIC, 0), PartitionState(LEADER, 2, (LEADER,)).encode()
            )
            if added == 4:
                await eventually(
                    lambda: broker.manager.logs.hosted_partitions(TOPIC) == [],
                    f"{TOPIC}-0 closed while the others are still refused",
                )
                assert TOPIC in broker.link._hosting_failed
            else:
                await eventually(
                    lambda: broker.manager.logs.hosted_partitions(TOPIC) == [1, 2, 3],
                    f"{TOPIC} 1-3 hosted in the room {TOPIC}-0 left",
                )
                assert TOPIC not in broker.link._hosting_failed
            assert broker.role(TOPIC, 0) is None
            assert 0 not in broker.followed()
            assert 0 not in broker.manager.logs.local_topics().get(TOPIC, [])
        finally:
            await broker.stop()

    asyncio.run(run())
