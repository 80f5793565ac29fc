"""Streams opened over a limit, many times, as a client that writes at once.

`refusals(open_stream, first, tries)` opens `tries` streams, `CONCURRENT_TRIES`
at a time, with a raw grpc.aio client that writes `first` as soon as the call
starts and then keeps the stream open (as the SDK's streams do), and counts
how each ended: `(status code name, details)`. A server that ends such a
stream before reading it loses the race to the write now and then, and the
client sees INTERNAL ("Failed execute_batch") instead of the refusal: on the
old code 5 to 45 tries in a hundred did (3 to 6 when tried one at a time),
so a test that wants every refusal to carry its status loops a few hundred
times.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

#: Each try waits out the server's short read of the refused stream
#: (tidelog_server.stream_refusal); a generous bound per try.
TRY_TIMEOUT_S = 30.0
#: Tries under way at once: the waits overlap.
CONCURRENT_TRIES = 8


async def refusals(
    open_stream: Callable[[AsyncIterator[Any]], Any], first: Any, tries: int
) -> collections.Counter[tuple[str, str]]:
    """How `tries` streams opened with `open_stream(requests)` ended, each
    written `first` at once; a stream the server answered counts as
    ("answered", "")."""
    ends: collections.Counter[tuple[str, str]] = collections.Counter()
    slots = asyncio.Semaphore(CONCURRENT_TRIES)

    async def one_try() -> None:
        requests: asyncio.Queue[Any] = asyncio.Queue()
        requests.put_nowait(first)

        async def written() -> AsyncIterator[Any]:
            while (request := await requests.get()) is not None:
                yield request

        async with slots:
            call = open_stream(written())
            try:
                async with asyncio.timeout(TRY_TIMEOUT_S):
                    await call.read()
            except grpc.aio.AioRpcError as exc:
                ends[(exc.code().name, exc.details() or "")] += 1
            else:
                ends[("answered", "")] += 1
            finally:
                call.cancel()
                requests.put_nowait(None)

    await asyncio.gather(*(one_try() for _ in range(tries)))
    return ends
