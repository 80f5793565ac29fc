"""Records.Consume streams that grant credit and never read cost the gateway
about that credit (issue 10): 200 idle streams over a backlog on three
brokers, reading explicit partitions or each a member of a consumer group,
each on a fresh gateway. Prints the gateway's RSS.

The brokers allow 100 Fetch streams per connection
(fetch.max.streams.per.connection), so the 200 streams' consumers only
work spread over the gateway's connections to each broker (gRPC alone puts
them all on one).

Each stream's consumer sizes its fetch window from the records its client
granted (records_common.CreditWindow), so an idle stream holds its credit's
worth of records, one batch per leader (a broker sends a whole batch) and
the fixed cost of a stream; before, each held a 1 MiB window per leader
(~5 MiB a stream, ~1 GiB for 200)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import psutil
import pytest
from tidelog.v1 import log_pb2, records_pb2, records_pb2_grpc

from tests.integration.gateway.backlog import write_backlog
from tests.support.cluster import ClusterProcesses, running_cluster
from tests.support.etcd import EtcdProcess
from tests.support.gateway import GatewayProcess, gateway_of

pytestmark = pytest.mark.timeout(300)

KIB = 1024
MIB = 1024 * KIB
TOPIC = "records-backlog"
PARTITIONS = 3
RECORD_BYTES = 100
RECORDS_PER_BATCH = 160  # ~16 KiB batches
BATCHES_PER_PARTITION = 128  # 2 MiB per partition
IDLE_STREAMS = 200
CONNECTIONS = 4
CREDIT_RECORDS = 100
STREAMS_PER_BROKER_CONNECTION = 100


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterProcesses]:
    root = Path(tmp_path_factory.mktemp("cluster-records-memory"))
    config = root / "broker.properties"
    config.write_text(f"fetch.max.streams.per.connection={STREAMS_PER_BROKER_CONNECTION}\n")
    with running_cluster(
        root, etcd=etcd, broker_args=("--config", str(config)), prefix="/records-memory"
    ) as processes:
        yield processes


# `gateway` is tests/conftest.py's, in front of this module's `cluster`.


@pytest.fixture
def fresh_gateway(
    backlog: GatewayProcess, cluster: ClusterProcesses, tmp_path: Path
) -> Iterator[GatewayProcess]:
    """A gateway that has served nothing yet (its RSS is its own)."""
    with gateway_of(cluster, tmp_path) as process:
        yield process


@pytest.fixture(scope="module")
def backlog(gateway: GatewayProcess) -> GatewayProcess:
    write_backlog(
        gateway.address,
        TOPIC,
        PARTITIONS,
        BATCHES_PER_PARTITION,
        RECORDS_PER_BATCH,
        b"v" * RECORD_BYTES,
    )
    return gateway


def _first_request(kind: str, n: int) -> records_pb2.ConsumeRequest:
    if kind == "group":
        # A group each: every stream is a member that owns every partition.
        return records_pb2.ConsumeRequest(
            group=records_pb2.ConsumeGroup(group_id=f"idle-{n}", topics=[TOPIC]),
            credit_records=CREDIT_RECORDS,
        )
    return records_pb2.ConsumeRequest(
        positions=[
            records_pb2.ConsumePosition(topic=TOPIC, partition=p, spec=log_pb2.EARLIEST)
            for p in range(PARTITIONS)
        ],
        credit_records=CREDIT_RECORDS,
    )


async def _idle_streams(address: str, process: psutil.Process, kind: str) -> tuple[int, list[int]]:
    """Open the idle streams and watch the gateway's RSS for a while; then
    read each stream's records. (peak RSS, records each stream delivered)."""
    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(CONNECTIONS)
    ]
    calls = []
    try:
        for i in range(IDLE_STREAMS):
            call = records_pb2_grpc.RecordsStub(channels[i % CONNECTIONS]).Consume(timeout=240)
            await call.write(_first_request(kind, i))  # and read nothing for now
            calls.append(call)
        peak = 0
        for _ in range(80):
            peak = max(peak, process.memory_info().rss)
            await asyncio.sleep(0.1)
        delivered = []
        for call in calls:
            count = 0
            while count < CREDIT_RECORDS:
                # Generous: a stream that gets no records at all fails here.
                response = await asyncio.wait_for(call.read(), 60)
                assert response is not grpc.aio.EOF
                count += len(response.records)
            delivered.append(count)
        return peak, delivered
    finally:
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close(None)


@pytest.mark.parametrize("kind", ["partitions", "group"])
def test_idle_consume_streams_cost_about_their_credit(
    fresh_gateway: GatewayProcess, kind: str
) -> None:
    process = psutil.Process(fresh_gateway.pid)
    baseline = process.memory_info().rss
    peak, delivered = asyncio.run(_idle_streams(fresh_gateway.address, process, kind))
    # Every stream was served (more streams than one broker connection
    # takes), and sent exactly what its client granted.
    assert delivered == [CREDIT_RECORDS] * IDLE_STREAMS
    # Per stream: the records granted (~130 bytes each as sent) and one batch
    # per leader, held as fetched bytes, decoded records and protobuf
    # messages (x4), plus the fixed cost of a stream (its consumer, three
    # upstream Fetch calls, the client's call, in a group its membership:
    # measured ~160 KiB without a group, allowed 256 KiB). With a 1 MiB
    # window per leader, as before, 200 streams grew the gateway by ~1 GiB.
    batch = RECORDS_PER_BATCH * RECORD_BYTES
    per_stream = 4 * (CREDIT_RECORDS * 130 + PARTITIONS * batch) + 256 * KIB
    bound = IDLE_STREAMS * per_stream + 50 * MIB
    print(
        f"\ngateway RSS {baseline // MIB} MiB before, peak {peak // MIB} MiB with "
        f"{IDLE_STREAMS} idle Records.Consume streams ({kind}) of {CREDIT_RECORDS} records' credit "
        f"(growth {(peak - baseline) // MIB} MiB, bound {bound // MIB} MiB; "
        f"{(peak - baseline) // IDLE_STREAMS // KIB} KiB a stream)"
    )
    assert peak - baseline < bound
