"""A cluster (etcd, a coordinator, one broker) refusing what makes no sense,
through the raw stubs as any client would: topic names no topic can have,
CreateTopics requests over their limits, min.insync.replicas no replica set
can satisfy, a topic named twice in one admin request, ListOffsets over its
limits. Each answer names what is wrong; nothing is created. A describing
request (Metadata through a broker or the gateway, DescribeTopics) describes
a name given many times once; ListOffsets answers a partition named many
times (earliest and latest, say) in each entry."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tidelog import AdminClient, NewTopic, Producer
from tidelog.errors import ERROR_CODE_METADATA_KEY, InvalidConfigError, InvalidTopicError
from tidelog.request_limits import (
    MAX_LIST_OFFSETS_ENTRIES,
    MAX_PARTITIONS_PER_TOPIC,
    MAX_TIMESTAMPS_PER_PARTITION,
    MAX_TOPICS_PER_REQUEST,
)
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2, log_pb2, log_pb2_grpc

from tests.support.admin_requests import delete_records_request, topic_request
from tests.support.cluster import ClusterProcesses, start_cluster
from tests.support.etcd import EtcdProcess
from tests.support.gateway import GatewayProcess

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterProcesses]:
    root: Path = tmp_path_factory.mktemp("admin-limits")
    processes = start_cluster(root, etcd=etcd, prefix="/admin-limits", brokers=1)
    try:
        yield processes
    finally:
        processes.stop()


def error_code(exc: grpc.RpcError) -> str:
    return dict(exc.trailing_metadata() or ()).get(ERROR_CODE_METADATA_KEY, "")  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["bad/name", ""])
def test_metadata_answers_invalid_topic_for_a_bad_name(
    cluster: ClusterProcesses, name: str
) -> None:
    with grpc.insecure_channel(cluster.brokers[0].address) as channel:
        reply = log_pb2_grpc.LogStub(channel).Metadata(
            log_pb2.MetadataRequest(topics=[name], allow_auto_topic_creation=True), timeout=10
        )
    assert reply.topics[0].error.code == common_pb2.INVALID_TOPIC, reply
    assert "topic name" in reply.topics[0].error.message


#: The fuzzer's shape (seed 968513106, case 7723), scaled down: a Metadata
#: naming a topic of many partitions thousands of times. Described once per
#: entry, it built NAMED_TIMES x WIDE_PARTITIONS partition entries on the
#: broker's event loop (the fuzzer's ~5,000 x ~10,000: every other call to
#: that broker waited past its 30 s deadline).
WIDE_PARTITIONS = 200
NAMED_TIMES = 2000
#: How long the gateway's etcd view may take to learn a new topic.
VIEW_DEADLINE_S = 30.0


def _metadata(address: str, topics: list[str]) -> log_pb2.MetadataResponse:
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    with grpc.insecure_channel(address, options=options) as channel:
        return log_pb2_grpc.LogStub(channel).Metadata(  # type: ignore[no-any-return]
            log_pb2.MetadataRequest(topics=topics), timeout=60
        )


@pytest.mark.parametrize("service", ["broker", "gateway"])
def test_a_topic_named_many_times_in_one_metadata_is_described_once(
    cluster: ClusterProcesses, gateway: GatewayProcess, service: str
) -> None:
    """One description per distinct name, in the order first given (Kafka's
    brokers take the topics as a set)."""
    wide, once = f"meta-wide-{service}", f"meta-once-{service}"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(wide, WIDE_PARTITIONS, 1), NewTopic(once, 2, 1)])
    address = cluster.brokers[0].address if service == "broker" else gateway.address
    deadline = time.monotonic() + VIEW_DEADLINE_S
    while len(_metadata(address, [wide, once]).topics[1].partitions) < 2:
        assert time.monotonic() < deadline, f"{address} never learned {once}"
        time.sleep(0.1)

    reply = _metadata(address, [wide] * NAMED_TIMES + [once] + [wide])
    answers = [(t.name, t.error.code, len(t.partitions)) for t in reply.topics]
    assert answers == [(wide, common_pb2.NONE, WIDE_PARTITIONS), (once, common_pb2.NONE, 2)]


def _list_offsets(address: str, entries: list[tuple[str, int, int]]) -> log_pb2.ListOffsetsResponse:
    request = log_pb2.ListOffsetsRequest(
        partitions=[
            log_pb2.ListOffsetsPartition(topic=t, partition=p, timestamp_ms=ts)
            for t, p, ts in entries
        ]
    )
    with grpc.insecure_channel(address) as channel:
        return log_pb2_grpc.LogStub(channel).ListOffsets(request, timeout=60)  # type: ignore[no-any-return]


@pytest.mark.parametrize("service", ["broker", "gateway"])
def test_list_offsets_names_a_partition_many_times_within_the_timestamp_limit(
    cluster: ClusterProcesses, gateway: GatewayProcess, service: str
) -> None:
    """Earliest, latest and timestamps of one partition in one request are
    answered, a repeated entry as its first; distinct timestamps past
    MAX_TIMESTAMPS_PER_PARTITION are refused per entry, naming it (the
    reverted fix refused every entry of a partition named twice)."""
    topic = f"offsets-many-{service}"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    start = int(time.time() * 1000) - 100_000
    records = MAX_TIMESTAMPS_PER_PARTITION + 2
    with Producer(cluster.bootstrap, linger_ms=0) as producer:
        for i in range(records):
            producer.send(topic, b"x", partition=0, timestamp_ms=start + i).get(timeout=30)
    address = cluster.brokers[0].address if service == "broker" else gateway.address
    deadline = time.monotonic() + VIEW_DEADLINE_S
    while _list_offsets(address, [(topic, 0, -1)]).partitions[0].HasField("error"):
        assert time.monotonic() < deadline, f"{address} never learned {topic}"
        time.sleep(0.1)

    timestamps = [start + i for i in range(records)]
    entries = [(topic, 0, ts) for ts in [-2, -1, *timestamps, start, -1, -2]]
    reply = _list_offsets(address, entries)
    answers = [(r.partition, r.error.code, r.offset, r.timestamp_ms) for r in reply.partitions]
    looked_up = [(0, common_pb2.NONE, i, start + i) for i in range(MAX_TIMESTAMPS_PER_PARTITION)]
    assert answers == [
        (0, common_pb2.NONE, 0, -1),
        (0, common_pb2.NONE, records, -1),
        *looked_up,
        *[(0, common_pb2.INVALID_REQUEST, -1, -1)] * (records - MAX_TIMESTAMPS_PER_PARTITION),
        looked_up[0],
        (0, common_pb2.NONE, records, -1),
        (0, common_pb2.NONE, 0, -1),
    ]
    refused = reply.partitions[2 + MAX_TIMESTAMPS_PER_PARTITION].error.message
    assert "MAX_TIMESTAMPS_PER_PARTITION" in refused


@pytest.mark.parametrize("service", ["broker", "gateway"])
def test_list_offsets_over_the_entry_limit_is_refused_naming_it(
    cluster: ClusterProcesses, gateway: GatewayProcess, service: str
) -> None:
    address = cluster.brokers[0].address if service == "broker" else gateway.address
    entries = [("offsets-limit", 0, -1)] * (MAX_LIST_OFFSETS_ENTRIES + 1)
    with pytest.raises(grpc.RpcError) as info:
        _list_offsets(address, entries)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert error_code(info.value) == "INVALID_REQUEST"
    assert "MAX_LIST_OFFSETS_ENTRIES" in info.value.details()  # type: ignore[attr-defined]
    # At the limit: answered, each entry (an unknown topic here).
    reply = _list_offsets(address, entries[1:])
    assert len(reply.partitions) == MAX_LIST_OFFSETS_ENTRIES
    assert {r.error.code for r in reply.partitions} == {common_pb2.UNKNOWN_TOPIC_OR_PARTITION}


def test_a_topic_named_many_times_in_one_describe_topics_is_described_once(
    cluster: ClusterProcesses,
) -> None:
    wide, once = "describe-wide", "describe-once"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(wide, WIDE_PARTITIONS, 1), NewTopic(once, 2, 1)])
    names = [wide] * (MAX_TOPICS_PER_REQUEST - 2) + [once, wide]
    for address in (cluster.coordinators[0].address, cluster.brokers[0].address):
        with grpc.insecure_channel(address) as channel:
            reply = admin_pb2_grpc.AdminStub(channel).DescribeTopics(
                admin_pb2.DescribeTopicsRequest(names=names), timeout=60
            )
        answers = [(t.name, t.error.code, len(t.partitions)) for t in reply.topics]
        assert answers == [
            (wide, common_pb2.NONE, WIDE_PARTITIONS),
            (once, common_pb2.NONE, 2),
        ], address


def test_the_producer_fails_at_once_on_a_bad_name(cluster: ClusterProcesses) -> None:
    with (
        Producer(cluster.bootstrap, max_block_ms=600_000) as producer,
        pytest.raises(InvalidTopicError),
    ):
        producer.send("bad/name", b"x")


@pytest.mark.parametrize(
    ("topics", "limit"),
    [
        (
            [admin_pb2.NewTopic(name=f"many-{i}") for i in range(MAX_TOPICS_PER_REQUEST + 1)],
            "MAX_TOPICS_PER_REQUEST",
        ),
        (
            [admin_pb2.NewTopic(name="wide", partitions=MAX_PARTITIONS_PER_TOPIC + 1)],
            "MAX_PARTITIONS_PER_TOPIC",
        ),
    ],
)
def test_create_topics_over_a_limit_is_invalid_request_naming_it(
    cluster: ClusterProcesses, topics: list[admin_pb2.NewTopic], limit: str
) -> None:
    address = cluster.coordinators[0].address
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as info:
        admin_pb2_grpc.AdminStub(channel).CreateTopics(
            admin_pb2.CreateTopicsRequest(topics=topics), timeout=30
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert error_code(info.value) == "INVALID_REQUEST"
    assert limit in info.value.details()  # type: ignore[attr-defined]
    with AdminClient(cluster.bootstrap) as admin:
        assert not {"wide", "many-0"} & set(admin.list_topics())


def test_min_insync_replicas_above_the_replication_factor_is_refused(
    cluster: ClusterProcesses,
) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        with pytest.raises(
            InvalidConfigError, match=r"min\.insync\.replicas=2 .* replication factor 1"
        ):
            admin.create_topics([NewTopic("misr", 1, 1, {"min.insync.replicas": "2"})])
        admin.create_topics([NewTopic("misr-ok", 1, 1)])
        with pytest.raises(InvalidConfigError, match=r"min\.insync\.replicas=2"):
            admin.alter_configs({"misr-ok": {"min.insync.replicas": "2"}})
        assert "misr" not in admin.list_topics()
        assert admin.describe_configs(["misr-ok"])["misr-ok"]["min.insync.replicas"].value == "1"


_TOO_MANY = [f"many-{i}" for i in range(MAX_TOPICS_PER_REQUEST + 1)]
NAMED_TOPIC_REQUESTS = [
    ("DeleteTopics", admin_pb2.DeleteTopicsRequest(names=_TOO_MANY)),
    ("DescribeTopics", admin_pb2.DescribeTopicsRequest(names=_TOO_MANY)),
    ("DescribeConfigs", admin_pb2.DescribeConfigsRequest(names=_TOO_MANY)),
    (
        "AlterConfigs",
        admin_pb2.AlterConfigsRequest(
            topics=[admin_pb2.AlterTopicConfigs(name=n) for n in _TOO_MANY]
        ),
    ),
]


# Found by the fuzzer (tests/security): a DeleteTopics naming 20,000 topics
# kept the coordinator busy past any client's deadline.
@pytest.mark.parametrize(
    ("rpc", "request_"), NAMED_TOPIC_REQUESTS, ids=[r for r, _ in NAMED_TOPIC_REQUESTS]
)
def test_admin_requests_naming_too_many_topics_are_refused_naming_the_limit(
    cluster: ClusterProcesses, rpc: str, request_: object
) -> None:
    for address in (cluster.coordinators[0].address, cluster.brokers[0].address):
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as info:
            getattr(admin_pb2_grpc.AdminStub(channel), rpc)(request_, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert error_code(info.value) == "INVALID_REQUEST"
        assert "MAX_TOPICS_PER_REQUEST" in info.value.details()  # type: ignore[attr-defined]


# Found by the fuzzer (tests/security): a DeleteTopics naming one topic 997
# times made 997 etcd transactions, past the fuzz test's deadline under load.
@pytest.mark.parametrize(
    "rpc", ["CreateTopics", "DeleteTopics", "AlterConfigs", "CreatePartitions"]
)
def test_a_topic_named_twice_in_one_request_is_refused_in_each_entry(
    cluster: ClusterProcesses, rpc: str
) -> None:
    """As Kafka does: each entry of a repeated name gets INVALID_REQUEST and
    nothing is done for it; the other entries are answered as usual."""
    twice, once = f"twice-{rpc.lower()}", f"once-{rpc.lower()}"
    with AdminClient(cluster.bootstrap) as admin:
        if rpc != "CreateTopics":
            admin.create_topics([NewTopic(twice, 1, 1), NewTopic(once, 1, 1)])
        before = admin.describe_configs([twice]).get(twice) if rpc != "CreateTopics" else None
    for address in (cluster.coordinators[0].address, cluster.brokers[0].address):
        with grpc.insecure_channel(address) as channel:
            reply = getattr(admin_pb2_grpc.AdminStub(channel), rpc)(
                topic_request(rpc, [twice, once, twice]), timeout=30
            )
        errors = [(t.name, t.error.code, t.error.message) for t in reply.topics]
        assert [e[:2] for e in errors] == [
            (twice, common_pb2.INVALID_REQUEST),
            (once, errors[1][1]),
            (twice, common_pb2.INVALID_REQUEST),
        ], errors
        assert "named more than once in one " + rpc in errors[0][2]
    with AdminClient(cluster.bootstrap) as admin:
        topics = admin.list_topics()
        if rpc == "CreateTopics":
            assert twice not in topics and once in topics
        else:
            # The repeated topic is as it was.
            assert twice in topics
            assert admin.describe_configs([twice])[twice] == before
            assert len(admin.describe_topics([twice])[0].partitions) == 1


#: etcd round trips a request of MAX_TOPICS_PER_REQUEST names of topics that
#: do not exist may cost, with the other services' own requests meanwhile
#: (a few dozen): one per entry would be MAX_TOPICS_PER_REQUEST.
ETCD_REQUESTS_MAX = 200


@pytest.mark.parametrize("rpc", ["DeleteTopics", "AlterConfigs"])
def test_a_request_naming_many_missing_topics_reads_them_once(
    cluster: ClusterProcesses, etcd: EtcdProcess, rpc: str
) -> None:
    missing = [f"missing-{rpc.lower()}-{i}" for i in range(MAX_TOPICS_PER_REQUEST)]
    before = etcd.requests_handled("Range") + etcd.requests_handled("Txn")
    with grpc.insecure_channel(cluster.coordinators[0].address) as channel:
        reply = getattr(admin_pb2_grpc.AdminStub(channel), rpc)(
            topic_request(rpc, missing), timeout=60
        )
    requests = etcd.requests_handled("Range") + etcd.requests_handled("Txn") - before
    assert [t.name for t in reply.topics] == missing
    assert {t.error.code for t in reply.topics} == {common_pb2.UNKNOWN_TOPIC_OR_PARTITION}
    assert "does not exist" in reply.topics[0].error.message
    assert requests < ETCD_REQUESTS_MAX, requests


@pytest.mark.parametrize("rpc", ["ElectLeaders", "AlterPartitionReassignments"])
def test_a_partition_named_twice_in_one_request_is_refused_in_each_entry(
    cluster: ClusterProcesses, rpc: str
) -> None:
    topic = f"parts-{rpc.lower()}"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
    broker = cluster.brokers[0].broker_id
    if rpc == "ElectLeaders":
        request: object = admin_pb2.ElectLeadersRequest(
            partitions=[common_pb2.TopicPartition(topic=topic, partition=p) for p in (0, 1, 0)]
        )
        only_repeated: object = admin_pb2.ElectLeadersRequest(
            partitions=[common_pb2.TopicPartition(topic=topic, partition=0)] * 2
        )
    else:
        request = admin_pb2.AlterPartitionReassignmentsRequest(
            partitions=[
                admin_pb2.PartitionReassignment(topic=topic, partition=p, replicas=[broker])
                for p in (0, 1, 0)
            ]
        )
        only_repeated = admin_pb2.AlterPartitionReassignmentsRequest(
            partitions=[admin_pb2.PartitionReassignment(topic=topic, partition=0)] * 2
        )
    with grpc.insecure_channel(cluster.coordinators[0].address) as channel:
        stub = getattr(admin_pb2_grpc.AdminStub(channel), rpc)
        reply = stub(request, timeout=30)
        # Every entry repeated: nothing is done, and an ElectLeaders does not
        # take the empty remainder for "every partition".
        refused = stub(only_repeated, timeout=30)
    answers = [(p.topic, p.partition, p.error.code) for p in reply.partitions]
    assert [a[:2] for a in answers] == [(topic, 0), (topic, 1), (topic, 0)], answers
    assert answers[0][2] == answers[2][2] == common_pb2.INVALID_REQUEST
    assert answers[1][2] != common_pb2.INVALID_REQUEST
    assert f"partition {topic}-0 is named more than once in one {rpc}" in (
        reply.partitions[0].error.message
    )
    assert [(p.partition, p.error.code) for p in refused.partitions] == [
        (0, common_pb2.INVALID_REQUEST)
    ] * 2


def test_a_partition_named_twice_in_one_delete_records_is_refused_in_each_entry(
    cluster: ClusterProcesses,
) -> None:
    """Through the coordinator and through a broker (which forwards it there):
    the repeated partition keeps its log start, the other one's moves."""
    topic = "parts-deleterecords"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=0) as producer:
        for partition in (0, 1):
            for _ in range(10):
                producer.send(topic, b"x", partition=partition).get(timeout=30)
    paths = [(cluster.coordinators[0].address, 3), (cluster.brokers[0].address, 6)]
    for address, offset in paths:
        with grpc.insecure_channel(address) as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            reply = stub.DeleteRecords(
                delete_records_request(topic, [(0, offset), (1, offset), (0, offset + 1)]),
                timeout=30,
            )
            refused = stub.DeleteRecords(
                delete_records_request(topic, [(0, 2), (0, 2)]), timeout=30
            )
        answers = [(p.partition, p.error.code, p.low_watermark) for p in reply.partitions]
        assert answers == [
            (0, common_pb2.INVALID_REQUEST, 0),
            (1, common_pb2.NONE, offset),
            (0, common_pb2.INVALID_REQUEST, 0),
        ], (address, reply)
        assert f"partition {topic}-0 is named more than once in one DeleteRecords" in (
            reply.partitions[0].error.message
        )
        assert [(p.partition, p.error.code) for p in refused.partitions] == [
            (0, common_pb2.INVALID_REQUEST)
        ] * 2
        with AdminClient(cluster.bootstrap) as admin:
            starts = {
                p.partition: p.log_start_offset
                for p in admin.describe_topics([topic])[0].partitions
            }
        assert starts == {0: 0, 1: offset}, (address, starts)
