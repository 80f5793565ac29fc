"""`GroupMembership`: the member side of the Group heartbeat protocol (asyncio).

Owns one member's session with the coordinator: it opens the Heartbeat
stream, joins, sends a heartbeat every `heartbeat_interval_ms` (as the
coordinator asks), and applies each assignment the coordinator pushes:

1. partitions owned but no longer assigned are revoked: the listener's
   `on_partitions_revoked(revoked)` runs (commit their offsets there), then
   they are dropped;
2. newly assigned partitions are added: `on_partitions_assigned(assigned)`;
3. the new owned set is acknowledged to the coordinator, which only then
   hands revoked partitions to their new owners (cooperative rebalancing).

When the coordinator replica goes away (UNAVAILABLE), it reconnects to the
next address and re-attaches with its member id and epoch, keeping its
partitions. When the coordinator says the session is gone
(UNKNOWN_MEMBER_ID), the partitions are lost (`on_partitions_lost`, or
`on_partitions_revoked` if the listener has none) and it joins again as a new
member. A refusal that retrying cannot change (a non-retriable error other
than access denied: a full group, an invalid request, a stream limit that
ended the heartbeat stream) ends the session instead: it is kept in
`refused`, the listener's optional `on_refused(error)` is called, and what
to do is the caller's (the consumers raise it from the poll that waits, or
the next one). Retriable errors are retried with a back-off, as is a
stream that ends INTERNAL or UNKNOWN without a typed error (gRPC's own
failures look so), and so is access denied (an operator may grant it);
access denied is kept in `error` and told to `on_refused(error)` too, for
the caller to raise.

Listener callbacks may be plain functions or coroutines; they run on the
membership's task, one at a time. Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

import grpc

from tidelog.errors import (
    AuthorizationFailedError,
    IllegalGenerationError,
    SaslAuthenticationError,
    TidelogError,
    UnknownServerError,
    error_from_code,
    error_from_rpc,
)
from tidelog.group._channels import CoordinatorChannels, Rediscover, is_unavailable
from tidelog.group.offsets import OffsetAndMetadata, OffsetStoreClient
from tidelog.security import PLAINTEXT, ChannelSecurity
from tidelog.types import TopicPartition
from tidelog.v1 import common_pb2, group_pb2, group_pb2_grpc

#: The assignor a member asks for when it names none (the coordinator runs it).
DEFAULT_ASSIGNOR = "cooperative-sticky"

log = logging.getLogger("tidelog.group")

RECONNECT_DELAY_MAX_S = 1.0


class RebalanceListener(Protocol):
    """What a member is told when its partitions change."""

    def on_partitions_revoked(self, revoked: frozenset[TopicPartition]) -> Any: ...

    def on_partitions_assigned(self, assigned: frozenset[TopicPartition]) -> Any: ...


def _access_denied(error: TidelogError) -> bool:
    return isinstance(error, AuthorizationFailedError | SaslAuthenticationError)


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


class GroupMembership:
    """One member of a consumer group. Start with `await start()`; `close()` ends it."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        group_id: str,
        *,
        topics: Sequence[str] = (),
        pattern: str = "",
        group_instance_id: str = "",
        client_id: str = "tidelog",
        assignor: str = DEFAULT_ASSIGNOR,
        session_timeout_ms: int = 45_000,
        rebalance_timeout_ms: int = 60_000,
        heartbeat_interval_ms: int | None = None,
        listener: RebalanceListener | None = None,
        rediscover: Rediscover | None = None,
        security: ChannelSecurity = PLAINTEXT,
    ) -> None:
        if not topics and not pattern:
            raise ValueError("subscribe to topics or a pattern")
        self.group_id = group_id
        self.topics = list(topics)
        self.pattern = pattern
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.assignor = assignor
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.listener = listener
        # rediscover: the coordinator addresses asked for again once every
        # one has failed (see CoordinatorChannels).
        self._channels = CoordinatorChannels(bootstrap, rediscover, security)
        self._offsets = OffsetStoreClient(bootstrap, rediscover=rediscover, security=security)
        #: Set by the coordinator on join.
        self.member_id = ""
        #: The secret the join answered with: re-attaching, committing and
        #: leaving need it (the member id alone is public).
        self.member_token = ""
        #: Epoch of the last assignment received; commits carry it.
        self.member_epoch = 0
        #: The group's generation as last seen.
        self.group_epoch = 0
        #: Partitions this member owns now.
        self.assignment: frozenset[TopicPartition] = frozenset()
        #: Counts of assignment changes applied (tests, metrics).
        self.rebalances = 0
        #: The member's own upper bound on the interval (the coordinator's
        #: answer may only shorten it).
        self._heartbeat_max_ms = heartbeat_interval_ms or max(200, session_timeout_ms // 3)
        self.heartbeat_interval_ms = self._heartbeat_max_ms
        #: Last fatal error (the loop keeps rejoining after retriable ones).
        self.error: TidelogError | None = None
        #: The coordinator's refusal that ended the session (see module doc).
        self.refused: TidelogError | None = None
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._outbox: asyncio.Queue[group_pb2.GroupHeartbeatRequest | None] = asyncio.Queue()
        self._closing = False

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"group-{self.group_id}")

    async def wait_for(
        self, predicate: Callable[[GroupMembership], bool], timeout_s: float
    ) -> None:
        """Until predicate(self) holds after an assignment change (or TimeoutError)."""
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: predicate(self))

    async def joined(self, timeout_s: float) -> None:
        """Until the coordinator has answered the join: it gave this member
        an id, or it refused the join (its error raised here: an invalid
        group id, a full group; a retriable answer is waited past), or it
        denied access (returns: the application's next poll raises that, as
        the membership goes on trying). TimeoutError after `timeout_s`
        without an answer."""

        def answered(member: GroupMembership) -> bool:
            error = member.error
            return bool(member.member_id) or (
                error is not None and (not error.retriable or _access_denied(error))
            )

        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: answered(self))
        error = self.error
        if error is not None and not self.member_id and not _access_denied(error):
            raise error

    async def leave(self, revoke: bool = True) -> None:
        """Leave now: partitions are revoked here and move at once. With
        `revoke=False` the listener is not called and the partitions are
        simply dropped (the caller treats them as lost: a consumer that
        stopped polling cannot run its callbacks)."""
        member_id = self.member_id
        await self._stop_task()
        if self.assignment and revoke:
            await self._revoke(self.assignment)
        self.assignment = frozenset()
        if member_id:
            stub = group_pb2_grpc.GroupStub(self._channels.channel())
            try:
                await stub.LeaveGroup(
                    group_pb2.LeaveGroupRequest(
                        group_id=self.group_id,
                        member_id=member_id,
                        member_token=self.member_token,
                    ),
                    timeout=5,
                )
            except grpc.aio.AioRpcError as exc:
                # The session then ends by itself after session_timeout_ms.
                log.warning("leaving group %r failed: %s", self.group_id, exc.details())
        self.member_id = self.member_token = ""

    async def close(self, leave: bool | None = None) -> None:
        """End the membership. By default a dynamic member leaves (its partitions
        move now) and a static member does not (so a restart within the session
        timeout gets the same partitions back)."""
        if leave if leave is not None else not self.group_instance_id:
            await self.leave()
        else:
            await self._stop_task()
        await self._channels.close()
        await self._offsets.close()

    async def _stop_task(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ------------------------------------------------------------ offsets

    async def committed(
        self, partitions: Sequence[TopicPartition] = ()
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets (of `partitions`; all when empty)."""
        return await self._offsets.fetch(self.group_id, partitions)

    async def commit(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata]) -> None:
        """Commit with this member's epoch; retried once if the epoch moved on
        while the request was in flight (a rebalance elsewhere in the group)."""
        epoch = self.member_epoch
        try:
            await self._offsets.commit(
                self.group_id,
                offsets,
                member_id=self.member_id,
                member_epoch=epoch,
                member_token=self.member_token,
            )
        except IllegalGenerationError:
            if self.member_epoch == epoch:
                raise
            await self._offsets.commit(
                self.group_id,
                offsets,
                member_id=self.member_id,
                member_epoch=self.member_epoch,
                member_token=self.member_token,
            )

    # ------------------------------------------------------------ the session

    def _join_request(self) -> group_pb2.GroupHeartbeatRequest:
        return group_pb2.GroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=self.member_epoch,
            member_token=self.member_token,
            group_instance_id=self.group_instance_id,
            client_id=self.client_id,
            subscribed_topics=self.topics,
            subscribed_topic_regex=self.pattern,
            assignor=self.assignor,
            session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            ack=self._ack() if self.member_id else None,
        )

    def _ack(self) -> group_pb2.AssignmentAck:
        return group_pb2.AssignmentAck(
            member_epoch=self.member_epoch,
            owned=[
                common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(self.assignment)
            ],
        )

    async def _requests(
        self, outbox: asyncio.Queue[group_pb2.GroupHeartbeatRequest | None]
    ) -> AsyncIterator[group_pb2.GroupHeartbeatRequest]:
        """One stream's requests, from its own outbox until None: a stream
        that ended must neither take the next stream's requests (an ack
        would be lost) nor stay suspended in get() for ever."""
        yield self._join_request()
        while True:
            try:
                async with asyncio.timeout(self.heartbeat_interval_ms / 1000):
                    request = await outbox.get()
            except TimeoutError:
                request = group_pb2.GroupHeartbeatRequest()
            if request is None:
                return
            yield request

    async def _run(self) -> None:
        delay_s = 0.05
        while not self._closing:
            outbox: asyncio.Queue[group_pb2.GroupHeartbeatRequest | None] = asyncio.Queue()
            self._outbox = outbox
            stub = group_pb2_grpc.GroupStub(self._channels.channel())
            call = stub.Heartbeat(self._requests(outbox))
            try:
                async for response in call:
                    if response.HasField("error") and response.error.code != common_pb2.NONE:
                        # No reset of the delay: a coordinator that refuses
                        # every join (a full group, say) is asked again at
                        # most once a RECONNECT_DELAY_MAX_S, not 20 times a second.
                        await self._on_error(
                            error_from_code(response.error.code, response.error.message)
                        )
                        if self.refused is not None:
                            return  # (the finally below ends the stream)
                        break
                    delay_s = 0.05
                    await self._on_response(response)
            except grpc.aio.AioRpcError as exc:
                if is_unavailable(exc) or exc.code() == grpc.StatusCode.CANCELLED:
                    log.info("coordinator %s unavailable; trying the next", self._channels.address)
                    await self._channels.rotate()
                else:
                    error = error_from_rpc(exc)
                    if error.retriable or isinstance(error, UnknownServerError):
                        # UnknownServerError is also what a status gRPC
                        # raised itself (INTERNAL) decodes to: no verdict.
                        log.warning("group %r heartbeat stream failed: %s", self.group_id, exc)
                    else:
                        # A refusal that ended the stream (a stream limit,
                        # access denied) is one an answer carried: the
                        # same verdict, told the same way.
                        await self._on_refusal(error)
                        if self.refused is not None:
                            return  # (the finally below ends the stream)
            finally:
                call.cancel()
                outbox.put_nowait(None)
            await asyncio.sleep(delay_s)
            delay_s = min(RECONNECT_DELAY_MAX_S, delay_s * 2)

    async def _on_error(self, error: TidelogError) -> None:
        from tidelog.errors import CoordinatorNotAvailableError, UnknownMemberIdError

        if isinstance(error, UnknownMemberIdError):
            log.warning("%s; joining again", self._about_group(error.message))
            lost = self.assignment
            self.member_id, self.member_epoch, self.member_token = "", 0, ""
            if lost:
                handler = getattr(self.listener, "on_partitions_lost", None)
                self.assignment = frozenset()
                if handler is not None:
                    await _maybe_await(handler(lost))
                elif self.listener is not None:
                    await _maybe_await(self.listener.on_partitions_revoked(lost))
                await self._notify()
        elif isinstance(error, CoordinatorNotAvailableError):
            await self._channels.rotate()
        else:
            await self._on_refusal(error)

    async def _on_refusal(self, error: TidelogError) -> None:
        """The coordinator refused the member (see the module doc): kept in
        `error`, and in `refused` when retrying cannot change it."""
        self.error = error
        if not error.retriable and not _access_denied(error):
            self.refused = error  # the session ends (see _run)
        log.error("%s", self._about_group(error.message))
        await self._notify()  # a join may be waiting for its answer (joined())
        if self.refused is not None or _access_denied(error):
            # The caller raises it: tell one that waits (a poll()) now,
            # as an assignment change is told, not at its next look.
            handler = getattr(self.listener, "on_refused", None)
            if handler is not None:
                await _maybe_await(handler(error))

    def _about_group(self, message: str) -> str:
        """`message` naming this group once: the coordinator's own messages
        often name it already ("group 'g' has 2 members: ...")."""
        named = f"group {self.group_id!r}"
        return message if named in message else f"{named}: {message}"

    async def _on_response(self, response: group_pb2.GroupHeartbeatResponse) -> None:
        if response.member_id:
            self.member_id = response.member_id
        if response.member_token:
            self.member_token = response.member_token
        if response.heartbeat_interval_ms:
            self.heartbeat_interval_ms = min(response.heartbeat_interval_ms, self._heartbeat_max_ms)
        self.member_epoch = response.member_epoch
        if response.group_epoch:
            self.group_epoch = response.group_epoch
        if not response.HasField("assignment"):
            await self._notify()
            return
        new = frozenset(
            TopicPartition(tp.topic, tp.partition) for tp in response.assignment.partitions
        )
        revoked = self.assignment - new
        if revoked:
            await self._revoke(revoked)
        added = new - self.assignment
        self.assignment = new
        if added and self.listener is not None:
            await _maybe_await(self.listener.on_partitions_assigned(added))
        self.rebalances += 1
        self._outbox.put_nowait(group_pb2.GroupHeartbeatRequest(ack=self._ack()))
        await self._notify()

    async def _revoke(self, revoked: frozenset[TopicPartition]) -> None:
        if self.listener is not None:
            await _maybe_await(self.listener.on_partitions_revoked(revoked))
        self.assignment = self.assignment - revoked

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
