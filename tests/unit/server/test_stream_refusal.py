"""tidelog_server.stream_refusal: a refused stream is read briefly before it
ends, and only so many refusals read at once (a flood ends at once), on a
real grpc.aio server and client over loopback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from tidelog_server import stream_refusal

from tests.support.in_process_server import serving

_SERVICE = "test.Refusals"
_METHOD = f"/{_SERVICE}/Refused"
#: Generous bound on what happens at once here (a loaded CI machine).
DEADLINE_S = 30
#: How often the test looks whether the server has started reading.
POLL_S = 0.01


def _identity(data: bytes) -> bytes:
    return data


async def _refused(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
    await stream_refusal.refuse_stream(
        requests, context, grpc.StatusCode.RESOURCE_EXHAUSTED, "over the test's limit"
    )
    yield b""  # pragma: no cover (a generator, as gRPC's stream handlers are)


def _add_refusing_service(server: grpc.aio.Server) -> None:
    handler = grpc.method_handlers_generic_handler(
        _SERVICE,
        {
            "Refused": grpc.stream_stream_rpc_method_handler(
                _refused, request_deserializer=_identity, response_serializer=_identity
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))


@contextlib.asynccontextmanager
async def _refused_method() -> AsyncIterator[Any]:
    """The refusing method of an in-process server, as a client calls it;
    no refusal is left reading after the block."""
    async with (
        serving(_add_refusing_service) as address,
        grpc.aio.insecure_channel(address) as channel,
    ):
        yield channel.stream_stream(
            _METHOD, request_serializer=_identity, response_deserializer=_identity
        )
    assert stream_refusal._reading == 0


async def _end_of(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for _ in call:
            pass
    return raised.value.code()


@pytest.mark.timeout(60)
def test_past_the_reading_limit_a_refusal_ends_its_call_without_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One refusal may read; it waits (for as long as the test runs) for a
    # client that never writes. A second refusal then ends at once, while
    # the first is still reading: it did not wait its turn.
    monkeypatch.setattr(stream_refusal, "REFUSALS_READING_MAX", 1)
    monkeypatch.setattr(stream_refusal, "REFUSAL_READ_S", 600.0)

    async def scenario() -> None:
        async with _refused_method() as method:
            silent: asyncio.Queue[bytes] = asyncio.Queue()

            async def never_writes() -> AsyncIterator[bytes]:
                yield await silent.get()

            reading = method(never_writes())
            reading_end = asyncio.ensure_future(_end_of(reading))
            async with asyncio.timeout(DEADLINE_S):
                while stream_refusal._reading < 1:
                    await asyncio.sleep(POLL_S)
            flooded = method(never_writes())
            assert await asyncio.wait_for(_end_of(flooded), DEADLINE_S) in (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.INTERNAL,  # lost to the client's write (module doc)
            )
            assert not reading_end.done()
            assert stream_refusal._reading == 1
            # The first client cancels: the server's reading ends with its call.
            reading.cancel()
            await asyncio.wait([reading_end])

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_a_refusal_reads_the_clients_requests_then_gives_its_status() -> None:
    async def scenario() -> None:
        async with _refused_method() as method:

            async def writes_three() -> AsyncIterator[bytes]:
                for i in range(3):
                    yield b"request %d" % i

            call = method(writes_three())
            assert await asyncio.wait_for(_end_of(call), DEADLINE_S) is (
                grpc.StatusCode.RESOURCE_EXHAUSTED
            )
            assert await call.details() == "over the test's limit"

    asyncio.run(scenario())
