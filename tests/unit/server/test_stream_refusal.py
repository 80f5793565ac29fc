"""tidelog_server.stream_refusal: a refused stream is read briefly before it
ends, and only so many refusals read at once (a flood ends at once), on a
real grpc.aio server and client over loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from tidelog_server import stream_refusal

_METHOD = "/test.Refusals/Refused"


def _identity(data: bytes) -> bytes:
    return data


async def _refused(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
    await stream_refusal.refuse_stream(
        requests, context, grpc.StatusCode.RESOURCE_EXHAUSTED, "over the test's limit"
    )
    yield b""  # pragma: no cover (a generator, as gRPC's stream handlers are)


async def _serve() -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "test.Refusals",
        {
            "Refused": grpc.stream_stream_rpc_method_handler(
                _refused, request_deserializer=_identity, response_serializer=_identity
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


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
        server, port = await _serve()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                method = channel.stream_stream(
                    _METHOD, request_serializer=_identity, response_deserializer=_identity
                )
                silent: asyncio.Queue[bytes] = asyncio.Queue()

                async def never_writes() -> AsyncIterator[bytes]:
                    yield await silent.get()

                reading = method(never_writes())
                reading_end = asyncio.ensure_future(_end_of(reading))
                async with asyncio.timeout(30):
                    while stream_refusal._reading < 1:
                        await asyncio.sleep(0.01)
                flooded = method(never_writes())
                assert await asyncio.wait_for(_end_of(flooded), 30) in (
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    grpc.StatusCode.INTERNAL,  # lost to the client's write (module doc)
                )
                assert not reading_end.done()
                assert stream_refusal._reading == 1
                # The first client half-closes: its refusal comes now, with its status.
                reading.cancel()
                await asyncio.wait([reading_end])
        finally:
            await server.stop(None)
        assert stream_refusal._reading == 0

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_a_refusal_reads_the_clients_requests_then_gives_its_status() -> None:
    async def scenario() -> None:
        server, port = await _serve()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                method = channel.stream_stream(
                    _METHOD, request_serializer=_identity, response_deserializer=_identity
                )

                async def writes_three() -> AsyncIterator[bytes]:
                    for i in range(3):
                        yield b"request %d" % i

                call = method(writes_three())
                assert await asyncio.wait_for(_end_of(call), 30) is (
                    grpc.StatusCode.RESOURCE_EXHAUSTED
                )
                assert await call.details() == "over the test's limit"
        finally:
            await server.stop(None)
        assert stream_refusal._reading == 0

    asyncio.run(scenario())
