"""Fetch streams that grant credit and never read cost the gateway at most
that credit (issue 10): 200 idle streams over a backlog on three brokers,
the gateway's own budgets set far above what they could hold, so only the
end-to-end credit bounds it. Prints the gateway's RSS."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import grpc
import grpc.aio
import psutil
import pytest
from tidelog import Consumer, TopicPartition
from tidelog.v1 import log_pb2, log_pb2_grpc

from tests.integration.gateway.backlog import write_backlog
from tests.support.cluster import ClusterProcesses
from tests.support.gateway import GatewayProcess, gateway_of

pytestmark = pytest.mark.timeout(240)

MIB = 1024 * 1024
TOPIC = "gateway-backlog"
PARTITIONS = 3
BATCH_BYTES = 16 * 1024
RECORDS_PER_BATCH = 16
BATCHES_PER_PARTITION = 128  # 2 MiB per partition, 6 MiB in all
IDLE_STREAMS = 200
CONNECTIONS = 4
CREDIT = 64 * 1024


@pytest.fixture(scope="module")
def gateway(
    cluster: ClusterProcesses, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    # Budgets far above what 200 streams could hold, so that only the
    # credit bounds the gateway (1 GiB: a broken gateway cannot take more).
    with gateway_of(
        cluster,
        tmp_path_factory.mktemp("gateway-memory"),
        "--fetch-buffer-max-bytes", str(1024 * MIB),
        "--fetch-buffer-max-bytes-per-connection", str(1024 * MIB),
    ) as process:  # fmt: skip
        write_backlog(
            process.address,
            TOPIC,
            PARTITIONS,
            BATCHES_PER_PARTITION,
            RECORDS_PER_BATCH,
            b"v" * (BATCH_BYTES // RECORDS_PER_BATCH),
        )
        yield process


def _read_backlog(address: str) -> int:
    """A well-behaved consumer (the SDK) through the gateway: every record."""
    count = 0
    expected = PARTITIONS * BATCHES_PER_PARTITION * RECORDS_PER_BATCH
    with Consumer(bootstrap_servers=address) as consumer:
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + 60
        while count < expected and time.monotonic() < deadline:
            count += sum(len(r) for r in consumer.poll(timeout_ms=200).values())
    return count


async def _hold_idle_streams(address: str, process: psutil.Process) -> int:
    """Open the idle streams, watch the gateway's RSS for a while; the peak."""
    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(CONNECTIONS)
    ]
    request = log_pb2.FetchRequest(
        positions=[
            log_pb2.FetchPosition(topic=TOPIC, partition=p, fetch_offset=0)
            for p in range(PARTITIONS)
        ],
        credit_bytes=CREDIT,
        max_wait_ms=100,
    )
    calls = []
    try:
        for i in range(IDLE_STREAMS):
            call = log_pb2_grpc.LogStub(channels[i % CONNECTIONS]).Fetch(timeout=180)
            await call.write(request)  # and never read
            calls.append(call)
        peak = 0
        for _ in range(60):
            peak = max(peak, process.memory_info().rss)
            await asyncio.sleep(0.1)
        return peak
    finally:
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close(None)


def test_idle_fetch_streams_cost_at_most_their_credit(gateway: GatewayProcess) -> None:
    process = psutil.Process(gateway.pid)
    expected = PARTITIONS * BATCHES_PER_PARTITION * RECORDS_PER_BATCH
    assert _read_backlog(gateway.address) == expected
    baseline = process.memory_info().rss
    peak = asyncio.run(_hold_idle_streams(gateway.address, process))
    # Still serving: a consumer reads the whole backlog meanwhile and after.
    assert _read_backlog(gateway.address) == expected
    # Per stream: its credit plus one batch per broker (a broker may pass
    # the credit by one batch); a few copies of each response (the message,
    # its serialized form, the transport's buffer) and allocator slack.
    # Unbounded, each stream would pull the whole 6 MiB backlog.
    held = IDLE_STREAMS * (CREDIT + PARTITIONS * BATCH_BYTES)
    bound = 3 * held + 100 * MIB
    print(
        f"\ngateway RSS {baseline // MIB} MiB before, peak {peak // MIB} MiB with "
        f"{IDLE_STREAMS} idle streams of {CREDIT // 1024} KiB credit (bound on growth "
        f"{bound // MIB} MiB; the backlog they could pull: "
        f"{IDLE_STREAMS * PARTITIONS * BATCHES_PER_PARTITION * BATCH_BYTES // MIB} MiB)"
    )
    assert peak - baseline < bound
