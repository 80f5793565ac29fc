"""Calls a server cancels are retriable errors naming it, not ClosedError:
against in-process stand-ins over real gRPC on loopback whose handlers end
the call with CANCELLED and details "CANCELLED", exactly what a client gets
when gRPC drops a call its grpc.aio server has no room to queue (past
grpc.server.max_pending_requests; tests/integration/test_sdk_server_cancelled.py
makes a real broker drop calls).

The SDK decoded every CANCELLED as ClosedError ("the client is closed"):
an admin call raised it, and a Metadata refresh raised it at once instead
of asking again."""

from __future__ import annotations

import asyncio
from functools import partial

import grpc
import grpc.aio
import pytest
from tidelog import AsyncAdminClient, AsyncProducer, NewTopic
from tidelog._connection import Cluster
from tidelog.config import AdminConfig
from tidelog.errors import BrokerNotAvailableError, ClosedError
from tidelog.v1 import admin_pb2, admin_pb2_grpc, log_pb2, log_pb2_grpc

from tests.support.in_process_server import drop_call, led_by_one_broker, serving

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
#: Generous: the stand-ins answer at once; this only bounds a broken test.
DEADLINE_S = 30


class CancellingAdmin(admin_pb2_grpc.AdminServicer):
    """A broker that cancels every CreateTopics (a write), and the first
    `reads_to_cancel` DescribeConfigs (a read)."""

    def __init__(self, reads_to_cancel: int = 0) -> None:
        self.calls = 0
        self.reads = 0
        self.reads_to_cancel = reads_to_cancel

    async def CreateTopics(
        self, request: admin_pb2.CreateTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CreateTopicsResponse:
        self.calls += 1
        await drop_call(context)
        raise AssertionError("abort returned")

    async def DescribeConfigs(
        self, request: admin_pb2.DescribeConfigsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeConfigsResponse:
        self.reads += 1
        if self.reads <= self.reads_to_cancel:
            await drop_call(context)
        return admin_pb2.DescribeConfigsResponse(topics=[admin_pb2.TopicConfigs(name=TOPIC)])


class MetadataCancelling(log_pb2_grpc.LogServicer):
    """A broker that cancels the next `to_cancel` Metadata calls and answers
    the others: TOPIC, 3 partitions it leads, once asked for it."""

    def __init__(self) -> None:
        self.port = 0
        self.to_cancel = 0
        self.cancelled = 0

    async def Metadata(
        self, request: log_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.MetadataResponse:
        if self.to_cancel:
            self.to_cancel -= 1
            self.cancelled += 1
            await drop_call(context)
        return led_by_one_broker(self.port, {TOPIC: 3} if TOPIC in request.topics else {})


def test_an_admin_write_the_broker_cancelled_raises_a_retriable_error_naming_it() -> None:
    async def scenario() -> None:
        broker = CancellingAdmin()
        async with serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, broker)) as address:
            admin = AsyncAdminClient(address)
            try:
                async with asyncio.timeout(DEADLINE_S):
                    with pytest.raises(BrokerNotAvailableError) as raised:
                        await admin.create_topics([NewTopic(TOPIC, 1, 1)])
                assert raised.value.retriable
                assert not raised.value.not_carried_out
                assert raised.value.message == (
                    f"broker {address} dropped the call (CANCELLED: overloaded or stopping); retry"
                )
                # Surfaced, not sent again: the call may have been carried out.
                assert broker.calls == 1
            finally:
                await admin.close()
            # Our own client closed: ClosedError, and nothing is sent.
            with pytest.raises(ClosedError):
                await admin.create_topics([NewTopic(TOPIC, 1, 1)])
            assert broker.calls == 1

    asyncio.run(scenario())


def test_an_admin_read_the_broker_cancelled_is_sent_again() -> None:
    async def scenario() -> None:
        broker = CancellingAdmin(reads_to_cancel=2)
        async with serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, broker)) as address:
            admin = AsyncAdminClient(address, retry_backoff_ms=10)
            try:
                async with asyncio.timeout(DEADLINE_S):
                    assert TOPIC in await admin.describe_configs([TOPIC])
            finally:
                await admin.close()
        assert broker.reads == 3

    asyncio.run(scenario())


def test_metadata_the_broker_cancelled_is_asked_again() -> None:
    async def scenario() -> None:
        broker = MetadataCancelling()
        async with serving(partial(log_pb2_grpc.add_LogServicer_to_server, broker)) as address:
            broker.port = int(address.rsplit(":", 1)[1])
            producer = AsyncProducer(address, retry_backoff_ms=20)
            await producer.start()
            try:
                broker.to_cancel = 2
                async with asyncio.timeout(DEADLINE_S):
                    assert await producer.partitions_for(TOPIC) == {0, 1, 2}
            finally:
                await producer.stop()
        assert (broker.to_cancel, broker.cancelled) == (0, 2)

    asyncio.run(scenario())


#: Metadata calls the stand-in cancels before it answers: the client backs
#: off retry_backoff_ms between two, so they last at least
#: (CANCELLED_CALLS - 1) * BACKOFF_MS, far past SETUP_TIMEOUT_MS.
CANCELLED_CALLS = 30
BACKOFF_MS = 20
SETUP_TIMEOUT_MS = 100


def test_metadata_servers_cancelling_are_waited_for_the_whole_timeout() -> None:
    """A server that cancels calls was reached: socket_connection_setup_timeout_ms
    (the bound for a cluster that cannot be reached at all) does not apply.
    The old Cluster.topic() gave up after it, as if the server did not exist."""

    async def scenario() -> None:
        broker = MetadataCancelling()
        async with serving(partial(log_pb2_grpc.add_LogServicer_to_server, broker)) as address:
            broker.port = int(address.rsplit(":", 1)[1])
            broker.to_cancel = CANCELLED_CALLS
            cluster = Cluster(
                AdminConfig(
                    bootstrap_servers=address,
                    retry_backoff_ms=BACKOFF_MS,
                    socket_connection_setup_timeout_ms=SETUP_TIMEOUT_MS,
                )
            )
            try:
                async with asyncio.timeout(DEADLINE_S):
                    meta = await cluster.topic(TOPIC, timeout_s=DEADLINE_S)
                assert meta.partition_count == 3
            finally:
                await cluster.close()
        assert broker.cancelled == CANCELLED_CALLS

    asyncio.run(scenario())
