"""The transport ceiling: what grpc.aio itself moves on this machine, with nothing else.

A minimal grpc.aio server in its own process (``python -m bench.grpc_ceiling --port P``)
with two raw-bytes bidirectional streams (no protobuf, no storage):

- ``Upload``: the client sends messages of a fixed size, pipelined; the server answers each
  with 8 bytes (as the broker answers each produce request);
- ``Download``: the client asks for ``count`` messages of ``size`` bytes (16 bytes: two
  uint64); the server streams them (as the broker streams fetch responses).

Tidelog's produce and consume are measured against it with the same message sizes as their
batches and fetch responses, so "Tidelog / ceiling" says how much of the transport the SDK
and broker leave unused. Records/s of the ceiling = bytes/s / (record bytes + 8), the
columnar framing per record.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import grpc

from bench._processes import Meter, free_port, stop_process, wait_port

SERVICE = "bench.Ceiling"
_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


async def _upload(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
    n = 0
    async for _ in requests:
        n += 1
        yield struct.pack(">Q", n)


async def _download(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
    async for request in requests:
        size, count = struct.unpack(">QQ", request)
        payload = b"\x00" * size
        for _ in range(count):
            yield payload


async def serve(port: int) -> None:
    server = grpc.aio.server(options=_OPTIONS)
    handlers = {
        "Upload": grpc.stream_stream_rpc_method_handler(_upload),
        "Download": grpc.stream_stream_rpc_method_handler(_download),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


@contextmanager
def ceiling_server() -> Iterator[tuple[str, int]]:
    """Start the server process; yields (address, pid); stops it by PID.

    It serves on gRPC's default listener (the bench package imports gRPC before this module
    could choose), not on the services' transport (bench._processes.service_environment):
    the committed baseline's ceiling rows were measured so. Bare-gRPC A/B on a loaded
    machine (2026-11-27): with the services' transport the upload ceiling was 6.1M against
    5.0-5.7M records/s, the download ceiling 11-12M against 19-28M."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.grpc_ceiling", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc)
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        stop_process(proc)


async def _client_upload(address: str, size: int, count: int) -> None:
    payload = b"\x01" * size
    async with grpc.aio.insecure_channel(address, options=_OPTIONS) as channel:
        call = channel.stream_stream(f"/{SERVICE}/Upload")()  # type: ignore[call-arg]

        async def send() -> None:
            for _ in range(count):
                await call.write(payload)
            await call.done_writing()

        writer = asyncio.ensure_future(send())
        acked = 0
        async for _ in call:
            acked += 1
        await writer
        assert acked == count, (acked, count)


async def _client_download(address: str, size: int, count: int) -> None:
    async with grpc.aio.insecure_channel(address, options=_OPTIONS) as channel:
        call = channel.stream_stream(f"/{SERVICE}/Download")()  # type: ignore[call-arg]
        await call.write(struct.pack(">QQ", size, count))
        got = 0
        async for message in call:
            got += len(message)
            if got >= size * count:
                break
        call.cancel()


_LOOP: asyncio.AbstractEventLoop | None = None


def _client_loop() -> asyncio.AbstractEventLoop:
    """One event loop for every client call of this process, never closed: grpc.aio's
    poller keeps a reference to the loop it first ran on."""
    global _LOOP
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
    return _LOOP


def measure(
    address: str, pid: int, direction: str, message_bytes: int, total_bytes: int
) -> dict[str, float | None]:
    """Move `total_bytes` in messages of `message_bytes`; returns bytes/s and the meter."""
    count = max(1, total_bytes // message_bytes)
    fn = _client_upload if direction == "upload" else _client_download
    loop = _client_loop()
    loop.run_until_complete(fn(address, message_bytes, min(count, 4)))  # warm up
    meter = Meter(pid)
    loop.run_until_complete(fn(address, message_bytes, count))
    m = meter.done()
    wall = m["wall_s"] or 1e-9
    return {**m, "bytes_per_s": message_bytes * count / wall, "bytes": message_bytes * count}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    asyncio.run(serve(ap.parse_args().port))


if __name__ == "__main__":
    main()
