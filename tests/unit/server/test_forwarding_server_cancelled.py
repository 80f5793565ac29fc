"""`CoordinatorForwarding` (how a broker forwards Admin calls and
InitProducerId to a coordinator) moves on from a replica that cancelled the
call on its side, as from one that is UNAVAILABLE: against in-process
stand-in replicas over real gRPC on loopback, whose handlers end the call
with CANCELLED and details "CANCELLED", what gRPC answers for a call its
grpc.aio server has no room to queue.

It raised that CANCELLED for the broker to pass back unchanged, which the
SDK decoded as ClosedError ("the client is closed"). A replica past the
call's deadline is named too, and not followed by another (it passed the
DEADLINE_EXCEEDED back unnamed)."""

from __future__ import annotations

import asyncio
from functools import partial

import grpc
import grpc.aio
import pytest
from tidelog.errors import CoordinatorNotAvailableError
from tidelog.v1 import admin_pb2, admin_pb2_grpc
from tidelog_server.forwarding import ChannelPool, CoordinatorForwarding

from tests.support.in_process_server import drop_call, serving

pytestmark = pytest.mark.timeout(60)

#: Generous: the stand-ins answer at once; this only bounds a broken test.
DEADLINE_S = 30


class Replica(admin_pb2_grpc.AdminServicer):
    """A coordinator replica that cancels DescribeConfigs (`cancels`) or
    answers it with one topic named after the replica."""

    def __init__(self, name: str, cancels: bool, hangs: bool = False) -> None:
        self.name = name
        self.cancels = cancels
        #: Never answers: the caller's deadline ends the call.
        self.hangs = hangs
        self.calls = 0

    async def DescribeConfigs(
        self, request: admin_pb2.DescribeConfigsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeConfigsResponse:
        self.calls += 1
        if self.cancels:
            await drop_call(context)
        if self.hangs:
            await asyncio.Event().wait()
        return admin_pb2.DescribeConfigsResponse(topics=[admin_pb2.TopicConfigs(name=self.name)])


async def forward(
    addresses: list[str], timeout_s: float = DEADLINE_S
) -> admin_pb2.DescribeConfigsResponse:
    pool = ChannelPool()
    forwarding = CoordinatorForwarding(pool, lambda: addresses)
    try:
        async with asyncio.timeout(DEADLINE_S):
            answer: admin_pb2.DescribeConfigsResponse = await forwarding.call(
                lambda channel: admin_pb2_grpc.AdminStub(channel).DescribeConfigs(
                    admin_pb2.DescribeConfigsRequest(), timeout=timeout_s
                ),
                "DescribeConfigs",
            )
            return answer
    finally:
        await pool.close()


def test_a_replica_that_cancelled_the_call_is_moved_on_from() -> None:
    async def scenario() -> None:
        first, second = Replica("first", cancels=True), Replica("second", cancels=False)
        async with (
            serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, first)) as a1,
            serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, second)) as a2,
        ):
            answer = await forward([a1, a2])
        assert [t.name for t in answer.topics] == ["second"]
        assert (first.calls, second.calls) == (1, 1)

    asyncio.run(scenario())


def test_every_replica_cancelling_is_coordinator_not_available_naming_it() -> None:
    async def scenario() -> None:
        replica = Replica("only", cancels=True)
        async with serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, replica)) as a1:
            with pytest.raises(CoordinatorNotAvailableError) as raised:
                await forward([a1])
        assert raised.value.retriable
        assert raised.value.message == (
            f"cannot forward DescribeConfigs to a coordinator: coordinator {a1} dropped the "
            "call (CANCELLED: overloaded or stopping); retry"
        )

    asyncio.run(scenario())


def test_a_replica_past_the_deadline_is_named_and_the_next_not_asked() -> None:
    """It may still carry the call out: asking another could do it twice."""

    async def scenario() -> None:
        first = Replica("first", cancels=False, hangs=True)
        second = Replica("second", cancels=False)
        async with (
            serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, first)) as a1,
            serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, second)) as a2,
        ):
            with pytest.raises(CoordinatorNotAvailableError) as raised:
                await forward([a1, a2], timeout_s=1.0)
        assert raised.value.message == (
            f"cannot forward DescribeConfigs to a coordinator: coordinator {a1} did not answer "
            "in time (DEADLINE_EXCEEDED); retry"
        )
        assert (first.calls, second.calls) == (1, 0)

    asyncio.run(scenario())
