"""SDK consumers in groups against a real cluster (etcd, coordinator, 3 brokers)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from tidelog import AdminClient, Consumer, TopicPartition
from tidelog.errors import InvalidConfigError, NonEmptyGroupError

from tests.integration.groups.conftest import (
    ConsumerProcess,
    create_topic,
    produce,
    wait_until,
)
from tests.support.cluster import ClusterProcesses

pytestmark = pytest.mark.timeout(90)

Start = Callable[..., ConsumerProcess]


def _all_assigned(members: list[ConsumerProcess], partitions: int) -> bool:
    owned = [m.assignment() for m in members]
    union = set().union(*owned)
    return union == set(range(partitions)) and sum(map(len, owned)) == partitions and all(owned)


def test_three_consumers_share_twelve_partitions_and_lose_nothing_when_one_is_killed(
    cluster: ClusterProcesses, consumers: Start, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 12)
    members = [consumers(group, topic) for _ in range(3)]
    wait_until(lambda: _all_assigned(members, 12), 30, "12 partitions spread over 3 members")
    produce(cluster, topic, 12, 50)
    wait_until(
        lambda: len(set().union(*(m.processed() for m in members))) == 600, 30, "600 processed"
    )

    victim = max(members, key=lambda m: len(m.assignment()))
    moved = victim.assignment()
    victim.kill()
    produce(cluster, topic, 12, 50)  # while the victim's partitions are orphaned
    survivors = [m for m in members if m is not victim]
    wait_until(lambda: _all_assigned(survivors, 12), 30, "partitions moved")
    assert moved <= set().union(*(m.assignment() for m in survivors))
    everything = {(p, o) for p in range(12) for o in range(100)}
    wait_until(
        lambda: set().union(*(m.processed() for m in members)) >= everything,
        30,
        "every record processed (commit after processing: none lost)",
    )
    assert set().union(*(m.processed() for m in members)) == everything


def test_cooperative_sticky_fourth_member_revokes_only_the_moving_partitions(
    cluster: ClusterProcesses, consumers: Start, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 12)
    members = [consumers(group, topic) for _ in range(3)]
    wait_until(lambda: _all_assigned(members, 12), 30, "3 members own 12 partitions")
    before = [m.assignment() for m in members]
    revoked_before = [m.count("revoked") for m in members]

    fourth = consumers(group, topic)
    members.append(fourth)
    wait_until(lambda: _all_assigned(members, 12), 30, "4 members own 12 partitions")
    got = fourth.assignment()
    assert len(got) == 3
    revoked: set[int] = set()
    for member, owned, count in zip(members[:3], before, revoked_before, strict=True):
        events = [e for e in member.snapshot() if e["event"] == "revoked"][count:]
        for event in events:
            assert set(event["partitions"]) <= owned  # only what it had
            revoked |= set(event["partitions"])
        assert member.assignment() <= owned  # nothing new for the old members
        assert member.count("lost") == 0
    assert revoked == got  # exactly the partitions that moved were revoked


def test_static_member_restart_within_the_session_timeout_causes_no_rebalance(
    cluster: ClusterProcesses, consumers: Start, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 4)
    # The restart (SIGTERM, a new interpreter, imports, join) must fit in the
    # session: seconds on a loaded 2-core CI machine, so a generous session.
    session_ms = 30_000
    a = consumers(group, topic, "--instance", "pod-a", session_ms=session_ms)
    b = consumers(group, topic, "--instance", "pod-b", session_ms=session_ms)
    wait_until(lambda: _all_assigned([a, b], 4), 30, "2 static members own 4 partitions")
    with AdminClient(cluster.bootstrap) as admin:
        epoch = admin.describe_consumer_groups([group])[group].group_epoch
        owned_a = a.assignment()
        b_events = len(b.snapshot())
        a.stop()  # SIGTERM: a static member closes without leaving
        again = consumers(group, topic, "--instance", "pod-a", session_ms=session_ms)
        wait_until(lambda: again.assignment() == owned_a, 25, "pod-a gets its partitions back")
        assert admin.describe_consumer_groups([group])[group].group_epoch == epoch
    assert not [e for e in b.snapshot()[b_events:] if e["event"] != "records"]


def test_auto_commit_and_cli_describe_and_reset_offsets(
    cluster: ClusterProcesses, consumers: Start, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 3)
    produce(cluster, topic, 3, 10)
    member = consumers(group, topic, "--auto-commit")
    wait_until(lambda: len(member.processed()) == 30, 30, "30 records consumed")
    with AdminClient(cluster.bootstrap) as admin:
        wait_until(
            lambda: (
                {
                    tp.partition: om.offset
                    for tp, om in admin.list_consumer_group_offsets(group).items()
                }
                == {0: 10, 1: 10, 2: 10}
            ),
            10,
            "auto-commit committed every position",
        )
    produce(cluster, topic, 3, 5)  # consumed and committed too; then stop it
    wait_until(lambda: len(member.processed()) == 45, 30, "45 records consumed")

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tidelog.cli", *args, "--bootstrap-server", cluster.bootstrap],
            capture_output=True,
            text=True,
            timeout=30,
            check=check,
        )

    planned = cli("groups", "reset-offsets", group, "--topic", topic, "--to-earliest")
    assert "1 live members" in planned.stderr, planned.stderr
    refused = cli(
        "groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "--execute",
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "NonEmptyGroupError" in refused.stderr, refused.stderr
    member.stop()
    with AdminClient(cluster.bootstrap) as admin:
        wait_until(
            lambda: admin.describe_consumer_groups([group])[group].members == [], 10, "empty"
        )
    cli("groups", "reset-offsets", group, "--topic", topic, "--to-offset", "2", "--execute")
    out = cli("groups", "describe", group).stdout
    rows = [line.split() for line in out.splitlines() if line.startswith(topic)]
    assert [(r[1], r[3], r[4], r[5]) for r in rows] == [(str(p), "2", "15", "13") for p in range(3)]
    assert group in cli("groups", "list").stdout
    cli("groups", "reset-offsets", group, "--topic", topic, "--shift-by", "-1", "--execute")
    with AdminClient(cluster.bootstrap) as admin:
        offsets = admin.list_consumer_group_offsets(group)
        assert {tp.partition: om.offset for tp, om in offsets.items()} == {0: 1, 1: 1, 2: 1}
    cli("groups", "delete", group)
    with AdminClient(cluster.bootstrap) as admin:
        assert admin.list_consumer_group_offsets(group, [TopicPartition(topic, 0)]) == {}


def test_max_poll_interval_leaves_the_group_and_the_next_poll_rejoins(
    cluster: ClusterProcesses, consumers: Start, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 4)
    produce(cluster, topic, 4, 5)
    stuck = consumers(group, topic, "--max-poll-interval-ms", "2000", "--stall-after", "1")
    # It must own the records before anyone else joins: a second member
    # started at once could take every partition, consume and commit them
    # all first, and leave the first nothing to stall on.
    wait_until(lambda: stuck.count("stalling") == 1, 30, "the consumer stalls")
    other = consumers(group, topic)
    # Its partitions move to the live member while it does not poll.
    wait_until(lambda: other.assignment() == set(range(4)), 15, "other owns everything")
    wait_until(lambda: stuck.count("lost") >= 1, 15, "the stalled member reports them lost")
    wait_until(lambda: stuck.assignment() and _all_assigned([stuck, other], 4), 20, "rejoined")
    log = stuck.log_path.read_text()
    assert "max_poll_interval_ms=2000" in log and "leaving group" in log


def test_a_zombie_member_cannot_commit(cluster: ClusterProcesses, names: tuple[str, str]) -> None:
    import asyncio

    from tidelog.errors import CommitFailedError
    from tidelog.group import GroupMembership

    topic, group = names
    create_topic(cluster, topic, 2)
    coordinator = cluster.coordinators[0].address

    async def scenario() -> None:
        zombie = GroupMembership(coordinator, group, topics=[topic], session_timeout_ms=2000)
        await zombie.start()
        await zombie.wait_for(lambda m: len(m.assignment) == 2, 20)
        await zombie._stop_task()  # frozen: no more heartbeats, no leave
        live = GroupMembership(coordinator, group, topics=[topic], session_timeout_ms=5000)
        await live.start()
        await live.wait_for(lambda m: len(m.assignment) == 2, 20)
        # Kafka's CommitFailedException: a kafka-python user's `except
        # CommitFailedError` catches it (the subclass names why).
        with pytest.raises(CommitFailedError):
            await zombie.commit({TopicPartition(topic, 0): 1})
        await live.commit({TopicPartition(topic, 0): 1})
        await live.close()
        await zombie.close(leave=False)

    asyncio.run(scenario())


def test_standalone_admin_calls_are_forwarded_and_topic_configs_follow_etcd(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, _ = names
    create_topic(cluster, topic, 3)
    produce(cluster, topic, 3, 2)
    with AdminClient(cluster.bootstrap) as admin:
        # Placement from the coordinator, offsets and sizes from the leaders.
        described = admin.describe_topics([topic])[0].partitions
        assert [p.log_end_offset for p in described] == [2, 2, 2]
        assert {p.leader for p in described} == {0, 1, 2}
        admin.alter_configs({topic: {"retention.ms": "3600000"}})
        configs = admin.describe_configs([topic])[topic]
        assert configs["retention.ms"].value == "3600000" and configs["retention.ms"].is_override
        with pytest.raises(InvalidConfigError, match=r"retention\.ms"):
            admin.alter_configs({topic: {"retention.ms": "-5"}})
        admin.delete_topics([topic])
    # Every broker deleted its data of the topic.
    wait_until(
        lambda: (
            not any(
                (b.data_dir / f"{topic}-{p}").exists() for b in cluster.brokers for p in range(3)
            )
        ),
        10,
        "data deleted on the brokers",
    )


def test_delete_refused_while_members_are_live(
    cluster: ClusterProcesses, consumers: Start, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 1)
    member = consumers(group, topic)
    wait_until(lambda: member.assignment() == {0}, 30, "assigned")
    with AdminClient(cluster.bootstrap) as admin, pytest.raises(NonEmptyGroupError):
        admin.delete_consumer_groups([group])


def test_an_assign_consumer_with_a_group_id_commits_while_the_group_is_empty(
    cluster: ClusterProcesses, consumers: Start, names: tuple[str, str]
) -> None:
    """No member, so its commits are admin offset changes (AlterOffsets): they
    work on an empty group, as Kafka's standalone consumers' do, and are
    refused while the group has live members."""
    from tidelog import Consumer

    topic, group = names
    create_topic(cluster, topic, 2)
    produce(cluster, topic, 2, 5)  # offset 3 is a real position
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id=group) as standalone:
        standalone.assign([tp])
        standalone.commit({tp: 3})
        assert standalone.committed(tp) == 3
        member = consumers(group, topic)
        wait_until(lambda: member.assignment() == {0, 1}, 20, "the member to own both partitions")
        with pytest.raises(NonEmptyGroupError):
            standalone.commit({tp: 4})
        # (The member may have committed its own position meanwhile.)
        assert standalone.committed(tp) != 4


def test_a_member_alone_on_its_loop_keeps_its_partitions_while_the_application_works(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """A Consumer alone on its loop runs the loop inside poll() (the loop is
    lent to it, tidelog._loop_thread); between polls the loop's thread takes
    it back, so heartbeats go on while the application works longer than the
    session timeout, and the member keeps its partitions."""
    topic, group = names
    create_topic(cluster, topic, 2)
    produce(cluster, topic, 2, 5)
    changes: list[str] = []

    class Listener:
        def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
            changes.append(f"revoked {sorted(revoked)}")

        def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
            changes.append(f"assigned {sorted(assigned)}")

        def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
            changes.append(f"lost {sorted(lost)}")

    session_ms = 2000
    with Consumer(
        bootstrap_servers=cluster.bootstrap,
        group_id=group,
        session_timeout_ms=session_ms,
        shared_loop_thread=False,  # alone on its loop, whatever else this process runs
    ) as consumer:
        consumer.subscribe([topic], listener=Listener())
        seen = 0
        deadline = time.monotonic() + 60
        while seen < 10:
            assert time.monotonic() < deadline, f"10 records not polled within 60 s: {changes}"
            seen += sum(len(r) for r in consumer.poll(timeout_ms=200).values())
        assert len(consumer.assignment()) == 2
        joined = list(changes)
        for _ in range(2):
            time.sleep(3 * session_ms / 1000)  # the application at work, not polling
            consumer.poll(timeout_ms=200)
        assert changes == joined, "the member lost its session while the application worked"
        assert len(consumer.assignment()) == 2
