"""A broker's Fetch stream over fetch.max.streams.per.connection ends, every
time, with RESOURCE_EXHAUSTED naming the limit, also when the client writes
its first request at once: the broker refused before reading, and gRPC then
ended such a call INTERNAL a few times in a hundred (see
tidelog_server.stream_refusal). The SDK's consumer raises that refusal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tidelog import AdminClient, Consumer, NewTopic, TopicPartition
from tidelog.errors import InvalidRequestError
from tidelog.v1 import log_pb2, log_pb2_grpc

from tests.support.processes import BrokerProcess, start_broker
from tests.support.stream_refusals import (
    holding_a_fetch_stream,
    holding_a_fetch_stream_on,
    refusals,
)

pytestmark = pytest.mark.timeout(120)

#: On the old code 25 to 113 of these ended INTERNAL (4 of 4 runs failed):
#: a test passing there is a chance of ~1e-5.
TRIES = 400
FETCH = log_pb2.FetchRequest(
    positions=[log_pb2.FetchPosition(topic="absent", partition=0, fetch_offset=0)],
    credit_bytes=1024 * 1024,
    max_wait_ms=100,
)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = start_broker(
        tmp_path / "data", extra_args=("--set", "fetch.max.streams.per.connection=1")
    )
    try:
        yield process
    finally:
        process.stop()


def test_a_fetch_stream_over_the_per_connection_limit_always_gets_the_limit(
    broker: BrokerProcess,
) -> None:
    async def run() -> None:
        async with (
            grpc.aio.insecure_channel(broker.address) as channel,
            holding_a_fetch_stream_on(channel),  # the connection's one stream
        ):
            ends = await refusals(log_pb2_grpc.LogStub(channel).Fetch, FETCH, TRIES)
            assert all(
                code == "RESOURCE_EXHAUSTED" and "fetch.max.streams.per.connection=1" in details
                for code, details in ends
            ), ends

    asyncio.run(run())


def test_a_consumer_over_the_broker_stream_limit_raises_the_limit_from_poll(
    tmp_path: Path,
) -> None:
    """The refusal is typed (InvalidRequestError naming the limit, not
    retriable), so the consumer raises it instead of reconnecting for ever:
    on the old code it came without its ErrorCode and poll() kept returning
    nothing."""
    broker = start_broker(
        tmp_path / "data", extra_args=("--auto-create-topics", "--set", "fetch.max.streams=1")
    )
    try:
        with AdminClient(broker.address) as admin:
            admin.create_topics([NewTopic("limited", 1)])
        tp = TopicPartition("limited", 0)
        with (
            holding_a_fetch_stream(broker.address),
            Consumer(bootstrap_servers=broker.address) as consumer,
        ):
            consumer.assign([tp])
            consumer.seek(tp, 0)
            deadline = time.monotonic() + 30
            with pytest.raises(InvalidRequestError, match=r"fetch\.max\.streams=1") as raised:
                while time.monotonic() < deadline:
                    consumer.poll(timeout_ms=200)
            assert (raised.value.topic, raised.value.partition) == ("limited", 0)
    finally:
        broker.stop()
