"""A gateway's --max-partitions-per-fetch over real gRPC: a Fetch request
that would take its stream over the limit is refused before any of it is
applied, so none of its positions reaches a broker, and the stream ends
INVALID_ARGUMENT naming the limit.

The module's own cluster: one broker, with --metrics-port, whose
`tidelog_broker_fetch_bytes_total{topic}` shows whether the broker ever read
the refused partitions for the gateway. Before the fix the gateway applied
the request, forwarding its positions on the stream it already had to the
broker, and checked the limit after; the client's stream then ended, but
only once the responses queued before it had been written, and meanwhile
the broker read the new partitions with the credit it held. The test keeps
the gateway in that state: its client reads nothing (the first response
fills the stream's flow-control window), and the broker has sent all of the
first topic while holding credit the gateway granted it.
"""

from __future__ import annotations

import queue
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tidelog import AdminClient, NewTopic, Producer
from tidelog.v1 import log_pb2, log_pb2_grpc

from tests.support.cluster import PRODUCE_TIMEOUT_S, ClusterProcesses, running_cluster
from tests.support.etcd import EtcdProcess
from tests.support.gateway import GatewayProcess, gateway_of
from tests.support.processes import free_port

pytestmark = pytest.mark.timeout(300)

LIMIT = 3
#: Generous: bounds a broken test only.
DEADLINE_S = 60.0
#: How long the broker is watched for a read of the refused partitions
#: before the client reads its stream (before the fix: within milliseconds).
WATCH_S = 3.0
#: Record bytes of the first topic: over one response (1 MiB, the gateway's
#: default max_bytes) so that the stream's flow-control window is full, and
#: under the first credit the gateway grants the broker (two responses'
#: worth), so that the broker still holds credit once it has sent them all.
FIRST_TOPIC_BYTES = 1536 * 1024
RECORD_BYTES = 16 * 1024


@pytest.fixture(scope="module")
def metrics_url() -> str:
    return f"http://127.0.0.1:{free_port()}/metrics"


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory, metrics_url: str
) -> Iterator[ClusterProcesses]:
    """One broker, its metrics served at `metrics_url`."""
    port = metrics_url.split(":")[-1].split("/")[0]
    with running_cluster(
        tmp_path_factory.mktemp("cluster"),
        etcd=etcd,
        brokers=1,
        broker_args=["--metrics-port", port],
    ) as processes:
        yield processes


@pytest.fixture(scope="module")
def limited(
    cluster: ClusterProcesses, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """A gateway in front of the module's cluster reading at most LIMIT
    partitions per Fetch stream."""
    with gateway_of(
        cluster,
        tmp_path_factory.mktemp("gateway-fetch-limit"),
        "--max-partitions-per-fetch", str(LIMIT),
    ) as process:  # fmt: skip
        yield process


def fetched_bytes(metrics_url: str, topic: str) -> float:
    """The record bytes the broker has sent fetch streams from `topic`."""
    with urllib.request.urlopen(metrics_url, timeout=10) as answer:
        text = answer.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "tidelog_broker_fetch_bytes_total" and sample.labels == {"topic": topic}
    )


def position(topic: str, partition: int) -> log_pb2.FetchPosition:
    return log_pb2.FetchPosition(topic=topic, partition=partition, fetch_offset=0)


def test_a_request_over_the_stream_limit_reaches_no_broker(
    cluster: ClusterProcesses, limited: GatewayProcess, metrics_url: str
) -> None:
    first, refused = "fetch-limit-first", "fetch-limit-refused"
    with AdminClient(cluster.brokers[0].address) as admin:
        admin.create_topics([NewTopic(first, 1, 1), NewTopic(refused, LIMIT, 1)])
    with Producer(cluster.brokers[0].address, linger_ms=20) as producer:
        futures = [
            producer.send(first, bytes(RECORD_BYTES), partition=0)
            for _ in range(FIRST_TOPIC_BYTES // RECORD_BYTES)
        ]
        futures += [producer.send(refused, b"never fetched", partition=p) for p in range(LIMIT)]
        producer.flush()
        for future in futures:
            future.get(timeout=PRODUCE_TIMEOUT_S)

    requests: queue.Queue[log_pb2.FetchRequest | None] = queue.Queue()

    def request_iterator() -> Iterator[log_pb2.FetchRequest]:
        while (request := requests.get()) is not None:
            yield request

    # No BDP probing: the stream's window stays at its first size, which
    # one response fills, while the client reads nothing.
    with grpc.insecure_channel(limited.address, options=[("grpc.http2.bdp_probe", 0)]) as channel:
        call = log_pb2_grpc.LogStub(channel).Fetch(request_iterator(), timeout=DEADLINE_S * 2)
        requests.put(log_pb2.FetchRequest(positions=[position(first, 0)], credit_bytes=8 << 20))
        # The broker has sent the gateway all of the first topic (and holds
        # the rest of the credit the gateway granted it).
        deadline = time.monotonic() + DEADLINE_S
        while fetched_bytes(metrics_url, first) < FIRST_TOPIC_BYTES:
            assert time.monotonic() < deadline, "the broker did not send the first topic"
            time.sleep(0.1)
        # One partition read, LIMIT more asked for: over the limit.
        requests.put(log_pb2.FetchRequest(positions=[position(refused, p) for p in range(LIMIT)]))
        watched_until = time.monotonic() + WATCH_S
        while time.monotonic() < watched_until:
            assert fetched_bytes(metrics_url, refused) == 0, (
                "the broker read partitions of a request the gateway refused"
            )
            time.sleep(0.1)
        responses = []
        with pytest.raises(grpc.RpcError) as ended:
            for response in call:
                responses.append(response)
        requests.put(None)
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"over the limit of {LIMIT} (--max-partitions-per-fetch)" in ended.value.details()
    assert f"would read {LIMIT + 1} partitions" in ended.value.details()
    assert {(p.topic, p.partition) for r in responses for p in r.partitions} == {(first, 0)}
    assert fetched_bytes(metrics_url, refused) == 0
