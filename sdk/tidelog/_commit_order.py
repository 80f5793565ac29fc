"""`OrderedCommits`: one consumer's offset commits, applied at the
coordinator in the order they were made (Kafka's guarantee: a later commit
never lands before an earlier one, so the committed offset never goes back).

Concurrent commits of one consumer do not keep their order on the way: two
unary calls may be handled in either order, a commit retried after a
fail-over or a retriable error lands after the ones sent meanwhile. So one
consumer has one commit in flight at a time. The commits queued meanwhile
(commit_async() does not wait) go together in the next request, merged in
call order (a later offset for a partition replaces an earlier one): the
same end state as sending them one by one, in one round trip, so a burst of
commit_async() calls costs a few requests, not one each.

Each commit gets its own outcome: a merged request that succeeded is every
commit's success; one that got no answer (no coordinator reached while its
retries lasted) is every commit's failure; one that the coordinator refused
(a partition that does not exist, say, which may be one commit's fault) is
sent again commit by commit, in order, so that each gets the answer it
would have had alone. A failure never stops the commits after it.

A commit whose caller stopped waiting (cancelled: a timeout, wakeup()) is
dropped if it was not sent yet; one already sent goes on to its answer, as
any request already sent may land. Commits are other consumers' business
only: each consumer has its own queue. One event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tidelog.errors import (
    BrokerNotAvailableError,
    ClosedError,
    CoordinatorNotAvailableError,
    GroupsNotSupportedError,
    TidelogError,
    TidelogTimeoutError,
)
from tidelog.group import OffsetAndMetadata
from tidelog.types import TopicPartition

Offsets = dict[TopicPartition, OffsetAndMetadata]

#: Partitions in one merged request: the coordinator's limit for a commit
#: (group_limits.PARTITIONS_MAX). A commit that alone has more goes alone
#: (and gets the coordinator's error naming the limit).
MERGED_PARTITIONS_MAX = 10_000
#: Metadata bytes in one merged request: well below gRPC's 4 MiB message limit.
MERGED_METADATA_BYTES_MAX = 1024 * 1024
#: Errors that say the request got no answer (after its retries): every
#: commit in it would have had the same, so it is theirs without asking again.
_UNANSWERED = (
    CoordinatorNotAvailableError,
    BrokerNotAvailableError,
    GroupsNotSupportedError,
    TidelogTimeoutError,
)


@dataclass(slots=True)
class _Commit:
    offsets: Offsets
    outcome: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def settle(self, error: BaseException | None) -> None:
        if self.outcome.done():  # its caller stopped waiting
            return
        if error is None:
            self.outcome.set_result(None)
        else:
            self.outcome.set_exception(error)


def _metadata_bytes(offsets: Offsets) -> int:
    return sum(len(om.metadata.encode()) for om in offsets.values())


class OrderedCommits:
    """One consumer's commit queue (see module doc). `send` commits one
    request, retrying what is retriable, and raises its error."""

    def __init__(self, send: Callable[[Offsets], Awaitable[None]]) -> None:
        self._send = send
        self._queued: deque[_Commit] = deque()
        #: The task sending the queued commits; started by a commit that
        #: finds none running, it ends once the queue is empty.
        self._sender: asyncio.Task[None] | None = None

    async def commit(self, offsets: Offsets) -> None:
        """Commit `offsets` after every commit made before it (see module doc)."""
        commit = _Commit(dict(offsets))
        self._queued.append(commit)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_queued(), name="ordered-commits")
        await commit.outcome

    async def answered(self) -> None:
        """Until every commit made so far has its answer (or was dropped)."""
        sender = self._sender
        if sender is not None and not sender.done():
            # asyncio.wait: a close() that cancels the sender is not our
            # error, and a cancel of our caller does not reach the sender.
            await asyncio.wait([sender])

    async def close(self) -> None:
        """Stop sending: the commit in flight is cut off, and it and those
        queued fail with ClosedError. A commit made later starts again."""
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        self._fail_queued(ClosedError("the consumer left its group (or closed) first"))

    def _fail_queued(self, error: BaseException) -> None:
        while self._queued:
            self._queued.popleft().settle(error)

    def _take(self) -> list[_Commit]:
        """The next request's commits: the queued ones in call order (those
        still waited for), as many as one request holds."""
        batch: list[_Commit] = []
        partitions: set[TopicPartition] = set()
        metadata_bytes = 0
        while self._queued:
            commit = self._queued[0]
            if commit.outcome.done():  # its caller stopped waiting: not sent
                self._queued.popleft()
                continue
            more = partitions | commit.offsets.keys()
            more_bytes = metadata_bytes + _metadata_bytes(commit.offsets)
            if batch and (
                len(more) > MERGED_PARTITIONS_MAX or more_bytes > MERGED_METADATA_BYTES_MAX
            ):
                break
            batch.append(self._queued.popleft())
            partitions, metadata_bytes = more, more_bytes
        return batch

    async def _send_queued(self) -> None:
        batch: list[_Commit] = []
        try:
            while batch := self._take():
                await self._send_batch(batch)
        except asyncio.CancelledError:
            error = ClosedError("the consumer left its group (or closed) before the answer")
            for commit in batch:
                commit.settle(error)
            raise

    async def _send_batch(self, batch: list[_Commit]) -> None:
        merged: Offsets = {}
        for commit in batch:
            merged.update(commit.offsets)  # call order: the later offset wins
        try:
            await self._send(merged)
        except TidelogError as exc:
            if len(batch) == 1 or isinstance(exc, _UNANSWERED):
                for commit in batch:
                    commit.settle(exc)
                return
            # Maybe one commit's fault: each alone, in order, for its own answer.
            for commit in batch:
                if not commit.outcome.done():  # (a caller that stopped waiting: dropped)
                    await self._send_alone(commit)
            return
        except Exception as exc:
            for commit in batch:
                commit.settle(exc)
            return
        for commit in batch:
            commit.settle(None)

    async def _send_alone(self, commit: _Commit) -> None:
        try:
            await self._send(commit.offsets)
        except Exception as exc:
            commit.settle(exc)
        else:
            commit.settle(None)
