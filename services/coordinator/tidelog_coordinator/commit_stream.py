"""One CommitOffsetsStream: a client's offset commits over one stream, each
answered under its correlation id once its etcd transaction returned.

Owns the stream's bookkeeping, not the commits (those go through the same
function as the unary CommitOffsets, so they are checked, fenced, coalesced
and made durable exactly alike):
- at most `in_flight_max` commits of the stream are in flight, counting
  from when a commit is read until its answer was handed to gRPC. At the
  bound no further request message is read (a message carries up to
  COMMITS_PER_MESSAGE_MAX commits: what the client sent while writing the
  one before), so a client that never reads its answers holds at most that
  many commits (plus the rest of the message being started) and their
  answers in the coordinator (gRPC's flow control then stops its writes);
- correlation ids in flight are unique: a commit reusing one is answered
  INVALID_REQUEST (naming it) and not committed, since its answer could not
  be told apart;
- answers go out in the order the commits finish, not the order they came,
  and one response message carries every answer ready when it is sent (the
  commits of one coalesced etcd transaction return together): a message
  costs the coordinator about as much CPU as a commit's own work.

The stream ends once the client closed its side and every answer was sent,
or, when the coordinator shuts down (`drain()`), once the commits already
read were answered: the client sends the rest to another replica.
One event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from tidelog.errors import InvalidRequestError
from tidelog.v1 import common_pb2, group_pb2

from tidelog_coordinator.errors import error_proto

log = logging.getLogger("tidelog.coordinator.offsets")

#: Commits one request message may carry.
COMMITS_PER_MESSAGE_MAX = 1024

#: An answer ready to send: (correlation id, error or None).
_Answer = tuple[int, common_pb2.Error | None]

#: Commits one request; None when committed, else the error to answer.
CommitOne = Callable[[group_pb2.CommitOffsetsRequest], Awaitable[common_pb2.Error | None]]


class CommitStream:
    """Serves one stream: `answers(requests)` is the handler's output."""

    def __init__(self, commit: CommitOne, in_flight_max: int) -> None:
        if in_flight_max < 1:
            raise ValueError(f"in_flight_max must be at least 1, not {in_flight_max}")
        self._commit = commit
        self.in_flight_max = in_flight_max
        self._slots = asyncio.Semaphore(in_flight_max)
        #: Answers ready to send, (correlation id, error); None after the last.
        self._answers: asyncio.Queue[_Answer | None] = asyncio.Queue()
        self._ids: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._reader: asyncio.Task[None] | None = None
        self._draining = False
        self._reading = True
        #: Set when the client broke a limit of the stream itself: the
        #: handler ends the stream with it once the answers are sent.
        self.refused: InvalidRequestError | None = None

    async def answers(
        self, requests: AsyncIterator[group_pb2.CommitOffsetsStreamRequest]
    ) -> AsyncGenerator[group_pb2.CommitOffsetsStreamResponse, None]:
        reader = self._reader = asyncio.create_task(
            self._read(requests), name="commit-stream-reader"
        )
        answers = self._answers
        try:
            ended = False
            while not ended:
                ready: list[_Answer | None] = [await answers.get()]
                while not answers.empty():
                    ready.append(answers.get_nowait())
                if ready[-1] is None:
                    ended = True
                    ready.pop()
                if not ready:
                    break
                message = group_pb2.CommitOffsetsStreamResponse()
                add = message.answers.add
                for correlation_id, error in ready:  # type: ignore[misc]
                    if error is None:
                        add(correlation_id=correlation_id)
                    else:
                        add(correlation_id=correlation_id, error=error)
                yield message
                # Sent (handed to gRPC): as many more requests may be read.
                for _ in ready:
                    self._slots.release()
        finally:
            reader.cancel()
            for task in list(self._tasks):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            if self._tasks:
                await asyncio.wait(self._tasks)

    async def _read(self, requests: AsyncIterator[group_pb2.CommitOffsetsStreamRequest]) -> None:
        try:
            iterator = aiter(requests)
            while True:
                # A slot first: at the bound, the next message stays unread.
                await self._slots.acquire()
                try:
                    message = await anext(iterator)
                except StopAsyncIteration:
                    break
                commits = message.commits
                if len(commits) > COMMITS_PER_MESSAGE_MAX:
                    self.refused = InvalidRequestError(
                        f"a CommitOffsetsStream message carries {len(commits)} commits: at "
                        f"most {COMMITS_PER_MESSAGE_MAX}"
                    )
                    break
                if not commits:
                    self._slots.release()
                for i, streamed in enumerate(commits):
                    if i:  # (the first has the slot taken before the read)
                        await self._slots.acquire()
                    self._start(streamed)
        except asyncio.CancelledError:
            if not self._draining:
                raise
        except Exception as exc:
            # The client went away, or the interceptor refused a request
            # (it ends the stream with that error itself).
            log.debug("commit stream input ended: %s", exc)
        self._reading = False
        if self._tasks:
            await asyncio.wait(set(self._tasks))
        self._answers.put_nowait(None)

    def _start(self, streamed: group_pb2.StreamedCommit) -> None:
        correlation_id = streamed.correlation_id
        if correlation_id in self._ids:
            error = InvalidRequestError(
                f"correlation_id {correlation_id} is already in flight on this stream: "
                "each commit in flight needs its own"
            )
            self._answers.put_nowait((correlation_id, error_proto(error, "committing offsets")))
            return
        self._ids.add(correlation_id)
        task = asyncio.create_task(self._one(correlation_id, streamed.commit))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def drain(self) -> None:
        """Read no more requests; end the stream once the commits already
        read are answered (shutdown)."""
        self._draining = True
        if self._reader is not None and self._reading:
            self._reader.cancel()

    async def _one(self, correlation_id: int, request: group_pb2.CommitOffsetsRequest) -> None:
        try:
            error = await self._commit(request)
        finally:
            self._ids.discard(correlation_id)
        self._answers.put_nowait((correlation_id, error))
