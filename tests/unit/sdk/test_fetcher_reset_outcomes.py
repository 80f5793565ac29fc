"""Each partition of a reset round keeps its own outcome: against an
in-process stand-in broker (Log.Metadata, Log.ListOffsets and a Fetch stream
that sends nothing, over real gRPC on loopback) whose first ListOffsets is
cancelled by the server, as gRPC cancels a call its server has no room to
queue, and whose next answers a retriable error for one partition (once), a
verdict for another, and offsets for the rest.

The old fetcher raised the cancelled call from position() as
ClosedError('CANCELLED') (the client was not closed) and sent one
ListOffsets per partition."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial

import grpc
import grpc.aio
import pytest
from tidelog import AsyncConsumer, TopicPartition
from tidelog.errors import TopicAuthorizationFailedError
from tidelog.v1 import common_pb2, log_pb2, log_pb2_grpc

from tests.support.in_process_server import drop_call, led_by_one_broker, serving

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
PARTITIONS = 6
#: The partition answered NOT_LEADER_OR_FOLLOWER once (retriable).
MOVING = 1
#: The partition answered TOPIC_AUTHORIZATION_FAILED (a verdict).
DENIED = 2
#: Generous: the stand-in answers at once; this only bounds a broken test.
DEADLINE_S = 30


def offset_of(partition: int) -> int:
    return 100 + partition


class CancellingFirstBroker(log_pb2_grpc.LogServicer):
    """One broker leading every partition of TOPIC (see module doc)."""

    def __init__(self) -> None:
        self.port = 0
        #: The partitions of each ListOffsets request received.
        self.requests: list[list[int]] = []
        self._moving_answered = False

    async def Metadata(
        self, request: log_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.MetadataResponse:
        return led_by_one_broker(self.port, {TOPIC: PARTITIONS})

    async def ListOffsets(
        self, request: log_pb2.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.ListOffsetsResponse:
        self.requests.append([entry.partition for entry in request.partitions])
        if len(self.requests) == 1:
            await drop_call(context)
        results = []
        for entry in request.partitions:
            result = log_pb2.ListOffsetsResult(topic=entry.topic, partition=entry.partition)
            if entry.partition == MOVING and not self._moving_answered:
                self._moving_answered = True
                result.error.code = common_pb2.NOT_LEADER_OR_FOLLOWER
                result.error.message = "not the leader"
            elif entry.partition == DENIED:
                result.error.code = common_pb2.TOPIC_AUTHORIZATION_FAILED
                result.error.message = "User:ANONYMOUS may not Describe topic 't'"
            else:
                result.offset = offset_of(entry.partition)
            results.append(result)
        return log_pb2.ListOffsetsResponse(partitions=results)

    async def Fetch(
        self,
        request_iterator: AsyncIterator[log_pb2.FetchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[log_pb2.FetchResponse]:
        async for _ in request_iterator:
            pass  # no data: positions come from the resets alone
        return
        yield  # an async generator


def test_each_partition_keeps_its_outcome_and_a_cancelled_call_is_retried() -> None:
    async def scenario() -> None:
        broker = CancellingFirstBroker()
        async with serving(partial(log_pb2_grpc.add_LogServicer_to_server, broker)) as address:
            broker.port = int(address.rsplit(":", 1)[1])
            consumer = AsyncConsumer(
                bootstrap_servers=address, auto_offset_reset="latest", retry_backoff_ms=20
            )
            await consumer.start()
            try:
                partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
                consumer.assign(partitions)
                found: dict[int, int] = {}
                async with asyncio.timeout(DEADLINE_S):
                    for tp in partitions:
                        # A partition's error is raised by position() of that
                        # partition only.
                        if tp.partition == DENIED:
                            with pytest.raises(TopicAuthorizationFailedError) as refused:
                                await consumer.position(tp)
                            assert (refused.value.topic, refused.value.partition) == tp
                        else:
                            found[tp.partition] = await consumer.position(tp)
                assert found == {p: offset_of(p) for p in range(PARTITIONS) if p != DENIED}
            finally:
                await consumer.stop()
        every = list(range(PARTITIONS))
        # One request per round: the cancelled one, every partition again,
        # then the one answered NOT_LEADER_OR_FOLLOWER.
        assert broker.requests == [every, every, [MOVING]]

    asyncio.run(scenario())
