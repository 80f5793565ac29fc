"""A coordinator's refusal wakes the consumer that waits in a long
poll()/getmany(), which raises it, as an assignment change wakes it: against
an in-process stand-in coordinator (Cluster.DescribeCluster, Log.Metadata and
the Group heartbeat stream over real gRPC on loopback) that admits the
member, then refuses it when the test says, in one of three ways: an answer
that refuses it for good (a rejoin into a full group), the heartbeat stream
ended by a stream limit (a gateway's --max-streams, a coordinator's
--max-streams-per-principal: RESOURCE_EXHAUSTED typed INVALID_REQUEST), or
the stream ended by access denied (which the membership keeps retrying).
Refused for good, the next poll joins again.

On the old code nothing told the waiting consumer: GroupClient's notify was
never called for the refusal, and a poll only saw it at its loop's next look
(up to a second later). A stream ended by a stream limit was only logged and
reopened once a second for ever, the poll returning nothing; access denied
was raised by the next poll but woke no waiting one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from functools import partial

import grpc
import grpc.aio
import pytest
from tidelog import AsyncConsumer
from tidelog._connection import Cluster
from tidelog._group_client import GroupClient
from tidelog.config import ConsumerConfig
from tidelog.errors import (
    ERROR_CODE_METADATA_KEY,
    AuthorizationFailedError,
    InvalidRequestError,
    TidelogError,
)
from tidelog.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    common_pb2,
    group_pb2,
    group_pb2_grpc,
    log_pb2,
    log_pb2_grpc,
)

from tests.support.in_process_server import serving

pytestmark = pytest.mark.timeout(120)

#: How the stand-in refuses: its message, and the error the consumer raises.
IN_BAND = "in-band"
STREAM_LIMIT = "stream-limit"
ACCESS_DENIED = "access-denied"
REFUSALS: dict[str, tuple[str, type[TidelogError]]] = {
    IN_BAND: ("group 'g' has 1 members: at most 1 (--group-max-members)", InvalidRequestError),
    STREAM_LIMIT: ("1 streams open: at most 1 (--max-streams)", InvalidRequestError),
    ACCESS_DENIED: ("User:ANONYMOUS may not Read group 'g'", AuthorizationFailedError),
}
#: Generous: the member is told at once; this only bounds a broken test.
DEADLINE_S = 30


class RefusingLaterCoordinator(
    group_pb2_grpc.GroupServicer, cluster_pb2_grpc.ClusterServicer, log_pb2_grpc.LogServicer
):
    """Names itself as the one coordinator; admits joins (no partitions)
    until `refuse` is set, then refuses the admitted member and every join
    at once, as `how` says (one of REFUSALS), until `refuse` is cleared.
    Its Metadata knows no topic (the member owns no partition)."""

    def __init__(self, how: str = IN_BAND) -> None:
        self.how = how
        self.refuse = asyncio.Event()
        self.joined = asyncio.Event()
        #: Joins admitted.
        self.joins = 0

    async def Metadata(
        self, request: log_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.MetadataResponse:
        return log_pb2.MetadataResponse()

    async def DescribeCluster(
        self, request: cluster_pb2.DescribeClusterRequest, context: grpc.aio.ServicerContext
    ) -> cluster_pb2.DescribeClusterResponse:
        # No host: the client reaches it where this answer came from.
        return cluster_pb2.DescribeClusterResponse(
            cluster_id="c", coordinators=[cluster_pb2.CoordinatorInfo(id="c0")]
        )

    async def Heartbeat(
        self,
        request_iterator: AsyncIterator[group_pb2.GroupHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[group_pb2.GroupHeartbeatResponse]:
        await anext(aiter(request_iterator))
        if not self.refuse.is_set():
            self.joins += 1
            self.joined.set()
            yield group_pb2.GroupHeartbeatResponse(
                member_id=f"m{self.joins}",
                member_epoch=1,
                member_token="t",
                heartbeat_interval_ms=10_000,
                assignment=group_pb2.Assignment(),
            )
            await self.refuse.wait()
        message = REFUSALS[self.how][0]
        if self.how == IN_BAND:
            yield group_pb2.GroupHeartbeatResponse(
                error=common_pb2.Error(code=common_pb2.INVALID_REQUEST, message=message)
            )
        elif self.how == STREAM_LIMIT:
            # As tidelog_server.stream_refusal.refuse_stream_with ends it.
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                message,
                trailing_metadata=((ERROR_CODE_METADATA_KEY, "INVALID_REQUEST"),),
            )
        else:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, message)

    async def LeaveGroup(
        self, request: group_pb2.LeaveGroupRequest, context: grpc.aio.ServicerContext
    ) -> group_pb2.LeaveGroupResponse:
        return group_pb2.LeaveGroupResponse()


def _serving(coordinator: RefusingLaterCoordinator) -> contextlib.AbstractAsyncContextManager[str]:
    """`coordinator` as the group coordinator, cluster and log service."""
    return serving(
        partial(group_pb2_grpc.add_GroupServicer_to_server, coordinator),
        partial(cluster_pb2_grpc.add_ClusterServicer_to_server, coordinator),
        partial(log_pb2_grpc.add_LogServicer_to_server, coordinator),
    )


@pytest.mark.parametrize("how", list(REFUSALS))
def test_a_refusal_wakes_the_consumer_that_waits(how: str) -> None:
    """GroupClient calls its consumer's notify (what wakes a waiting poll)
    when the coordinator refuses the member."""
    message, error_type = REFUSALS[how]

    async def scenario() -> None:
        coordinator = RefusingLaterCoordinator(how)
        async with _serving(coordinator) as address:
            config = ConsumerConfig(bootstrap_servers=address, group_id="g")
            cluster = Cluster(config)
            woken = asyncio.Event()
            group = GroupClient(cluster, config, woken.set)
            try:
                await group.join(["t"], "")
                woken.clear()  # whatever the join itself announced
                coordinator.refuse.set()
                await asyncio.wait_for(woken.wait(), DEADLINE_S)
                assert group.membership is not None
                error = group.membership.error
                assert isinstance(error, error_type) and str(error) == message, error
                # Refused for good, but for access denied (an operator may grant it).
                assert group.refusal() is (None if how == ACCESS_DENIED else error)
            finally:
                await group.close()
                await cluster.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("how", list(REFUSALS))
def test_a_long_getmany_raises_a_refusal_that_comes_while_it_waits(how: str) -> None:
    """getmany(timeout_ms=60000) raises the refusal rather than returning
    nothing at its timeout; once the coordinator admits the member again,
    it is a member again (a later getmany joins)."""
    message, error_type = REFUSALS[how]

    async def scenario() -> None:
        coordinator = RefusingLaterCoordinator(how)
        async with _serving(coordinator) as address:
            consumer = AsyncConsumer("t", bootstrap_servers=address, group_id="g")
            await consumer.start()
            try:
                await asyncio.wait_for(coordinator.joined.wait(), DEADLINE_S)
                waiting = asyncio.ensure_future(consumer.getmany(timeout_ms=60_000))
                await asyncio.sleep(0.2)  # the getmany is waiting (it ended no sooner)
                assert not waiting.done()
                coordinator.refuse.set()
                with pytest.raises(error_type) as refused:
                    await asyncio.wait_for(waiting, DEADLINE_S)
                assert str(refused.value) == message
                coordinator.refuse.clear()
                async with asyncio.timeout(DEADLINE_S):
                    while coordinator.joins < 2:
                        await consumer.getmany(timeout_ms=100)
            finally:
                await consumer.stop()

    asyncio.run(scenario())
