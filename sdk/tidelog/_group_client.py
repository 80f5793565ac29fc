"""The event-loop side of a consumer's group membership.

`GroupClient` finds the coordinators, runs a `GroupMembership` (the
heartbeat stream) and turns each assignment change into an event for the
calling side (`_consumer_group.GroupSide`), which applies it inside poll()
(the caller's thread for the sync Consumer, as Kafka does):

    ("revoked", partitions, done)   stop consuming them: commit, call the
                                    listener, then resolve `done`; only then
                                    does the membership acknowledge, and the
                                    coordinator hands them to their new owner
    ("lost", partitions, done)      the session ended (or the consumer left
                                    because poll() was not called): they may
                                    already belong to others; no commit
    ("assigned", partitions, None)  start consuming them from the committed
                                    offsets (or auto_offset_reset)

Finding the coordinators: the client is given broker addresses. Brokers in
cluster mode (and coordinators) serve `tidelog.v1.Cluster/DescribeCluster`,
whose answer lists the live coordinator replicas; a standalone broker does
not serve it (UNIMPLEMENTED), which becomes GroupsNotSupportedError. A
gateway names itself as the one coordinator, with no host when it does not
know the address its clients use: then the address that answered is used.

Commits of a consumer that uses assign() with a group id (no subscription):
it is no member, so its commits are administrative offset changes
(AlterOffsets), accepted only while the group has no live members, as
Kafka's standalone consumers' are. Members' commits (CommitOffsets) carry
the member's id, epoch and token. Either way every commit of the consumer
(commit(), commit_async(), auto-commit, the final commit) goes through one
`_commit_order.OrderedCommits`: they apply in the order they were made.

max_poll_interval_ms: a watchdog notices when poll() has not been called for
that long, logs a warning saying so, and leaves the group without calling the
listener (the application is stuck; its partitions must move now). The
partitions are reported lost at the next poll(), which then rejoins.

Everything here runs on the consumer's event loop except `events` (a deque:
thread-safe append/popleft) and the `last_poll`/`in_poll` stamps, which the
calling side writes and the watchdog only reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import grpc
import grpc.aio

from tidelog._commit_order import OrderedCommits
from tidelog._connection import Cluster
from tidelog.config import ConsumerConfig
from tidelog.errors import (
    BrokerNotAvailableError,
    CoordinatorNotAvailableError,
    GroupsNotSupportedError,
    TidelogError,
    TidelogTimeoutError,
    error_from_rpc,
)
from tidelog.group import GroupMembership, OffsetAndMetadata, OffsetStoreClient
from tidelog.types import TopicPartition
from tidelog.v1 import cluster_pb2, cluster_pb2_grpc

log = logging.getLogger("tidelog.consumer")

REVOKED = "revoked"
LOST = "lost"
ASSIGNED = "assigned"

#: The shortest pause between lookups of the coordinators (and wait of one):
#: retry_backoff_ms=0 must not spin on a cluster with no coordinator.
DISCOVER_BACKOFF_MIN_S = 0.05


class GroupEvent(NamedTuple):
    kind: str
    partitions: frozenset[TopicPartition]
    #: Resolved by the calling side once applied (revoked and lost only).
    done: asyncio.Future[None] | None


async def discover_coordinators(cluster: Cluster, timeout_s: float) -> list[str]:
    """Coordinator addresses, asked of the first server that answers."""
    last: BaseException | None = None
    for address in cluster.any_address():
        stub: Any = cluster_pb2_grpc.ClusterStub(cluster.channel(address))
        try:
            reply = await stub.DescribeCluster(
                cluster_pb2.DescribeClusterRequest(), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise GroupsNotSupportedError(
                    f"{address} runs standalone (no --etcd), so it has no consumer groups: "
                    "use assign() and seek(), or run a cluster (`tidelog dev`)"
                ) from None
            last = error_from_rpc(exc, address=address)
            continue
        # A coordinator that names no host (a gateway that does not know the
        # address its clients use) is reached where this answer came from,
        # as a broker that advertises no host is in Metadata.
        addresses = list(
            dict.fromkeys(
                f"{c.host}:{c.port}"
                if c.host and c.host not in ("0.0.0.0", "::", "[::]") and c.port
                else address
                for c in reply.coordinators
            )
        )
        if addresses:
            return addresses
        last = CoordinatorNotAvailableError(f"{address}: no coordinator is registered")
    if isinstance(last, CoordinatorNotAvailableError):
        raise last
    raise BrokerNotAvailableError(
        f"no server answered DescribeCluster at {', '.join(cluster.any_address())}: {last}"
    )


class GroupClient:
    """One consumer's membership in one group (see module doc). One event loop."""

    def __init__(
        self, cluster: Cluster, config: ConsumerConfig, notify: Callable[[], None]
    ) -> None:
        assert config.group_id is not None
        self.group_id = config.group_id
        self._cluster = cluster
        self._config = config
        self._notify = notify
        self.events: deque[GroupEvent] = deque()
        self.membership: GroupMembership | None = None
        self.topics: list[str] = []
        self.pattern = ""
        #: Set when the watchdog made the consumer leave; the next poll rejoins.
        self.left_for_poll_timeout = False
        #: Written by the calling side (monotonic seconds; inside poll()).
        self.last_poll = time.monotonic()
        self.in_poll = False
        self._closing = False
        self._watchdog: asyncio.Task[None] | None = None
        #: Offsets of the standalone (assign()) consumer; see the module doc.
        self._standalone: OffsetStoreClient | None = None
        self._finding_store = asyncio.Lock()
        self._commits = OrderedCommits(self._send_commit)

    # ------------------------------------------------------------ lifecycle

    async def join(self, topics: Sequence[str], pattern: str) -> None:
        """Join (or rejoin) with this subscription; returns once the
        coordinator has answered (see GroupMembership.joined). Bounded by
        request_timeout_ms, finding the coordinators included. A join that
        fails leaves no membership behind (none half started, heartbeating
        or retrying a refused join); the subscription stays recorded here:
        whether it stands is the calling side's to say (GroupSide)."""
        await self._stop_membership(leave=True)
        self._closing = False
        self.topics, self.pattern = list(topics), pattern
        deadline = time.monotonic() + self._config.request_timeout_ms / 1000
        try:
            await self._start_membership(deadline)
        except BaseException:
            await self._stop_membership(leave=True)
            raise
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.ensure_future(self._watch_polls())

    async def _start_membership(self, deadline: float) -> None:
        config = self._config
        try:
            coordinators = await self._discover(deadline)
        except TidelogError as exc:
            if not exc.retriable:
                raise
            # Looked for until the join's time ran out: the join timed out,
            # as Kafka's does when it finds no coordinator; the last answer
            # says why (no coordinator registered, no server answering).
            raise TidelogTimeoutError(
                f"no coordinator of group {self.group_id!r} was found within "
                f"request_timeout_ms={config.request_timeout_ms}; "
                f"last error: {type(exc).__name__}: {exc}"
            ) from exc
        self.membership = GroupMembership(
            coordinators,
            self.group_id,
            topics=self.topics,
            pattern=self.pattern,
            group_instance_id=config.group_instance_id or "",
            client_id=config.client_id,
            assignor=config.partition_assignment_strategy,
            session_timeout_ms=config.session_timeout_ms,
            rebalance_timeout_ms=config.max_poll_interval_ms,
            heartbeat_interval_ms=config.heartbeat_interval_ms,
            listener=self,
            rediscover=self._rediscover,
            security=config.security,
        )
        self.last_poll = time.monotonic()
        await self.membership.start()
        try:
            await self.membership.joined(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise TidelogTimeoutError(
                f"no coordinator answered the join of group {self.group_id!r} within "
                f"request_timeout_ms={self._config.request_timeout_ms}"
            ) from None
        self.left_for_poll_timeout = False

    async def _discover(self, deadline: float | None = None) -> list[str]:
        """Coordinator addresses. A retriable error (no coordinator
        registered yet, etcd restarting, no server answering) is asked
        again after retry_backoff_ms, doubling up to retry_backoff_max_ms,
        until `deadline` (default: request_timeout_ms from now), each
        attempt waiting at most until then; the last error is raised."""
        timeout_s = self._config.request_timeout_ms / 1000
        if deadline is None:
            deadline = time.monotonic() + timeout_s
        backoff_s = max(DISCOVER_BACKOFF_MIN_S, self._config.retry_backoff_ms / 1000)
        max_backoff_s = max(backoff_s, self._config.retry_backoff_max_ms / 1000)
        while True:
            remaining_s = deadline - time.monotonic()
            try:
                return await discover_coordinators(
                    self._cluster, max(DISCOVER_BACKOFF_MIN_S, min(timeout_s, remaining_s))
                )
            except TidelogError as exc:
                if not exc.retriable or time.monotonic() + backoff_s > deadline:
                    raise
                log.info("finding the coordinators of group %r: %s; retrying", self.group_id, exc)
                await asyncio.sleep(backoff_s)
                backoff_s = min(max_backoff_s, backoff_s * 2)

    async def _rediscover(self) -> list[str]:
        """The coordinators asked for again, once: what the membership uses
        after every address it knew has failed (a gateway replica gone)."""
        return await discover_coordinators(self._cluster, self._config.request_timeout_ms / 1000)

    async def close(self, leave: bool | None = None) -> None:
        """End the membership; the calling side has already revoked (and
        committed) what it owned, so callbacks are no longer forwarded."""
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        # The calling side has waited for them as long as it may: what is
        # still unanswered fails rather than go out after the close.
        await self._commits.close()
        await self._stop_membership(leave)
        self.topics, self.pattern = [], ""
        if self._standalone is not None:
            await self._standalone.close()
            self._standalone = None
        for event in self.events:
            if event.done is not None and not event.done.done():
                event.done.set_result(None)

    def refusal(self) -> TidelogError | None:
        """The coordinator's refusal that ended the membership (a rejoin
        into a full group, say: GroupMembership.refused), None otherwise."""
        membership = self.membership
        return None if membership is None else membership.refused

    async def end_refused(self) -> None:
        """End a membership the coordinator refused (see refusal()): a member
        it still was leaves, so that its partitions move now. The
        subscription stays recorded: the calling side joins again."""
        await self._stop_membership(leave=True)

    async def _stop_membership(self, leave: bool | None) -> None:
        membership, self.membership = self.membership, None
        if membership is not None:
            closing, self._closing = self._closing, True
            try:
                await membership.close(leave)
            finally:
                self._closing = closing

    # ------------------------------------------------------------ listener (from membership)

    def _emit(self, kind: str, partitions: frozenset[TopicPartition], wait: bool) -> Any:
        done = asyncio.get_running_loop().create_future() if wait else None
        self.events.append(GroupEvent(kind, partitions, done))
        self._notify()
        return done

    async def on_partitions_revoked(self, revoked: frozenset[TopicPartition]) -> None:
        if not self._closing:
            await self._emit(REVOKED, revoked, wait=True)

    async def on_partitions_lost(self, lost: frozenset[TopicPartition]) -> None:
        if not self._closing:
            await self._emit(LOST, lost, wait=True)

    def on_partitions_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        if not self._closing:
            self._emit(ASSIGNED, assigned, wait=False)

    def on_refused(self, refusal: TidelogError) -> None:
        """The coordinator refused the member, for good (refusal()) or by
        denying access (which the membership retries): wake a waiting
        poll(), which raises it, instead of leaving it to the poll's next
        look."""
        self._notify()

    # ------------------------------------------------------------ offsets

    def _member(self) -> GroupMembership:
        if self.membership is None:
            raise CoordinatorNotAvailableError(
                f"not a member of group {self.group_id!r} right now (call poll() to rejoin)"
            )
        return self.membership

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """Commit after every commit started before this one (in the order
        the calls began on this loop; see _commit_order)."""
        if offsets:
            await self._commits.commit(dict(offsets))

    async def commits_answered(self) -> None:
        """Until every commit started so far has its answer."""
        await self._commits.answered()

    async def _send_commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """Commit, retrying retriable errors (etcd or the coordinator briefly
        unreachable) until request_timeout_ms, as Kafka's commitSync does."""
        deadline = time.monotonic() + self._config.request_timeout_ms / 1000
        backoff_s = max(0.05, self._config.retry_backoff_ms / 1000)
        while True:
            try:
                if self.topics or self.pattern:
                    await self._member().commit(offsets)
                else:
                    await (await self._standalone_store()).alter(self.group_id, offsets)
                return
            except TidelogError as exc:
                if not exc.retriable or time.monotonic() + backoff_s > deadline:
                    raise
                log.info("committing offsets of group %r: %s; retrying", self.group_id, exc)
                await asyncio.sleep(backoff_s)
                backoff_s = min(1.0, backoff_s * 2)

    async def committed(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        if self.topics or self.pattern:
            return await self._member().committed(partitions)
        return await (await self._standalone_store()).fetch(self.group_id, partitions)

    async def _standalone_store(self) -> OffsetStoreClient:
        # One discovery for calls that start together (a commit and a
        # committed()): each made its own client before, the others leaked.
        async with self._finding_store:
            if self._standalone is None:
                self._standalone = OffsetStoreClient(
                    await self._discover(),
                    request_timeout_ms=self._config.request_timeout_ms,
                    security=self._config.security,
                )
            return self._standalone

    # ------------------------------------------------------------ max_poll_interval_ms

    async def _watch_polls(self) -> None:
        limit_s = self._config.max_poll_interval_ms / 1000
        while True:
            await asyncio.sleep(min(1.0, limit_s / 4))
            membership = self.membership
            stalled_s = time.monotonic() - self.last_poll
            if membership is None or self.in_poll or stalled_s <= limit_s:
                continue
            log.warning(
                "consumer %r: poll() was not called for %.1f s, longer than "
                "max_poll_interval_ms=%d; leaving group %r so that its partitions move to "
                "live members. The next poll() rejoins. If processing a poll's records takes "
                "this long, raise max_poll_interval_ms or lower max_poll_records.",
                self._config.client_id,
                stalled_s,
                self._config.max_poll_interval_ms,
                self.group_id,
            )
            owned = membership.assignment
            self.membership = None
            self.left_for_poll_timeout = True
            # Unblock a revocation waiting on the stuck caller: it is moot now.
            for event in self.events:
                if event.done is not None and not event.done.done():
                    event.done.set_result(None)
            await membership.leave(revoke=False)
            await membership.close(leave=False)
            if owned:
                self._emit(LOST, owned, wait=False)
            else:
                self._notify()
