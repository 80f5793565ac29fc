"""`CommitStream`: a member's offset commits over one CommitOffsetsStream.

One stream per coordinator channel (`OffsetStoreClient` opens it on first
use). Commits are written under fresh correlation ids and each waits for the
answer carrying its id; answers may come in any order. A stream that ends
(the coordinator went away, was shut down, or the client closed it to fail
over) fails every commit waiting on it with `StreamEnded`, or with the gRPC
error it ended with; the caller retries those on a new stream, as it retries
a unary call. Not thread-safe: one event loop.
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


class StreamEnded(Exception):
    """The stream ended without answering (not an answer of the server)."""


class CommitStream:
    """One open CommitOffsetsStream and the commits waiting on it."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        # No request iterator: written to with write() (the stubs' types want one).
        self._call = group_pb2_grpc.GroupStub(channel).CommitOffsetsStream()  # type: ignore[call-arg]
        self._pending: dict[int, asyncio.Future[group_pb2.CommitOffsetsStreamResponse]] = {}
        self._ids = itertools.count(1)
        # gRPC takes one write at a time per call.
        self._write_lock = asyncio.Lock()
        self._closing = False
        #: Why the stream ended (None while it is open).
        self.error: BaseException | None = None
        self._reader = asyncio.create_task(self._read(), name="commit-stream")

    @property
    def open(self) -> bool:
        return self.error is None and not self._closing

    async def commit(
        self, request: group_pb2.CommitOffsetsRequest, timeout_s: float
    ) -> group_pb2.CommitOffsetsStreamResponse:
        """Send one commit and wait (at most `timeout_s`, raising TimeoutError)
        for its answer. Raises the gRPC error the stream ended with, or
        StreamEnded."""
        if self.error is not None:
            raise self.error
        correlation_id = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = answer
        try:
            async with asyncio.timeout(timeout_s):
                async with self._write_lock:
                    try:
                        await self._call.write(
                            group_pb2.CommitOffsetsStreamRequest(
                                correlation_id=correlation_id, commit=request
                            )
                        )
                    except asyncio.InvalidStateError:
                        # The call is over: the reader says why.
                        await asyncio.wait({self._reader})
                        raise self.error or StreamEnded("the commit stream ended") from None
                return await answer
        finally:
            self._pending.pop(correlation_id, None)

    async def _read(self) -> None:
        error: BaseException
        try:
            async for answer in self._call:
                waiting = self._pending.get(answer.correlation_id)
                if waiting is not None and not waiting.done():
                    waiting.set_result(answer)
            error = StreamEnded("the coordinator ended the commit stream")
        except grpc.aio.AioRpcError as exc:
            # Cancelled by close(): a fail-over (or the client closing), not
            # the server's answer.
            error = StreamEnded("the commit stream was closed") if self._closing else exc
        except asyncio.CancelledError:
            error = StreamEnded("the commit stream was closed")
        self.error = error
        for waiting in self._pending.values():
            if not waiting.done():
                waiting.set_exception(error)

    async def close(self) -> None:
        """End the stream; commits still waiting fail with StreamEnded."""
        self._closing = True
        self._call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
