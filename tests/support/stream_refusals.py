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

`holding_a_fetch_stream(address)` keeps one Fetch stream open (and counted
by the server) for the duration of a block, so that the next stream, an
SDK client's, is the one over a limit of one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
from tidelog.v1 import common_pb2, log_pb2, log_pb2_grpc

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


#: A Fetch of a partition no broker has: answered at once (UNKNOWN_TOPIC_OR_PARTITION),
#: which is what makes a stream open and counted.
HOLDING_FETCH = log_pb2.FetchRequest(
    positions=[log_pb2.FetchPosition(topic="absent", partition=0, fetch_offset=0)],
    credit_bytes=1024 * 1024,
    max_wait_ms=100,
)


@contextlib.contextmanager
def holding_a_fetch_stream(address: str) -> Iterator[None]:
    """One Fetch stream to `address`, open and answered (so counted) for
    the duration of the block, from its own connection."""
    requests: queue.Queue[log_pb2.FetchRequest | None] = queue.Queue()
    requests.put(HOLDING_FETCH)
    with grpc.insecure_channel(address) as channel:
        call = log_pb2_grpc.LogStub(channel).Fetch(iter(requests.get, None), timeout=3600)
        try:
            answer = next(call)
            assert answer.partitions[0].error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
            yield
        finally:
            requests.put(None)
            call.cancel()


@contextlib.asynccontextmanager
async def holding_a_fetch_stream_on(channel: grpc.aio.Channel) -> AsyncIterator[None]:
    """As holding_a_fetch_stream, on `channel`'s connection: the stream a
    per-connection limit of one leaves no room beside."""
    held: asyncio.Queue[log_pb2.FetchRequest | None] = asyncio.Queue()

    async def held_requests() -> AsyncIterator[log_pb2.FetchRequest]:
        while (request := await held.get()) is not None:
            yield request

    call = log_pb2_grpc.LogStub(channel).Fetch(held_requests())
    held.put_nowait(HOLDING_FETCH)
    try:
        answer = await asyncio.wait_for(call.read(), TRY_TIMEOUT_S)
        assert answer.partitions[0].error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
        yield
    finally:
        held.put_nowait(None)
        call.cancel()
