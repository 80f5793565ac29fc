"""`OffsetStoreClient`: commit and fetch a group's offsets on the coordinator.

A member's commits go over one CommitOffsetsStream per coordinator channel
(`_commit_stream.CommitStream`: many commits in flight on one stream cost
the coordinator far less than as many unary calls); where a server answers
UNIMPLEMENTED (an older coordinator, the gateway), over the unary
CommitOffsets instead, for as long as the client talks to that address.
Either way a commit is answered once it is in etcd, with the same typed
errors, and retried on the next coordinator replica when the one it was
sent to stops answering.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import grpc

from tidelog.errors import CoordinatorNotAvailableError, error_from_code, error_from_rpc
from tidelog.group._channels import CoordinatorChannels, Rediscover, is_unavailable, unanswered
from tidelog.group._commit_stream import CommitStream, StreamEnded
from tidelog.security import PLAINTEXT, ChannelSecurity
from tidelog.types import TopicPartition
from tidelog.v1 import common_pb2, group_pb2, group_pb2_grpc


class OffsetAndMetadata(NamedTuple):
    """A committed offset: the next record to consume, and free text."""

    offset: int
    metadata: str = ""


def _offset_commits(
    offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
) -> list[group_pb2.OffsetCommit]:
    items = []
    for tp, value in offsets.items():
        om = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(int(value))
        items.append(
            group_pb2.OffsetCommit(
                topic=tp.topic, partition=tp.partition, offset=om.offset, metadata=om.metadata
            )
        )
    return items


#: Each coordinator address is tried this many times before a call gives up.
ATTEMPTS_PER_ADDRESS = 2
#: The pause after a failed attempt: doubling from the first, capped.
RETRY_PAUSE_FIRST_S = 0.05
RETRY_PAUSE_MAX_S = 1.0


class OffsetStoreClient:
    """Offset calls with failover across coordinator replicas (a member's
    commits over the commit stream, see the module doc). One event loop."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: int = 10_000,
        rediscover: Rediscover | None = None,
        security: ChannelSecurity = PLAINTEXT,
        commit_stream: bool = True,
    ) -> None:
        """`commit_stream` False: commits over the unary CommitOffsets only
        (benchmarks compare the two)."""
        self._channels = CoordinatorChannels(bootstrap, rediscover, security)
        self._commit_stream = commit_stream
        self.request_timeout_ms = request_timeout_ms
        self._stream: CommitStream | None = None
        #: Addresses that answered UNIMPLEMENTED to the commit stream.
        self._unary_only: set[str] = set()
        #: Counts fail-overs. Calls in flight on one coordinator all fail
        #: together when it dies: only the first of them (the one that saw
        #: the current generation) moves on, the others retry where it went.
        #: Without this they moved on one after another, back to the dead
        #: replica too, and ran out of attempts.
        self._generation = 0
        #: Held while failing over: no stream or call starts on a channel
        #: that is being replaced.
        self._failing_over = asyncio.Lock()

    async def _fail_over(self, seen_generation: int) -> None:
        """Move to the next coordinator (the stream goes with the channel),
        unless another call already did since `seen_generation`."""
        async with self._failing_over:
            if self._generation != seen_generation:
                return
            await self._close_stream()
            await self._channels.rotate()
            self._generation += 1

    async def _current(self) -> tuple[int, grpc.aio.Channel]:
        """The generation and channel to use now (after any fail-over in
        progress)."""
        async with self._failing_over:
            return self._generation, self._channels.channel()

    async def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()

    def _attempts(self) -> range:
        """The attempts of one call: ATTEMPTS_PER_ADDRESS per coordinator."""
        return range(len(self._channels.addresses) * ATTEMPTS_PER_ADDRESS)

    @staticmethod
    async def _pause(attempt: int) -> None:
        """The pause after failed attempt number `attempt` (doubling, capped)."""
        await asyncio.sleep(min(RETRY_PAUSE_MAX_S, RETRY_PAUSE_FIRST_S * 2**attempt))

    async def _call(self, method: str, request: object) -> object:
        last: BaseException | None = None
        for attempt in self._attempts():
            generation, channel = await self._current()
            stub = group_pb2_grpc.GroupStub(channel)
            try:
                return await getattr(stub, method)(request, timeout=self.request_timeout_ms / 1000)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # this call's task is being cancelled
                # The call went with its channel, closed by another call's
                # fail-over (grpc.aio raises CancelledError for a call its
                # channel cancelled): retry where that fail-over goes. Seen in
                # CI: commits in flight when a coordinator died raised
                # CancelledError to the application.
                last = ConnectionError(f"{method} was cut off by a fail-over")
                continue
            except grpc.aio.AioRpcError as exc:
                if not is_unavailable(exc):
                    raise error_from_rpc(exc) from exc
                last = unanswered(exc, self._channels.address)
                await self._fail_over(generation)
                await self._pause(attempt)
        raise CoordinatorNotAvailableError(
            f"no coordinator answered ({', '.join(self._channels.addresses)}): {last}"
        )

    async def commit(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
        *,
        member_id: str,
        member_epoch: int,
        member_token: str,
    ) -> None:
        """Commit atomically as a member (its id, the epoch it acknowledged and
        the token its join answered); raises the typed error
        (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, ...)."""
        request = group_pb2.CommitOffsetsRequest(
            group_id=group_id,
            member_id=member_id,
            member_epoch=member_epoch,
            member_token=member_token,
            offsets=_offset_commits(offsets),
        )
        error = await self._commit_streamed(request)
        if error is not None and error.code != common_pb2.NONE:
            raise error_from_code(error.code, error.message)

    async def _commit_streamed(
        self, request: group_pb2.CommitOffsetsRequest
    ) -> common_pb2.Error | None:
        """The commit's answer (its error, if any): over the stream, or over
        the unary call where the stream is not served; failing over as _call."""
        last: BaseException | None = None
        for attempt in self._attempts():
            if not self._commit_stream or self._channels.address in self._unary_only:
                return await self._commit_unary(request)
            generation, channel = await self._current()
            stream = self._stream
            if stream is None or not stream.open:
                stream = self._stream = CommitStream(channel)
            try:
                answer = await stream.commit(request, self.request_timeout_ms / 1000)
                return answer.error if answer.HasField("error") else None
            except StreamEnded as exc:
                refused = exc.rpc_error
                if refused is not None and refused.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._unary_only.add(self._channels.address)
                    continue
                if refused is not None and not is_unavailable(refused):
                    # The server's answer (refused by the authorizer, or
                    # a limit): typed, as from the unary call.
                    raise error_from_rpc(refused) from None
                if exc.write_failed:
                    # Whether the connection broke or the server refused
                    # the stream before reading (a lost UNIMPLEMENTED), the
                    # unary call commits all the same, failing over itself.
                    return await self._commit_unary(request)
                last = exc
                if generation != self._generation:
                    # Closed under us by another commit's fail-over: retry
                    # on the stream that replaced it.
                    continue
            except TimeoutError:
                last = TimeoutError(
                    f"no answer within request_timeout_ms={self.request_timeout_ms}"
                )
            await self._fail_over(generation)
            await self._pause(attempt)
        raise CoordinatorNotAvailableError(
            f"no coordinator answered ({', '.join(self._channels.addresses)}): {last}"
        )

    async def _commit_unary(
        self, request: group_pb2.CommitOffsetsRequest
    ) -> common_pb2.Error | None:
        response = await self._call("CommitOffsets", request)
        assert isinstance(response, group_pb2.CommitOffsetsResponse)
        return response.error if response.HasField("error") else None

    async def alter(
        self, group_id: str, offsets: Mapping[TopicPartition, int | OffsetAndMetadata]
    ) -> None:
        """Set offsets as an administrator: refused (NonEmptyGroupError) while
        the group has live members."""
        response = await self._call(
            "AlterOffsets",
            group_pb2.AlterOffsetsRequest(group_id=group_id, offsets=_offset_commits(offsets)),
        )
        assert isinstance(response, group_pb2.AlterOffsetsResponse)
        if response.HasField("error") and response.error.code != common_pb2.NONE:
            raise error_from_code(response.error.code, response.error.message)

    async def fetch(
        self, group_id: str, partitions: Iterable[TopicPartition] = ()
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Committed offsets; partitions without one are left out."""
        response = await self._call(
            "FetchOffsets",
            group_pb2.FetchOffsetsRequest(
                group_id=group_id,
                partitions=[
                    common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)
                    for tp in partitions
                ],
            ),
        )
        assert isinstance(response, group_pb2.FetchOffsetsResponse)
        if response.HasField("error") and response.error.code != common_pb2.NONE:
            raise error_from_code(response.error.code, response.error.message)
        return {
            TopicPartition(o.topic, o.partition): OffsetAndMetadata(o.offset, o.metadata)
            for o in response.offsets
            if o.offset >= 0
        }

    async def close(self) -> None:
        await self._close_stream()
        await self._channels.close()
