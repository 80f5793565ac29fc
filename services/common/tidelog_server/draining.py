"""How a stopping service ends a client's data stream (Log Produce and
Fetch on a broker or the gateway, Records Produce and Consume on the
gateway): `abort_draining`; and `next_unless_drained`, the read of a
stream's next request that a drain stops at once.

Status UNAVAILABLE: what gRPC itself ends the calls left after a grace
with ("Cancelling all calls"), so a client that reads only the status
treats both alike. And in the trailer (`tidelog-error-code`) the code any
client reads as "this partition is not served here any more: refresh
metadata and go where it is", NOT_LEADER_OR_FOLLOWER, retriable: what a
Kafka client sees of a broker that goes away in a controlled shutdown.
For a broker it is literally so (its partitions are about to be led
elsewhere); the gateway names itself the leader of every partition, and
it is about to lead none. The SDK takes a named code over a bare
UNAVAILABLE (tidelog.errors.names_error_code): it refreshes its metadata
and sends again what was not answered, or fetches again from its positions.
(COORDINATOR_NOT_AVAILABLE, which the gateway's Heartbeat relay ends with,
is the control plane's.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, NoReturn, TypeVar

import grpc
import grpc.aio
from tidelog.errors import ERROR_CODE_METADATA_KEY, NotLeaderOrFollowerError

T = TypeVar("T")


async def abort_draining(
    context: grpc.aio.ServicerContext, service: str, what_to_do: str
) -> NoReturn:
    """End the stream because `service` ("the gateway", "broker 3") is
    stopping: "`service` is shutting down: `what_to_do`" (see module doc)."""
    await context.abort(
        grpc.StatusCode.UNAVAILABLE,
        f"{service} is shutting down: {what_to_do}",
        trailing_metadata=((ERROR_CODE_METADATA_KEY, NotLeaderOrFollowerError.code_name),),
    )
    raise AssertionError("context.abort returns only by raising")  # pragma: no cover


async def next_unless_drained(requests: AsyncIterator[T], drained: asyncio.Future[Any]) -> T | None:
    """The client's next request from `requests` (an iterator, read by one
    task); None when the client's side has ended (half-close), or as soon as
    `drained` is done, the read then abandoned: a request the client was
    sending is not taken (and not answered; it sends it again elsewhere)."""
    read = asyncio.ensure_future(anext(requests))
    read.add_done_callback(_retrieve)
    await asyncio.wait((read, drained), return_when=asyncio.FIRST_COMPLETED)
    if not read.done():
        read.cancel()
        return None
    try:
        return read.result()
    except StopAsyncIteration:
        return None


def _retrieve(read: asyncio.Future[Any]) -> None:
    """Mark a read's outcome as seen (the end of the stream, or an error
    after the stream was given up), so asyncio does not log it."""
    if not read.cancelled():
        read.exception()
