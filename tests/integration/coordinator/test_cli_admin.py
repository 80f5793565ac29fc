"""The admin commands of `tidelog` (issue 13) against a real cluster of four
brokers, run as a user runs them (`python -m tidelog.cli ...`): adding
partitions, the describe filters, cluster describe, delete-records,
leaders elect, reassign with a JSON plan (and a new replica whose log is
offline, and a move whose leader stops), brokers decommission.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tidelog import AdminClient, NewTopic, Producer, TopicPartition
from tidelog.errors import StorageError
from tidelog.types import PartitionReassignment, ReplicaProgress
from tidelog_broker.storage import files

from tests.integration.coordinator.admin_support import (
    admin_client,
    partition,
    running_admin_cluster,
    wait_until,
)
from tests.support.cluster import ClusterProcesses
from tests.support.etcd import EtcdProcess
from tests.support.processes import start_broker

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterProcesses]:
    with running_admin_cluster(
        etcd, tmp_path_factory.mktemp("cli-admin"), "/cli-admin", brokers=4
    ) as processes:
        yield processes


@pytest.fixture
def admin(cluster: ClusterProcesses) -> Iterator[AdminClient]:
    with admin_client(cluster) as client:
        yield client


def cli(cluster: ClusterProcesses, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidelog.cli", *args, "--bootstrap-server", cluster.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )


def described_partitions(result: subprocess.CompletedProcess[str], topic: str) -> list[int]:
    """Partition numbers that `topics describe` printed for `topic`."""
    out, current = [], None
    for line in result.stdout.splitlines():
        if line.startswith("topic "):
            current = line.split()[1]
        elif current == topic and line.split() and line.split()[0].isdigit():
            out.append(int(line.split()[0]))
    return out


def test_topics_alter_partitions_warns_and_refuses_to_shrink(cluster: ClusterProcesses) -> None:
    assert cli(cluster, "topics", "create", "cli-grow", "--partitions", "2").returncode == 0
    grown = cli(cluster, "topics", "alter", "cli-grow", "--partitions", "5")
    assert grown.returncode == 0, grown.stderr
    assert "WARNING" in grown.stderr and "key" in grown.stderr
    assert "now has 5 partitions" in grown.stdout
    assert described_partitions(cli(cluster, "topics", "describe", "cli-grow"), "cli-grow") == [
        0, 1, 2, 3, 4,
    ]  # fmt: skip
    shrink = cli(cluster, "topics", "alter", "cli-grow", "--partitions", "3")
    assert shrink.returncode == 2  # an invalid request (EXIT_CODES_HELP)
    assert "InvalidPartitionsError" in shrink.stderr and "can only grow" in shrink.stderr


def test_cluster_describe_shows_brokers_racks_and_the_controller(
    cluster: ClusterProcesses, tmp_path: Path
) -> None:
    racked = start_broker(
        tmp_path / "broker-9", extra_args=[*cluster.broker_args(9), "--rack", "r9"], broker_id=9
    )
    try:
        cluster.wait_registered(5)
        result = cli(cluster, "cluster", "describe")
    finally:
        racked.stop()
    assert result.returncode == 0, result.stderr
    assert "controller  c0" in result.stdout
    for broker in cluster.brokers:
        assert broker.address in result.stdout
    row = next(line.split() for line in result.stdout.splitlines() if racked.address in line)
    assert row == ["9", racked.address, "r9"]


def test_describe_filters_list_the_partitions_in_trouble(
    cluster: ClusterProcesses, admin: AdminClient
) -> None:
    admin.create_topics(
        [
            NewTopic("cli-rf3", -1, -1, {"min.insync.replicas": "3"}, {0: [0, 1, 3], 1: [0, 1, 2]}),
            NewTopic("cli-solo", -1, -1, replica_assignments={0: [3]}),
        ]
    )
    wait_until(lambda: len(partition(admin, TopicPartition("cli-rf3", 0)).isr) == 3, "full ISR")
    for flag in ("--under-replicated-partitions", "--unavailable-partitions"):
        assert described_partitions(cli(cluster, "topics", "describe", flag), "cli-rf3") == []
    broker3 = cluster.brokers[3]
    broker3.kill()
    try:
        wait_until(
            lambda: partition(admin, TopicPartition("cli-rf3", 0)).isr == [0, 1],
            "broker 3 leaves the ISR",
        )
        under = cli(cluster, "topics", "describe", "--under-replicated-partitions")
        assert described_partitions(under, "cli-rf3") == [0]
        assert described_partitions(under, "cli-solo") == []  # no live replica to lag
        below = cli(cluster, "topics", "describe", "--under-min-isr-partitions")
        assert described_partitions(below, "cli-rf3") == [0]
        assert described_partitions(below, "cli-grow") == []
        offline = cli(cluster, "topics", "describe", "--unavailable-partitions")
        assert described_partitions(offline, "cli-solo") == [0]
        assert described_partitions(offline, "cli-rf3") == []
    finally:
        broker3.spawn()
        cluster.wait_registered(4)
    wait_until(
        lambda: (
            not described_partitions(
                cli(cluster, "topics", "describe", "--under-replicated-partitions"), "cli-rf3"
            )
        ),
        "nothing under-replicated once broker 3 is back",
    )


def test_delete_records_from_a_json_file(
    cluster: ClusterProcesses, admin: AdminClient, tmp_path: Path
) -> None:
    admin.create_topics([NewTopic("cli-trim", 2, 2)])
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        for i in range(20):
            producer.send("cli-trim", b"v", partition=i % 2)
        producer.flush(timeout=30)
    offsets = tmp_path / "offsets.json"
    offsets.write_text(
        json.dumps(
            {
                "version": 1,
                "partitions": [
                    {"topic": "cli-trim", "partition": 0, "offset": 4},
                    {"topic": "cli-trim", "partition": 1, "offset": -1},
                ],
            }
        )
    )
    result = cli(cluster, "delete-records", "--offset-json-file", str(offsets))
    assert result.returncode == 0, result.stderr
    assert "partition: cli-trim-0\tlow_watermark: 4" in result.stdout
    assert "partition: cli-trim-1\tlow_watermark: 10" in result.stdout
    offsets.write_text('{"partitions": [{"topic": "cli-trim", "partition": 0, "offset": 99}]}')
    past = cli(cluster, "delete-records", "--offset-json-file", str(offsets))
    assert past.returncode == 1 and "OffsetOutOfRangeError" in past.stdout
    offsets.write_text('{"partitions": [{"topic": "cli-trim"}]}')
    bad = cli(cluster, "delete-records", "--offset-json-file", str(offsets))
    assert bad.returncode == 2 and "partitions[0]" in bad.stderr


def test_leaders_elect(cluster: ClusterProcesses, admin: AdminClient) -> None:
    admin.create_topics([NewTopic("cli-elect", -1, -1, replica_assignments={0: [2, 1]})])
    tp = TopicPartition("cli-elect", 0)
    wait_until(lambda: partition(admin, tp).isr == [2, 1], "full ISR")
    result = cli(cluster, "leaders", "elect", "--topic", "cli-elect", "--partition", "0")
    assert result.returncode == 0, result.stderr
    assert "Valid replica already elected for partitions cli-elect-0" in result.stdout
    everything = cli(cluster, "leaders", "elect", "--all-topic-partitions")
    assert everything.returncode == 0, everything.stdout + everything.stderr


def test_reassign_execute_verify_and_cancel_with_a_plan(
    cluster: ClusterProcesses, admin: AdminClient, tmp_path: Path
) -> None:
    admin.create_topics([NewTopic("cli-move", -1, -1, replica_assignments={0: [0, 1], 1: [1, 2]})])
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        for i in range(200):
            producer.send("cli-move", b"m" * 500, partition=i % 2)
        producer.flush(timeout=30)
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "version": 1,
                "partitions": [
                    {"topic": "cli-move", "partition": 0, "replicas": [2, 3]},
                    {"topic": "cli-move", "partition": 1, "replicas": [3, 0]},
                ],
            }
        )
    )
    started = cli(cluster, "reassign", "--execute", "--reassignment-json-file", str(plan))
    assert started.returncode == 0, started.stderr
    rollback = json.loads(started.stdout.splitlines()[1])
    assert rollback["partitions"][0] == {"topic": "cli-move", "partition": 0, "replicas": [0, 1]}
    wait_until(
        lambda: (
            cli(
                cluster, "reassign", "--verify", "--reassignment-json-file", str(plan)
            ).stdout.count("is completed")
            == 2
        ),
        "both moves complete",
    )
    assert [p.replicas for p in admin.describe_topics(["cli-move"])[0].partitions] == [
        [2, 3],
        [3, 0],
    ]
    # A move too slow to finish (1 byte/s), shown in progress, then cancelled.
    back = tmp_path / "back.json"
    back.write_text(json.dumps(rollback))
    slow = cli(
        cluster, "reassign", "--execute", "--reassignment-json-file", str(back), "--throttle", "1"
    )
    assert slow.returncode == 0, slow.stderr
    verify = cli(cluster, "reassign", "--verify", "--reassignment-json-file", str(back))
    assert "still in progress" in verify.stdout and "behind leader" in verify.stdout
    described = cli(cluster, "topics", "describe", "cli-move").stdout.splitlines()
    header = next(line.split() for line in described if line.split()[:1] == ["partition"])
    assert header[-2:] == ["adding", "removing"]
    row = next(line.split() for line in described if line.split()[:1] == ["0"])
    assert row[2] == "0,1,2,3" and row[-2:] == ["0,1", "2,3"]
    cancel = cli(cluster, "reassign", "--cancel", "--reassignment-json-file", str(back))
    assert cancel.returncode == 0, cancel.stdout
    assert [p.replicas for p in admin.describe_topics(["cli-move"])[0].partitions] == [
        [2, 3],
        [3, 0],
    ]


def test_reassign_verify_shows_a_new_replica_whose_log_cannot_open_as_offline(
    cluster: ClusterProcesses, admin: AdminClient, tmp_path: Path
) -> None:
    """The new replica's broker cannot open its log (a file stands where its
    directory goes): it hosts it offline and copies nothing. --verify said
    "catching up, log end offset 0 of 20, 20 records behind", forever, as if
    it were an empty log on its way."""
    topic, target = "cli-offline", 3
    tp = TopicPartition(topic, 0)
    admin.create_topics([NewTopic(topic, -1, -1, replica_assignments={0: [0]})])
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        for _ in range(20):
            producer.send(topic, b"o", partition=0)
        producer.flush(timeout=30)
    blocker = cluster.brokers[target].data_dir / files.log_dir_name(topic, 0)
    blocker.write_text("a file, not a log directory\n")
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "version": 1,
                "partitions": [{"topic": topic, "partition": 0, "replicas": [0, target]}],
            }
        )
    )
    started = cli(cluster, "reassign", "--execute", "--reassignment-json-file", str(plan))
    assert started.returncode == 0, started.stderr
    try:

        def offline_progress() -> ReplicaProgress | None:
            progress = admin.list_partition_reassignments([tp])[tp].progress[target]
            return progress if progress.error is not None else None

        progress = wait_until(offline_progress, f"broker {target} answers its replica offline")
        assert isinstance(progress, ReplicaProgress) and isinstance(progress.error, StorageError)
        assert progress.reachable and not progress.in_sync
        assert progress.error.message.startswith(
            f"the log of {topic}-0 on broker {target} is offline"
        )
        assert (progress.log_end_offset, progress.size_bytes) == (-1, -1)
        assert (progress.lag_records, progress.lag_bytes) == (-1, -1)
        verify = cli(cluster, "reassign", "--verify", "--reassignment-json-file", str(plan))
        assert verify.returncode == 0, verify.stderr
        assert "still in progress" in verify.stdout and "catching up" not in verify.stdout
        shown = f"  replica {target}: offline: the log of {topic}-0 on broker {target} is offline ("
        assert shown in verify.stdout, verify.stdout
    finally:
        cancel = cli(cluster, "reassign", "--cancel", "--reassignment-json-file", str(plan))
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert partition(admin, tp).replicas == [0]


def _start_throttled_move(
    cluster: ClusterProcesses,
    admin: AdminClient,
    tp: TopicPartition,
    leader: int,
    target: int,
    tmp_path: Path,
) -> Path:
    """Create `tp` on `leader` alone with 20 records of 100 B, and start its
    move to [leader, target] at 1 byte/s (the new replica gets the records'
    one batch only once the leader's throttle allows a byte: a leader that
    restarts may send it at once); returns the plan's file."""
    admin.create_topics([NewTopic(tp.topic, -1, -1, replica_assignments={tp.partition: [leader]})])
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        for _ in range(20):
            producer.send(tp.topic, b"m" * 100, partition=tp.partition)
        producer.flush(timeout=30)
    plan = tmp_path / "plan.json"
    moves = [{"topic": tp.topic, "partition": tp.partition, "replicas": [leader, target]}]
    plan.write_text(json.dumps({"version": 1, "partitions": moves}))
    started = cli(
        cluster, "reassign", "--execute", "--reassignment-json-file", str(plan), "--throttle", "1"
    )
    assert started.returncode == 0, started.stderr
    return plan


def _cancel_unless_done(cluster: ClusterProcesses, plan: Path) -> None:
    """Cancel the moves of `plan`, unless they ended meanwhile."""
    cancel = cli(cluster, "reassign", "--cancel", "--reassignment-json-file", str(plan))
    done = "has no reassignment to cancel" in cancel.stdout + cancel.stderr
    assert cancel.returncode == 0 or done, cancel.stdout + cancel.stderr


def test_reassign_verify_says_the_lag_is_unknown_while_the_leader_cannot_tell(
    cluster: ClusterProcesses, admin: AdminClient, tmp_path: Path
) -> None:
    """A move whose leader stops (its only in-sync replica: the partition is
    left without a leader). ListPartitionReassignments answered the
    leader's figures as 0 and the new replica's lags as 0, and --verify
    printed "log end offset 1 of 0, 0 records (0 bytes) behind leader -1",
    as if it had caught up. Now -1 (unknown), and --verify says so."""
    topic, leader, target = "cli-headless", 3, 2
    tp = TopicPartition(topic, 0)
    plan = _start_throttled_move(cluster, admin, tp, leader, target, tmp_path)
    try:
        progress = wait_until(
            lambda: admin.list_partition_reassignments([tp])[tp].progress[target].reachable,
            f"broker {target} answers for its new replica",
        )
        assert progress
        moving = admin.list_partition_reassignments([tp])[tp]
        assert (moving.leader, moving.leader_log_end_offset) == (leader, 20), moving
        cluster.brokers[leader].stop()
        try:
            headless = wait_until(
                lambda: (m := admin.list_partition_reassignments([tp])[tp]).leader == -1 and m,
                "the partition without a leader",
            )
            assert isinstance(headless, PartitionReassignment)
            assert headless.leader_log_end_offset == -1, headless
            copying = headless.progress[target]
            assert copying.reachable and copying.error is None, copying
            assert copying.log_end_offset >= 0, copying
            assert (copying.lag_records, copying.lag_bytes) == (-1, -1), copying
            verify = cli(cluster, "reassign", "--verify", "--reassignment-json-file", str(plan))
            assert verify.returncode == 0, verify.stderr
            shown = (
                f"  replica {target}: catching up, log end offset {copying.log_end_offset}, "
                "lag unknown: the leader's figures are unknown (the partition has no leader)\n"
            )
            assert shown in verify.stdout, verify.stdout
            assert "behind leader" not in verify.stdout, verify.stdout
        finally:
            cluster.brokers[leader].spawn()
            cluster.wait_registered(len(cluster.brokers))
    finally:
        # The leader, back, sends the new replica its batch whole once its
        # throttle's bucket has a byte (replica_throttle): the move may end
        # before the cancel.
        _cancel_unless_done(cluster, plan)
    assert partition(admin, tp).replicas in ([leader], [leader, target])


def test_a_new_replica_whose_broker_does_not_answer_has_unknown_figures(
    cluster: ClusterProcesses, admin: AdminClient, tmp_path: Path
) -> None:
    """A move whose new replica's broker stops: ListPartitionReassignments
    answered its figures and lags as 0 beside `reachable` False, which a
    program not looking at `reachable` reads as caught up. Now -1
    (unknown); --verify says it is not reachable."""
    topic, leader, target = "cli-unanswered", 1, 2
    tp = TopicPartition(topic, 0)
    plan = _start_throttled_move(cluster, admin, tp, leader, target, tmp_path)
    try:
        assert wait_until(
            lambda: admin.list_partition_reassignments([tp])[tp].progress[target].reachable,
            f"broker {target} answers for its new replica",
        )
        cluster.brokers[target].stop()
        try:

            def unanswered_progress() -> ReplicaProgress | None:
                progress = admin.list_partition_reassignments([tp])[tp].progress[target]
                return None if progress.reachable else progress

            unanswered = wait_until(unanswered_progress, f"broker {target} no longer answers")
            assert isinstance(unanswered, ReplicaProgress)
            figures = (
                unanswered.log_end_offset,
                unanswered.size_bytes,
                unanswered.lag_records,
                unanswered.lag_bytes,
            )
            assert figures == (-1, -1, -1, -1), unanswered
            moving = admin.list_partition_reassignments([tp])[tp]
            assert (moving.leader, moving.leader_log_end_offset) == (leader, 20), moving
            verify = cli(cluster, "reassign", "--verify", "--reassignment-json-file", str(plan))
            assert verify.returncode == 0, verify.stderr
            assert f"  replica {target}: not reachable\n" in verify.stdout, verify.stdout
        finally:
            cluster.brokers[target].spawn()
            cluster.wait_registered(len(cluster.brokers))
    finally:
        # Back, the new replica may catch up and end the move first (the
        # leader sends a batch whole once its throttle's bucket has a byte).
        _cancel_unless_done(cluster, plan)
    assert partition(admin, tp).replicas in ([leader], [leader, target])


def test_brokers_decommission_plans_then_empties_the_broker(
    cluster: ClusterProcesses, admin: AdminClient, tmp_path: Path
) -> None:
    admin.create_topics([NewTopic("cli-decom", 4, 2)])
    plan_only = cli(cluster, "brokers", "decommission", "1")
    assert plan_only.returncode == 0, plan_only.stderr
    plan = json.loads(plan_only.stdout)
    assert plan["partitions"] and all(1 not in p["replicas"] for p in plan["partitions"])
    assert "plan only" in plan_only.stderr

    def on_broker_1() -> list[str]:
        return [
            f"{t.name}-{p.partition}"
            for t in admin.describe_topics()
            for p in t.partitions
            if 1 in p.replicas
        ]

    assert on_broker_1()  # the plan changed nothing
    started = cli(cluster, "brokers", "decommission", "1", "--execute")
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        wait_until(lambda: not on_broker_1(), "no replica left on broker 1", timeout_s=90)
    except AssertionError as exc:
        moving = admin.list_partition_reassignments()
        raise AssertionError(f"{exc}; on broker 1: {on_broker_1()}; moving: {moving}") from None
    assert cli(cluster, "brokers", "decommission", "1").stderr.startswith(
        "broker 1 holds no replica"
    )
