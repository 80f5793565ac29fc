"""`CommitStream`: a member's offset commits over one CommitOffsetsStream.

One stream per coordinator channel (`OffsetStoreClient` opens it on first
use). Commits are written under fresh correlation ids and each waits for the
answer carrying its id; answers may come in any order. Commits that arrive
while a message is being written go together in the next message (no
waiting added: a write starts at once when none is under way), so many
concurrent commits cost few messages. A stream that ends
(the coordinator went away, was shut down or refused the stream, or the
client closed it to fail over) fails every commit waiting on it with
`StreamEnded`, which carries the gRPC error the server ended the stream with,
if it did; the caller retries the others on a new stream, as it retries a
unary call. Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

import grpc
import grpc.aio

from tidelog.v1 import group_pb2, group_pb2_grpc

log = logging.getLogger(__name__)

#: The coordinator's limit of commits in one request message.
COMMITS_PER_MESSAGE_MAX = 1024


class StreamEnded(Exception):
    """The stream ended before the commit was answered."""

    def __init__(
        self,
        message: str,
        rpc_error: grpc.aio.AioRpcError | None = None,
        write_failed: bool = False,
    ) -> None:
        super().__init__(message)
        #: The status the server ended the stream with; None when it said
        #: nothing (the connection broke, or the client closed the stream).
        self.rpc_error = rpc_error
        #: gRPC could not send on the stream: the connection broke, or the
        #: server ended the call before reading (its status, UNIMPLEMENTED
        #: for one, is then lost: seen through the gateway).
        self.write_failed = write_failed


def _failed_to_send(exc: grpc.aio.AioRpcError) -> bool:
    """grpc's own failure to send a message (the connection went away under
    a write): the call ends INTERNAL without the server having said so."""
    return exc.code() == grpc.StatusCode.INTERNAL and "execute_batch" in (
        exc.debug_error_string() or ""
    )


class CommitStream:
    """One open CommitOffsetsStream and the commits waiting on it."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        # No request iterator: written to with write() (the stubs' types want one).
        self._call = group_pb2_grpc.GroupStub(channel).CommitOffsetsStream()  # type: ignore[call-arg]
        self._pending: dict[int, asyncio.Future[group_pb2.CommitOffsetsStreamAnswer]] = {}
        self._ids = itertools.count(1)
        #: Commits waiting to be written, and the task writing them (one
        #: write at a time; started by a commit that finds it not running).
        self._unsent: list[group_pb2.StreamedCommit] = []
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        #: Why the stream ended (None while it is open).
        self._ended: StreamEnded | None = None
        self._reader = asyncio.create_task(self._read(), name="commit-stream")

    @property
    def open(self) -> bool:
        return self._ended is None and not self._closing

    def _failure(self) -> StreamEnded:
        """A fresh exception per failed commit (one instance raised in many
        places would pile up their tracebacks)."""
        ended = self._ended or StreamEnded("the commit stream ended")
        return StreamEnded(str(ended), ended.rpc_error, ended.write_failed)

    async def commit(
        self, request: group_pb2.CommitOffsetsRequest, timeout_s: float
    ) -> group_pb2.CommitOffsetsStreamAnswer:
        """Send one commit and wait (at most `timeout_s`, raising TimeoutError)
        for its answer; raises StreamEnded when the stream ends first."""
        if self._ended is not None:
            raise self._failure()
        correlation_id = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = answer
        self._unsent.append(group_pb2.StreamedCommit(correlation_id=correlation_id, commit=request))
        try:
            if self._writer is None or self._writer.done():
                self._writer = asyncio.create_task(self._write_unsent(), name="commit-writer")
            async with asyncio.timeout(timeout_s):
                return await answer
        finally:
            del self._pending[correlation_id]
            if not answer.done():
                answer.cancel()
            elif not answer.cancelled():
                answer.exception()  # retrieved (raised above, or moot)

    async def _write_unsent(self) -> None:
        """Write the commits not sent yet; those that came while a message
        was being written go in the next one (gRPC takes one write at a
        time). Ends when none is left (the next commit starts it again)."""
        while self._unsent:
            commits = self._unsent[:COMMITS_PER_MESSAGE_MAX]
            del self._unsent[:COMMITS_PER_MESSAGE_MAX]
            try:
                await self._call.write(group_pb2.CommitOffsetsStreamRequest(commits=commits))
            except (asyncio.InvalidStateError, grpc.aio.AioRpcError):
                # The call is over: the reader says why and fails every
                # commit waiting, those not written too.
                self._unsent.clear()
                return

    async def _read(self) -> None:
        try:
            async for message in self._call:
                for answer in message.answers:
                    waiting = self._pending.get(answer.correlation_id)
                    if waiting is not None and not waiting.done():
                        waiting.set_result(answer)
            self._ended = StreamEnded("the coordinator ended the commit stream")
        except grpc.aio.AioRpcError as exc:
            if self._closing:  # close(): a fail-over, or the client closing
                self._ended = StreamEnded("the commit stream was closed")
            elif _failed_to_send(exc):
                self._ended = StreamEnded(
                    f"the connection broke under a commit: {exc.details()}", write_failed=True
                )
            else:
                self._ended = StreamEnded(f"the commit stream ended: {exc.details()}", exc)
        except asyncio.CancelledError:
            self._ended = StreamEnded("the commit stream was closed")
        for waiting in self._pending.values():
            if not waiting.done():
                waiting.set_exception(self._failure())

    async def close(self) -> None:
        """End the stream; commits still waiting fail with StreamEnded."""
        self._closing = True
        self._call.cancel()
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
