"""The gateway's streams over --max-streams-per-connection end, every time,
with RESOURCE_EXHAUSTED naming the limit, and its CommitOffsetsStream (not
relayed) with UNIMPLEMENTED, which the SDK falls back on, also when the
client writes its first request at once: the gateway refused before reading,
and gRPC then ended such a call INTERNAL a few times in a hundred (see
tidelog_server.stream_refusal). The SDK's producer and consumer raise a
stream refused for the gateway's limit, and so does a consumer's join whose
heartbeat stream the gateway refuses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from tidelog import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tidelog.errors import InvalidRequestError
from tidelog.v1 import (
    group_pb2,
    group_pb2_grpc,
    log_pb2,
    log_pb2_grpc,
    records_pb2,
    records_pb2_grpc,
)

from tests.support.cluster import ClusterProcesses
from tests.support.gateway import GatewayProcess, gateway_of
from tests.support.stream_refusals import (
    holding_a_fetch_stream,
    holding_a_fetch_stream_on,
    refusals,
)

pytestmark = pytest.mark.timeout(180)

#: On the old code 19 to 180 of 400 tries ended INTERNAL, per RPC (12 of 12
#: runs failed): a test passing there is a chance of ~1e-4.
TRIES = 200
FETCH = log_pb2.FetchRequest(
    positions=[log_pb2.FetchPosition(topic="absent", partition=0, fetch_offset=0)],
    credit_bytes=1024 * 1024,
)
#: The first request of each stream tried; refused before it is looked at.
FIRST: dict[str, tuple[str, Any]] = {
    "Log.Fetch": ("Log", FETCH),
    "Log.Produce": ("Log", log_pb2.ProduceRequest()),
    "Group.Heartbeat": ("Group", group_pb2.GroupHeartbeatRequest(group_id="g")),
    "Records.Produce": ("Records", records_pb2.RecordsProduceRequest()),
    "Records.Consume": ("Records", records_pb2.ConsumeRequest()),
}
STUBS = {
    "Log": log_pb2_grpc.LogStub,
    "Group": group_pb2_grpc.GroupStub,
    "Records": records_pb2_grpc.RecordsStub,
}


@pytest.fixture(scope="module")
def gateway(
    cluster: ClusterProcesses, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    log_dir = tmp_path_factory.mktemp("gateway-refusals")
    with gateway_of(cluster, log_dir, "--max-streams-per-connection", "1") as process:
        yield process


@pytest.mark.parametrize("rpc", list(FIRST))
def test_a_stream_over_the_per_connection_limit_always_gets_the_limit(
    gateway: GatewayProcess, rpc: str
) -> None:
    service, first = FIRST[rpc]

    async def run() -> None:
        async with (
            grpc.aio.insecure_channel(gateway.address) as channel,
            holding_a_fetch_stream_on(channel),  # the connection's one stream
        ):
            stub = STUBS[service](channel)
            ends = await refusals(getattr(stub, rpc.split(".")[1]), first, TRIES)
            assert all(
                code == "RESOURCE_EXHAUSTED" and "--max-streams-per-connection=1" in details
                for code, details in ends
            ), ends

    asyncio.run(run())


def test_commit_offsets_stream_always_gets_unimplemented(gateway: GatewayProcess) -> None:
    async def run() -> None:
        async with grpc.aio.insecure_channel(gateway.address) as channel:
            stub = group_pb2_grpc.GroupStub(channel)
            first = group_pb2.CommitOffsetsStreamRequest(
                commits=[group_pb2.StreamedCommit(correlation_id=1)]
            )
            ends = await refusals(stub.CommitOffsetsStream, first, TRIES)
            assert all(
                code == "UNIMPLEMENTED" and "use CommitOffsets" in details for code, details in ends
            ), ends

    asyncio.run(run())


@pytest.fixture(scope="module")
def gateway_of_one_stream(
    cluster: ClusterProcesses, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    log_dir = tmp_path_factory.mktemp("gateway-one-stream")
    with gateway_of(cluster, log_dir, "--max-streams", "1") as process:
        yield process


# The refusal is typed (InvalidRequestError naming the limit, not retriable):
# on the old code it came without its ErrorCode, so the producer retried it
# until delivery_timeout_ms and the consumer reconnected for ever.


def test_a_producer_over_the_gateway_stream_limit_fails_with_the_limit(
    gateway_of_one_stream: GatewayProcess,
) -> None:
    address = gateway_of_one_stream.address
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic("limited-produce", 1)])
    with holding_a_fetch_stream(address), Producer(address) as producer:
        future = producer.send("limited-produce", b"v")
        with pytest.raises(InvalidRequestError, match=r"--max-streams=1"):
            # Generous: the old code's retries ended at delivery_timeout_ms
            # (120 s) with a TidelogTimeoutError, which fails this too.
            future.get(timeout=60)


def test_a_consumer_over_the_gateway_stream_limit_raises_the_limit_from_poll(
    gateway_of_one_stream: GatewayProcess,
) -> None:
    address = gateway_of_one_stream.address
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic("limited-consume", 1)])
    tp = TopicPartition("limited-consume", 0)
    with holding_a_fetch_stream(address), Consumer(bootstrap_servers=address) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        deadline = time.monotonic() + 30
        with pytest.raises(InvalidRequestError, match=r"--max-streams=1"):
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=200)


def test_a_group_member_over_the_gateway_stream_limit_is_told_the_limit(
    gateway_of_one_stream: GatewayProcess,
) -> None:
    """Its join raises the limit. The old code logged the refused heartbeat
    stream and reopened it once a second for ever: the join ended with
    TidelogTimeoutError at request_timeout_ms, which fails this too."""
    address = gateway_of_one_stream.address
    with (
        holding_a_fetch_stream(address),
        Consumer(
            bootstrap_servers=address, group_id="limited", request_timeout_ms=30_000
        ) as consumer,
        pytest.raises(InvalidRequestError, match=r"--max-streams=1"),
    ):
        consumer.subscribe(["limited-group"])
