"""`tidelog groups` against a real cluster: reset-offsets plans unless given
--execute (as kafka-consumer-groups does), its targets (--to-current,
--by-duration, --all-topics), and `describe --all-groups`."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from tidelog import AdminClient, Producer, TopicPartition

from tests.integration.groups.conftest import create_topic
from tests.support.cluster import ClusterProcesses

pytestmark = pytest.mark.timeout(120)

HOUR_MS = 3_600_000


def cli(cluster: ClusterProcesses, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidelog.cli", *args, "--bootstrap-server", cluster.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )


def committed(cluster: ClusterProcesses, group: str) -> dict[tuple[str, int], int]:
    with AdminClient(cluster.bootstrap) as admin:
        offsets = admin.list_consumer_group_offsets(group)
    return {(tp.topic, tp.partition): om.offset for tp, om in offsets.items()}


def commit(cluster: ClusterProcesses, group: str, offsets: dict[tuple[str, int], int]) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.alter_consumer_group_offsets(
            group, {TopicPartition(t, p): o for (t, p), o in offsets.items()}
        )


def plan(result: subprocess.CompletedProcess[str], topic: str) -> dict[int, int]:
    """The NEW-OFFSET column of reset-offsets' table, per partition of `topic`."""
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith(topic + " ")]
    return {int(row[1]): int(row[2]) for row in rows}


def produce_at(cluster: ClusterProcesses, topic: str, partitions: int, stamps: list[int]) -> None:
    """One record per timestamp in each partition."""
    with Producer(cluster.bootstrap, linger_ms=2) as producer:
        for stamp in stamps:
            for p in range(partitions):
                producer.send(topic, value=b"x", partition=p, timestamp_ms=stamp)
        producer.flush()


def test_reset_offsets_plans_by_default_and_changes_only_with_execute(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 2)
    now = int(time.time() * 1000)
    # Offsets 0-2 an hour old, 3-5 fresh, in each partition.
    produce_at(cluster, topic, 2, [now - HOUR_MS] * 3 + [now] * 3)
    commit(cluster, group, {(topic, 0): 5, (topic, 1): 4})
    before = committed(cluster, group)

    planned = cli(cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest")
    assert plan(planned, topic) == {0: 0, 1: 0}
    assert "--execute" in planned.stderr and "nothing changed" in planned.stderr
    explicit = cli(
        cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "--dry-run"
    )
    assert plan(explicit, topic) == {0: 0, 1: 0}
    assert committed(cluster, group) == before  # planned twice, changed nothing

    # --to-current: the committed offsets, the log end where none is committed.
    current = cli(cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-current")
    assert plan(current, topic) == {0: 5, 1: 4}

    # --by-duration: the first record at or after now minus the duration.
    recent = cli(
        cluster, "groups", "reset-offsets", group, "--topic", topic,
        "--by-duration", "PT30M", "--execute",
    )  # fmt: skip
    assert plan(recent, topic) == {0: 3, 1: 3}
    assert committed(cluster, group) == {(topic, 0): 3, (topic, 1): 3}
    older = cli(
        cluster, "groups", "reset-offsets", group, "--topic", topic, "--partition", "1",
        "--by-duration", "P1DT2H", "--execute",
    )  # fmt: skip
    assert plan(older, topic) == {1: 0}
    assert committed(cluster, group) == {(topic, 0): 3, (topic, 1): 0}

    bad = cli(cluster, "groups", "reset-offsets", group, "--topic", topic, "--by-duration", "10m")
    assert bad.returncode == 2 and "ISO-8601" in bad.stderr, bad.stderr
    both = cli(
        cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-latest",
        "--dry-run", "--execute",
    )  # fmt: skip
    assert both.returncode == 2 and "--execute" in both.stderr, both.stderr
    assert committed(cluster, group) == {(topic, 0): 3, (topic, 1): 0}


def test_reset_offsets_all_topics_and_describe_all_groups(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    other_topic, other_group = f"{topic}-b", f"{group}-b"
    create_topic(cluster, topic, 2)
    create_topic(cluster, other_topic, 1)
    produce_at(cluster, topic, 2, [int(time.time() * 1000)] * 4)
    produce_at(cluster, other_topic, 1, [int(time.time() * 1000)] * 3)
    commit(cluster, group, {(topic, 0): 1, (other_topic, 0): 2})
    commit(cluster, other_group, {(topic, 1): 1})

    # Every partition of every topic the group has committed offsets for.
    result = cli(
        cluster, "groups", "reset-offsets", group, "--all-topics", "--to-latest", "--execute"
    )
    assert plan(result, topic) == {0: 4, 1: 4}
    assert plan(result, other_topic) == {0: 3}
    assert committed(cluster, group) == {(topic, 0): 4, (topic, 1): 4, (other_topic, 0): 3}
    assert committed(cluster, other_group) == {(topic, 1): 1}  # another group: untouched
    mixed = cli(
        cluster, "groups", "reset-offsets", group, "--all-topics", "--partition", "0",
        "--to-latest",
    )  # fmt: skip
    assert mixed.returncode == 2 and "--partition" in mixed.stderr, mixed.stderr

    described = cli(cluster, "groups", "describe", "--all-groups")
    assert described.returncode == 0, described.stderr
    headers = [line for line in described.stdout.splitlines() if line.startswith("group ")]
    assert f"group {group}:" in "\n".join(headers) and f"group {other_group}:" in "\n".join(headers)
    rows = [line.split() for line in described.stdout.splitlines() if line.startswith(topic)]
    # group: topic 0 and 1 at 4 (lag 0), other_topic 0 at 3; other_group: topic 1 at 1 (lag 3).
    assert [topic, "1", "-", "1", "4", "3"] in rows, described.stdout
    assert [other_topic, "0", "-", "3", "3", "0"] in rows, described.stdout


def test_consume_in_a_group_exits_at_the_end_and_commits(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 2)
    produce_at(cluster, topic, 2, [int(time.time() * 1000)] * 3)
    # -e in a group: the ends of the partitions assigned; no --timeout-ms needed.
    first = cli(cluster, "consume", topic, "--group", group, "--from-beginning", "-e")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == ["x"] * 6
    assert committed(cluster, group) == {(topic, 0): 3, (topic, 1): 3}
    again = cli(cluster, "consume", topic, "-G", group, "-e", "--output", "json")
    assert again.returncode == 0 and again.stdout == "", again.stderr  # nothing new
