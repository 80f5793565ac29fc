"""Refusing a streaming call (a limit, an identity, an RPC not served) so
that the client gets the refusal's status and message.

A server that ends a client-streaming call before reading it sends its
trailers, then RST_STREAM; a grpc.aio client whose write reaches gRPC in
between has that write fail, and the call ends INTERNAL ("Failed
execute_batch", grpc/grpc#36066: the failed write overwrites the status the
server sent). Every Tidelog stream starts with the client writing at once,
so that race was lost several times in a hundred. `refuse_stream` therefore
reads (and drops) what the client writes before it ends the call: its first
request, waited for at most `REFUSAL_READ_S`, then those that follow
back to back (a client pipelining requests, as the SDK's producer does),
until the client pauses for `NEXT_REQUEST_WAIT_S`, half-closes, or
`REFUSAL_READ_S` or `REFUSAL_REQUESTS_MAX` is reached. So a refusal costs
at most that many messages, one at a time, and one second; the refused
stream takes no slot. A client that writes again after such a pause can
still lose the refusal to that write.

At most `REFUSALS_READING_MAX` refusals read at once in a process; past that
(a flood of refused streams, which a caller that is not even authenticated
can open) a refusal ends its call at once, so the flood costs neither memory
(one message of up to the service's message limit per reading refusal) nor
time: those clients may then see INTERNAL instead of the refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc
from tidelog.errors import ERROR_CODE_METADATA_KEY, InvalidRequestError, TidelogError

#: The longest a refused stream is read before it is ended: clients write
#: their first request as soon as the call opens; this bounds one that does not.
REFUSAL_READ_S = 1.0
#: A pause in the client's writes this long ends the reading.
NEXT_REQUEST_WAIT_S = 0.05
#: The most requests a refused stream reads (and drops).
REFUSAL_REQUESTS_MAX = 16
#: The most refusals reading their client's requests at once (one event loop
#: per service process).
REFUSALS_READING_MAX = 64

_reading = 0


class StreamLimitError(InvalidRequestError):
    """Opening one more stream would pass a named limit (a broker's Fetch
    streams, a gateway's streams, a principal's streams on any service).

    Its wire code is INVALID_REQUEST, as for the coordinator's other limits
    (a full group): the SDK raises InvalidRequestError, not retriable, so a
    client over the limit is told so instead of reconnecting for ever. Its
    status stays RESOURCE_EXHAUSTED, gRPC's status for a spent server
    resource (a per-user quota too), for clients that read only that.
    Refuse with `refuse_stream_with`, which sends both."""

    grpc_status = grpc.StatusCode.RESOURCE_EXHAUSTED


async def refuse_stream(
    request_iterator: AsyncIterator[Any],
    context: grpc.aio.ServicerContext,
    code: grpc.StatusCode,
    details: str,
    trailing_metadata: tuple[tuple[str, str], ...] = (),
) -> NoReturn:
    """End the streaming call with `code` and `details` once the client has
    stopped writing (see the module doc for the bounds)."""
    global _reading
    if _reading < REFUSALS_READING_MAX:
        _reading += 1
        try:
            await _read_until_quiet(aiter(request_iterator))
        finally:
            _reading -= 1
    await context.abort(code, details, trailing_metadata=trailing_metadata)
    raise AssertionError("context.abort returns only by raising")  # pragma: no cover


async def _read_until_quiet(requests: AsyncIterator[Any]) -> None:
    """Read and drop `requests` within the module doc's bounds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REFUSAL_READ_S
    wait_s = REFUSAL_READ_S
    # Whatever the client sent (or its half-close, or an error in reading
    # it), the answer is the refusal.
    with contextlib.suppress(Exception):
        for _ in range(REFUSAL_REQUESTS_MAX):
            async with asyncio.timeout(min(wait_s, deadline - loop.time())):
                await anext(requests)
            wait_s = NEXT_REQUEST_WAIT_S


async def refuse_stream_with(
    request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext, error: TidelogError
) -> NoReturn:
    """`refuse_stream` with a typed error: its status, message and, in the
    trailing metadata, its ErrorCode (which the SDK turns back into it)."""
    await refuse_stream(
        request_iterator,
        context,
        error.grpc_status,
        error.message,
        trailing_metadata=((ERROR_CODE_METADATA_KEY, error.code_name),),
    )
