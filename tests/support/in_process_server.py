"""A grpc.aio server in the test's own process, on a free loopback port: for
stand-ins of a service (a coordinator that answers as a test needs) and for
testing a server-side helper against a real client.

`async with serving(add, ...) as address:` calls each `add(server)` (the
generated `add_XServicer_to_server` bound to a servicer, or a function that
adds generic handlers) before starting it, and stops it after the block.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import grpc.aio


@contextlib.asynccontextmanager
async def serving(*registrations: Callable[[grpc.aio.Server], None]) -> AsyncIterator[str]:
    """The started server's address ("127.0.0.1:<port>") for the block."""
    server = grpc.aio.server()
    for register in registrations:
        register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)
