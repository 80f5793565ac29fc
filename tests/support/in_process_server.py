"""A grpc.aio server in the test's own process, on a free loopback port: for
stand-ins of a service (a coordinator that answers as a test needs) and for
testing a server-side helper against a real client.

`async with serving(add, ...) as address:` calls each `add(server)` (the
generated `add_XServicer_to_server` bound to a servicer, or a function that
adds generic handlers) before starting it, and stops it after the block.

For stand-in brokers: `led_by_one_broker` (a Metadata answer naming one
broker that leads every partition), and `drop_call` (end a call as gRPC
ends one its grpc.aio server had no room to queue).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import grpc
import grpc.aio
from tidelog.v1 import log_pb2


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


def led_by_one_broker(port: int, topics: dict[str, int]) -> log_pb2.MetadataResponse:
    """Metadata naming broker 0 on 127.0.0.1:`port` as the only replica and
    leader of every partition of `topics` (name -> partition count)."""
    return log_pb2.MetadataResponse(
        brokers=[log_pb2.BrokerInfo(broker_id=0, host="127.0.0.1", port=port)],
        topics=[
            log_pb2.TopicMetadata(
                name=name,
                partitions=[
                    log_pb2.PartitionMetadata(partition=p, leader_id=0, replicas=[0], isr=[0])
                    for p in range(count)
                ],
            )
            for name, count in topics.items()
        ],
    )


async def drop_call(context: grpc.aio.ServicerContext) -> None:
    """End the call as gRPC ends one its grpc.aio server had no room to
    queue (past grpc.server.max_pending_requests): CANCELLED, details
    "CANCELLED", no error code. Raises, as context.abort does."""
    await context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")
