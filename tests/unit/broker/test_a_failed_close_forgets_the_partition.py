"""A log whose close fails (a StorageError: here its clean-shutdown marker
cannot be created) while it stops being hosted is left as a clean close
leaves it: no longer hosted nor listed in its topic, its role and replica
state forgotten (no leadership served, no ISR check, no fetcher for it), its
readers woken; and every other log of the same batch is closed too. The
error is logged, naming the partition, and raised once all are closed (a
hosting change fails, and is retried, as before).

Before, the first failing close stopped the batch: the partition had left
the hosted set, but its role stayed in the replica manager for good (a
leader with no log, whose ISR checks went on), nothing woke its readers,
its log stayed in the topic's list (DescribeTopics), the other partitions
no longer hosted stayed open in their old roles until a retry, and the logs
of those moved to other brokers were never deleted. At shutdown, the logs
after the failing one were not closed: no clean-shutdown marker, so the next
start recovered them all.

Real logs on a temporary directory; the failure is real: the partition's
directory made immutable (`chattr +i`, the tests run as root), so the
marker cannot be created in it. The cluster-mode case runs a real
ClusterLink and PartitionManager (broker 0) on a real etcd; broker 1, the
new leader, is only named in the partition states.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import pytest
from tidelog.errors import StorageError
from tidelog_broker.config import BrokerConfig
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_state import Role
from tidelog_broker.storage import files
from tidelog_broker.topic_store import TopicSpec
from tidelog_server.etcd.records import PartitionState, TopicAssignment

from tests.support.etcd import EtcdProcess
from tests.support.immutable_files import pin, unpin_if_pinned
from tests.unit.broker.in_process_broker import InProcessBroker, eventually

TOPIC = "t"
ME = 0
OTHER = 1


def closed_cleanly(directory: Path) -> bool:
    return (directory / files.CLEAN_SHUTDOWN_FILE).exists()


def close_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and "closing" in r.getMessage()
    ]


def test_a_failed_close_while_hosting_changes_forgets_the_partition_and_closes_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Three partitions led here; none is to be hosted any more, and the
    close of the middle one fails."""
    manager = PartitionManager(BrokerConfig(data_dir=tmp_path, broker_id=ME), cluster_mode=True)
    manager.open()
    spec = TopicSpec(TOPIC, 3, {}, uuid.uuid4().hex)
    manager.logs.host_partitions(spec, [0, 1, 2])
    directories = [manager.logs.hosted_log(TOPIC, p).directory for p in range(3)]

    async def run() -> None:
        for p in range(3):
            manager.replicas.set_role(
                TOPIC,
                p,
                role=Role.LEADER,
                leader_id=ME,
                leader_epoch=1,
                replicas=[ME],
                isr=[ME],
                revision=1,
            )
        # A long-poll on each partition: the close must end it.
        waiters = [manager.logs.register_append_waiter([(TOPIC, p)]) for p in range(3)]
        pin(directories[1])
        try:
            with (
                caplog.at_level(logging.ERROR, logger="tidelog.broker"),
                pytest.raises(StorageError, match=f"closing {TOPIC}-1 failed"),
            ):
                manager.logs.host_partitions(spec, [])
        finally:
            unpin_if_pinned(directories[1])
        for p in range(3):
            assert manager.replicas.replication(TOPIC, p) is None, f"{TOPIC}-{p} keeps its role"
            assert waiters[p].done(), f"the long-poll on {TOPIC}-{p} was not woken"
        assert manager.logs.hosted_partitions(TOPIC) == []
        # Not listed any more either (DescribeTopics, the background loops).
        assert manager.logs.topic(TOPIC).logs == []
        assert manager.describe(TOPIC) == []
        # The others closed cleanly (no recovery at their next open).
        assert closed_cleanly(directories[0])
        assert closed_cleanly(directories[2])
        assert not closed_cleanly(directories[1])
        # Named, and alone (the paths in the messages may hold "t-0" too).
        errors = close_errors(caplog)
        assert errors, "nothing logged"
        assert all(m.startswith(f"closing the logs of {TOPIC}-1 failed") for m in errors), errors

    try:
        asyncio.run(run())
    finally:
        manager.close()


def test_a_failed_close_at_shutdown_closes_every_other_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker stops; the close of the first log fails: the others still
    close cleanly, and the error (naming the partition) is raised after."""
    manager = PartitionManager(BrokerConfig(data_dir=tmp_path, num_partitions=3))
    manager.open()
    manager.logs.create_topic(TOPIC)
    directories = [manager.partition_log(TOPIC, p).directory for p in range(3)]
    pin(directories[0])
    try:
        with (
            caplog.at_level(logging.ERROR, logger="tidelog.broker"),
            pytest.raises(StorageError, match=f"closing {TOPIC}-0 failed"),
        ):
            manager.close()
    finally:
        unpin_if_pinned(directories[0])
    assert closed_cleanly(directories[1])
    assert closed_cleanly(directories[2])
    assert manager.topic_names() == []
    errors = close_errors(caplog)
    assert errors, "nothing logged"
    assert all(m.startswith(f"closing the logs of {TOPIC}-0 failed") for m in errors), errors
    # The next start opens every log, the one whose close failed recovered.
    manager = PartitionManager(BrokerConfig(data_dir=tmp_path, num_partitions=3))
    manager.open()
    try:
        assert manager.logs.offline_partitions() == []
        assert [manager.partition_log(TOPIC, p).log_end_offset for p in range(3)] == [0, 0, 0]
    finally:
        manager.close()


class Broker(InProcessBroker):
    def __init__(self, etcd: EtcdProcess, tmp_path: Path) -> None:
        super().__init__(etcd, f"/failedclose-{uuid.uuid4().hex}", tmp_path, ME)
        self.topic_id = uuid.uuid4().hex

    def record(self, replicas: tuple[tuple[int, ...], ...]) -> bytes:
        return TopicAssignment(TOPIC, self.topic_id, replicas, {}).encode()

    def followed(self) -> dict[int, int]:
        """Partitions of TOPIC the replica fetcher of broker OTHER fetches."""
        fetcher = self.link.fetchers._fetchers.get(OTHER)
        if fetcher is None:
            return {}
        return {p: epoch for (name, p), epoch in fetcher.partitions.items() if name == TOPIC}


@pytest.mark.parametrize("with_states", [False, True], ids=["record_only", "with_states"])
def test_replicas_moved_away_are_all_forgotten_when_one_close_fails(
    etcd: EtcdProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture, with_states: bool
) -> None:
    """Broker 0 leads TOPIC-0 and TOPIC-2 and follows TOPIC-1; a
    reassignment moves all three to broker 1 (`with_states`: their states
    name broker 1 leader in the same transaction; else they still name
    broker 0), and closing TOPIC-0 fails. When the hosting failure is
    recorded (as any, and retried; the closes happen in the same turn of
    the loop), none of them is hosted or has a role, TOPIC-1 is no longer
    fetched, and the logs of the two that closed are deleted (TOPIC-0's
    directory, immutable, cannot be renamed aside: it stays, as a deletion
    that fails leaves it). Before, TOPIC-0 kept its role for good."""

    async def run() -> None:
        broker = Broker(etcd, tmp_path)
        directory = tmp_path / files.log_dir_name(TOPIC, 0)
        try:
            await broker.start()
            await broker.client.put(
                broker.keys.topic(TOPIC), broker.record(((ME,), (OTHER, ME), (ME,)))
            )
            tx = broker.client.transactions
            await broker.client.transaction(
                compare=[],
                success=[
                    tx.put(
                        broker.keys.partition_state(TOPIC, 0), PartitionState(ME, 1, (ME,)).encode()
                    ),
                    tx.put(
                        broker.keys.partition_state(TOPIC, 1),
                        PartitionState(OTHER, 1, (OTHER, ME)).encode(),
                    ),
                    tx.put(
                        broker.keys.partition_state(TOPIC, 2), PartitionState(ME, 1, (ME,)).encode()
                    ),
                ],
                failure=[],
            )
            roles = [Role.LEADER, Role.FOLLOWER, Role.LEADER]
            await eventually(
                lambda: [broker.role(TOPIC, p) for p in range(3)] == roles, "roles applied"
            )
            assert broker.followed() == {1: 1}
            assert broker.manager.logs.hosted_log(TOPIC, 0).directory == directory
            pin(directory)
            caplog.set_level(logging.INFO, logger="tidelog.broker")
            # Reassigned away, all three: the record, and the states at once
            # or not yet (they still say this broker leads TOPIC-0 and TOPIC-2:
            # a role left behind would be a leader's, whose ISR checks go on).
            moved = [tx.put(broker.keys.topic(TOPIC), broker.record(((OTHER,),) * 3))]
            if with_states:
                moved.extend(
                    tx.put(
                        broker.keys.partition_state(TOPIC, p),
                        PartitionState(OTHER, 2, (OTHER,)).encode(),
                    )
                    for p in range(3)
                )
            await broker.client.transaction(compare=[], success=moved, failure=[])
            # Surfaced as any hosting failure (retried): by then, all is done.
            await broker.hosting_failed(TOPIC)
            assert [broker.role(TOPIC, p) for p in range(3)] == [None, None, None]
            assert broker.manager.logs.hosted_partitions(TOPIC) == []
            assert broker.followed() == {}
            assert broker.manager.logs.local_topics().get(TOPIC, []) == [0]
            errors = close_errors(caplog)
            assert [m for m in errors if m.startswith(f"closing the logs of {TOPIC}-0 ")], errors
            unpin_if_pinned(directory)
            # The retry has nothing left to do: it succeeds.
            await eventually(
                lambda: TOPIC not in broker.link._hosting_failed, "the retry succeeded"
            )
            assert [broker.role(TOPIC, p) for p in range(3)] == [None, None, None]
        finally:
            unpin_if_pinned(directory)
            await broker.stop()

    asyncio.run(run())
