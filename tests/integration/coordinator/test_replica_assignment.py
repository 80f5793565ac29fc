"""Topics created with an explicit replica assignment (issue 17): Kafka's
NewTopic(replica_assignments=...) and kafka-topics --replica-assignment.

A real cluster: etcd, a coordinator, three brokers (broker 2 with a low
open-file limit, so that the capacity check can be reached). The
assignment is what DescribeTopics shows, each first replica leads and
takes writes; each wrong assignment is refused naming what is wrong, and
nothing is created. A standalone broker accepts only itself.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from tidelog import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tidelog.errors import InvalidRequestError
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2

from tests.support.cluster import ClusterProcesses
from tests.support.coordinator import start_coordinator
from tests.support.etcd import EtcdProcess
from tests.support.processes import start_broker

pytestmark = pytest.mark.timeout(120)

OPEN_FILE_LIMIT = 300
# resources.partition_capacity: (limit - 128 reserved) // 4 per partition.
CAPACITY = (OPEN_FILE_LIMIT - 128) // 4
LIMITED_BROKER = 2


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterProcesses]:
    root: Path = tmp_path_factory.mktemp("replica-assignment")
    prefix = "/replica-assignment"
    processes = ClusterProcesses(etcd, prefix)
    try:
        processes.coordinators.append(
            start_coordinator(
                etcd.endpoint, root / "logs", prefix=prefix, coordinator_id="c0", session_ttl_s=3
            )
        )
        for broker_id in range(3):
            processes.brokers.append(
                start_broker(
                    root / f"broker-{broker_id}",
                    extra_args=processes.broker_args(broker_id),
                    broker_id=broker_id,
                    open_file_limit=OPEN_FILE_LIMIT if broker_id == LIMITED_BROKER else None,
                )
            )
        processes.wait_registered(3)
        yield processes
    finally:
        processes.stop()


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)


def create_raw(
    address: str,
    name: str,
    assignment: Sequence[tuple[int, Sequence[int]]],
    partitions: int = -1,
    replication_factor: int = -1,
    configs: dict[str, str] | None = None,
    validate_only: bool = False,
) -> admin_pb2.TopicResult:
    """CreateTopics through the raw stub, as any client would send it."""
    with grpc.insecure_channel(address) as channel:
        reply = admin_pb2_grpc.AdminStub(channel).CreateTopics(
            admin_pb2.CreateTopicsRequest(
                topics=[
                    admin_pb2.NewTopic(
                        name=name,
                        partitions=partitions,
                        replication_factor=replication_factor,
                        configs=configs or {},
                        replica_assignment=[
                            admin_pb2.ReplicaAssignment(partition=p, broker_ids=list(ids))
                            for p, ids in assignment
                        ],
                    )
                ],
                validate_only=validate_only,
            ),
            timeout=30,
        )
    return reply.topics[0]


def topic_exists(cluster: ClusterProcesses, name: str) -> bool:
    with AdminClient(cluster.bootstrap) as admin:
        return name in admin.list_topics()


def test_the_assignment_is_what_describe_shows_and_first_replicas_lead(
    cluster: ClusterProcesses,
) -> None:
    # Not the coordinator's own placement: broker 2 leads two partitions.
    assignment = {0: [2, 0], 1: [2, 1], 2: [1, 0]}
    with AdminClient(cluster.bootstrap) as admin:
        results = admin.create_topics(
            [NewTopic("assigned", -1, -1, replica_assignments=assignment)]
        )
        assert results == {"assigned": None}
        (topic,) = admin.describe_topics(["assigned"])
        assert {p.partition: p.replicas for p in topic.partitions} == assignment
        assert {p.partition: p.leader for p in topic.partitions} == {0: 2, 1: 2, 2: 1}

        def isr_is_full() -> bool:
            (now,) = admin.describe_topics(["assigned"])
            return all(sorted(p.isr) == sorted(p.replicas) for p in now.partitions)

        wait_until(isr_is_full, "every replica in sync")
    # The leaders take writes with acks=all, and the records read back.
    with Producer(cluster.bootstrap, acks="all") as producer:
        for partition in assignment:
            producer.send("assigned", f"p{partition}".encode(), partition=partition).get(30)
    with Consumer(bootstrap_servers=cluster.bootstrap, consumer_timeout_ms=5000) as consumer:
        consumer.assign([TopicPartition("assigned", p) for p in assignment])
        seen = {(r.partition, r.value) for r in consumer}
    assert seen == {(p, f"p{p}".encode()) for p in assignment}


@pytest.mark.parametrize(
    ("assignment", "partitions", "factor", "message"),
    [
        ([(0, [0, 1]), (2, [1, 2])], -1, -1, "names partition 2: with 2 partitions"),
        ([(0, [0, 1]), (0, [1, 2])], -1, -1, "gives partition 0 twice"),
        ([(0, [0, 1]), (1, [1])], -1, -1, "partition 1 has 1 replicas, expected 2"),
        ([(0, [0, 1])], -1, 3, "expected 3 (the replication factor asked for)"),
        ([(0, [0, 1])], 2, -1, "asks for 2 partitions but its replica assignment has 1"),
        ([(0, [1, 1])], -1, -1, "lists a broker twice (1:1)"),
        ([(0, [0, 7])], -1, -1, "names broker 7, which is not a live broker (live: 0, 1, 2)"),
        ([(0, [])], -1, -1, "replication factor 0"),
    ],
    ids=[
        "gap",
        "partition-twice",
        "uneven",
        "factor-mismatch",
        "count-mismatch",
        "broker-twice",
        "unknown-broker",
        "no-replicas",
    ],
)
def test_a_wrong_assignment_is_refused_naming_what_is_wrong_and_nothing_is_created(
    cluster: ClusterProcesses,
    assignment: list[tuple[int, list[int]]],
    partitions: int,
    factor: int,
    message: str,
    request: pytest.FixtureRequest,
) -> None:
    name = f"wrong-{request.node.callspec.id}"
    result = create_raw(cluster.coordinators[0].address, name, assignment, partitions, factor)
    assert result.error.code == common_pb2.INVALID_REQUEST, result
    assert message in result.error.message
    assert repr(name) in result.error.message
    assert not topic_exists(cluster, name)


def test_an_assignment_past_a_brokers_capacity_is_refused(cluster: ClusterProcesses) -> None:
    assignment = [(p, [LIMITED_BROKER]) for p in range(CAPACITY + 1)]
    result = create_raw(cluster.coordinators[0].address, "too-many-on-2", assignment)
    assert result.error.code == common_pb2.INVALID_PARTITIONS, result
    # (plus what earlier tests of the module put on it)
    assert f"broker {LIMITED_BROKER} would host" in result.error.message
    assert f"over its limit of {CAPACITY}" in result.error.message
    assert not topic_exists(cluster, "too-many-on-2")


def test_min_insync_replicas_is_checked_against_the_assignments_factor(
    cluster: ClusterProcesses,
) -> None:
    result = create_raw(
        cluster.coordinators[0].address,
        "isr-too-high",
        [(0, [0, 1])],
        configs={"min.insync.replicas": "3"},
    )
    assert result.error.code == common_pb2.INVALID_CONFIG, result
    assert "replication factor 2" in result.error.message


def test_validate_only_checks_an_assignment_and_creates_nothing(
    cluster: ClusterProcesses,
) -> None:
    address = cluster.coordinators[0].address
    ok = create_raw(address, "validated", [(0, [1, 2])], validate_only=True)
    assert not ok.HasField("error"), ok
    bad = create_raw(address, "validated", [(0, [1, 9])], validate_only=True)
    assert bad.error.code == common_pb2.INVALID_REQUEST, bad
    assert not topic_exists(cluster, "validated")


def test_the_sdk_refuses_counts_that_disagree_with_the_assignment(
    cluster: ClusterProcesses,
) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        # num_partitions left at its default 1: kafka-python users pass -1.
        with pytest.raises(InvalidRequestError, match="num_partitions=1 but replica_assignments"):
            admin.create_topics([NewTopic("sdk-shape", replica_assignments={0: [0], 1: [1]})])
        with pytest.raises(InvalidRequestError, match="pass replication_factor=-1"):
            admin.create_topics([NewTopic("sdk-shape", 1, 3, replica_assignments={0: [0, 1]})])
        # Counts that agree are as good as -1.
        assert admin.create_topics(
            [NewTopic("sdk-shape", 2, 1, replica_assignments={0: [1], 1: [0]})]
        ) == {"sdk-shape": None}
        (topic,) = admin.describe_topics(["sdk-shape"])
    assert [(p.replicas, p.leader) for p in topic.partitions] == [([1], 1), ([0], 0)]


def tidelog_cli(*args: str, bootstrap: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidelog.cli", *args, "--bootstrap-server", bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_takes_kafka_topics_replica_assignment_syntax(
    cluster: ClusterProcesses,
) -> None:
    created = tidelog_cli(
        "topics", "create", "cli-assigned", "--replica-assignment", "1:2:0,0:1:2",
        bootstrap=cluster.bootstrap,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert "created topic cli-assigned with 2 partition(s)" in created.stdout
    with AdminClient(cluster.bootstrap) as admin:
        (topic,) = admin.describe_topics(["cli-assigned"])
    assert [(p.replicas, p.leader) for p in topic.partitions] == [([1, 2, 0], 1), ([0, 1, 2], 0)]

    described = tidelog_cli("topics", "describe", "cli-assigned", bootstrap=cluster.bootstrap)
    assert described.returncode == 0, described.stderr
    assert "1,2,0" in described.stdout and "0,1,2" in described.stdout

    # A broker that is not live: the cluster refuses the request as invalid (usage, 2).
    refused = tidelog_cli(
        "topics", "create", "cli-refused", "--replica-assignment", "0:5",
        bootstrap=cluster.bootstrap,
    )  # fmt: skip
    assert refused.returncode == 2, refused
    assert "names broker 5, which is not a live broker" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    # Malformed: a usage error naming the partition, before anything is sent.
    malformed = tidelog_cli(
        "topics", "create", "cli-refused", "--replica-assignment", "0:1,1:x",
        bootstrap=cluster.bootstrap,
    )  # fmt: skip
    assert malformed.returncode == 2, malformed
    assert "partition 1 is '1:x'" in malformed.stderr
    # Counts that disagree with the assignment are refused by name.
    mismatch = tidelog_cli(
        "topics", "create", "cli-refused", "--replica-assignment", "0:1,1:2",
        "--partitions", "3", bootstrap=cluster.bootstrap,
    )  # fmt: skip
    assert mismatch.returncode == 2, mismatch
    assert "num_partitions=3 but replica_assignments gives 2" in mismatch.stderr
    assert not topic_exists(cluster, "cli-refused")


def test_a_standalone_broker_accepts_only_an_assignment_of_itself(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data", broker_id=4)
    try:
        ok = create_raw(broker.address, "mine", [(0, [4]), (1, [4])])
        assert not ok.HasField("error"), ok
        with AdminClient(broker.address) as admin:
            (topic,) = admin.describe_topics(["mine"])
        assert [(p.replicas, p.leader) for p in topic.partitions] == [([4], 4), ([4], 4)]

        other = create_raw(broker.address, "elsewhere", [(0, [4, 5])])
        assert other.error.code == common_pb2.INVALID_REQUEST, other
        assert "standalone broker (id 4) can only place every partition on itself" in (
            other.error.message
        )
        gap = create_raw(broker.address, "elsewhere", [(0, [4]), (2, [4])])
        assert gap.error.code == common_pb2.INVALID_REQUEST, gap
        assert "list each of 0 to 1 once" in gap.error.message
        with AdminClient(broker.address) as admin:
            assert "elsewhere" not in admin.list_topics()
        assert broker.proc is not None and broker.proc.poll() is None
    finally:
        broker.stop()
