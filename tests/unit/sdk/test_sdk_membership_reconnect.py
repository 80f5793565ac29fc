"""A member's heartbeat stream that breaks leaves nothing behind: the ended
stream's request generator finishes instead of staying suspended on the
outbox (where it would take the next stream's requests, acks included, and
be destroyed pending when the loop closes). Against an in-process Group
server whose first stream ends with UNAVAILABLE. And a coordinator that
refuses every join with a retriable error (an answer, or a stream's end) is
asked again with a growing delay."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
from collections.abc import AsyncIterator, Callable
from functools import partial

import grpc
import grpc.aio
import pytest
from tidelog.group import GroupMembership
from tidelog.v1 import common_pb2, group_pb2, group_pb2_grpc

from tests.support.in_process_server import serving


class _Coordinator(group_pb2_grpc.GroupServicer):
    """A stand-in coordinator: counts its heartbeat streams, reads each one's
    join, then answers as `answer` says; leaving always works."""

    def __init__(self) -> None:
        self.streams = 0

    async def Heartbeat(
        self,
        request_iterator: AsyncIterator[group_pb2.GroupHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[group_pb2.GroupHeartbeatResponse]:
        self.streams += 1
        await anext(aiter(request_iterator))
        async for response in self.answer(request_iterator, context):
            yield response

    def answer(
        self,
        request_iterator: AsyncIterator[group_pb2.GroupHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[group_pb2.GroupHeartbeatResponse]:
        raise NotImplementedError

    async def LeaveGroup(
        self, request: group_pb2.LeaveGroupRequest, context: grpc.aio.ServicerContext
    ) -> group_pb2.LeaveGroupResponse:
        return group_pb2.LeaveGroupResponse()


def _serving(coordinator: _Coordinator) -> contextlib.AbstractAsyncContextManager[str]:
    """`coordinator` as the group coordinator."""
    return serving(partial(group_pb2_grpc.add_GroupServicer_to_server, coordinator))


class FlakyCoordinator(_Coordinator):
    """Answers a join, then ends the first stream with UNAVAILABLE; later
    streams stay open."""

    async def answer(
        self,
        request_iterator: AsyncIterator[group_pb2.GroupHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[group_pb2.GroupHeartbeatResponse]:
        first = self.streams == 1
        yield group_pb2.GroupHeartbeatResponse(
            member_id="m1", member_epoch=1, heartbeat_interval_ms=10_000, member_token="t"
        )
        if first:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "going away")
        async for _ in request_iterator:
            pass


def live_request_generators() -> int:
    gc.collect()
    return sum(
        1
        for obj in gc.get_objects()
        if inspect.isasyncgen(obj)
        and obj.ag_code.co_name == "_requests"
        and obj.ag_frame is not None
    )


def test_a_broken_heartbeat_stream_leaves_no_request_generator_behind() -> None:
    async def scenario() -> None:
        coordinator = FlakyCoordinator()
        async with _serving(coordinator) as address:
            membership = GroupMembership(
                # Heartbeats far apart: nothing but the fix wakes a stale generator.
                address,
                "g",
                topics=["t"],
                heartbeat_interval_ms=10_000,
            )
            try:
                await membership.start()
                async with asyncio.timeout(20):
                    while coordinator.streams < 2:
                        await asyncio.sleep(0.05)
                await asyncio.sleep(0.2)
                # The second stream's generator only: the first one finished.
                assert live_request_generators() == 1
                await membership.close()
                await asyncio.sleep(0.2)
                # And none once the member is closed (before the loop closes).
                assert live_request_generators() == 0
            finally:
                await membership.close()

    asyncio.run(scenario())


class RefusingCoordinator(_Coordinator):
    """Answers every join with a refusal, then ends the stream."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__()
        self.code, self.message = code, message

    async def answer(
        self,
        request_iterator: AsyncIterator[group_pb2.GroupHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[group_pb2.GroupHeartbeatResponse]:
        yield group_pb2.GroupHeartbeatResponse(
            error=common_pb2.Error(code=self.code, message=self.message)
        )


class StreamEndingCoordinator(_Coordinator):
    """Ends every heartbeat stream with a status (and no answer)."""

    def __init__(self, status: grpc.StatusCode, message: str) -> None:
        super().__init__()
        self.status, self.message = status, message

    async def answer(
        self,
        request_iterator: AsyncIterator[group_pb2.GroupHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[group_pb2.GroupHeartbeatResponse]:
        await context.abort(self.status, self.message)
        yield group_pb2.GroupHeartbeatResponse()  # pragma: no cover (a generator)


@pytest.mark.parametrize(
    "coordinator",
    [
        pytest.param(
            lambda: RefusingCoordinator(common_pb2.REBALANCE_IN_PROGRESS, "try again"),
            id="answered",
        ),
        # A stream ended with a retriable status: not a refusal for good.
        pytest.param(
            lambda: StreamEndingCoordinator(grpc.StatusCode.ABORTED, "try again"), id="ended"
        ),
    ],
)
def test_a_retriable_refusal_is_asked_again_with_backoff_not_twenty_times_a_second(
    coordinator: Callable[[], _Coordinator],
) -> None:
    async def scenario() -> None:
        refusing = coordinator()
        async with _serving(refusing) as address:
            membership = GroupMembership(address, "g", topics=["t"])
            try:
                await membership.start()
                await asyncio.sleep(3)
                # With the delay doubling from 50 ms to its 1 s cap: ~6 joins in 3 s. Reset
                # by the refusal itself, as before, it asked ~60 times (one per 50 ms).
                assert 2 <= refusing.streams <= 12, refusing.streams
                assert not membership.member_id
                assert membership.refused is None
            finally:
                await membership.close()

    asyncio.run(scenario())


def test_a_refusal_retrying_cannot_change_ends_the_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full group: asked once, kept in `refused` for the caller to raise
    (the consumers' next poll), not asked again once a second for ever. Its
    log line names the group once (the old code prefixed the coordinator's
    message, which names it already)."""

    async def scenario() -> None:
        coordinator = RefusingCoordinator(
            common_pb2.INVALID_REQUEST, "group 'g' has 2 members: at most 2"
        )
        async with _serving(coordinator) as address:
            membership = GroupMembership(address, "g", topics=["t"])
            try:
                await membership.start()
                await membership.wait_for(lambda m: m.refused is not None, 10)
                await asyncio.sleep(2)  # time for a few more joins, were it still asking
                assert coordinator.streams == 1
                assert "at most 2" in str(membership.refused)
                logged = [r.getMessage() for r in caplog.records if r.name == "tidelog.group"]
                assert logged == ["group 'g' has 2 members: at most 2"], logged
            finally:
                await membership.close()

    asyncio.run(scenario())
