"""The gateway's gRPC channels to brokers and coordinators, one per address.

Every client stream the gateway proxies opens its own calls on these shared
channels (gRPC multiplexes them on one connection per address), so a
broker sees one connection from the gateway however many clients it serves.
Channels live as long as the gateway; one to an address that left the
cluster costs an idle connection until `close`.

Not thread-safe: one event loop.
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio
from tidelog.v1 import admin_pb2_grpc, cluster_pb2_grpc, group_pb2_grpc, log_pb2_grpc


class Channels:
    """One grpc.aio channel per upstream address."""

    def __init__(self, max_message_bytes: int) -> None:
        self._options: list[tuple[str, int | str]] = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            # Notice a dead broker or coordinator within seconds even while
            # no call is active, and reconnect quickly once it is back.
            ("grpc.keepalive_time_ms", 5_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1_000),
            ("grpc.http2.max_frame_size", 1024 * 1024 - 1),
        ]
        self._channels: dict[str, grpc.aio.Channel] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(
                address, options=self._options
            )
        return channel

    # Typed Any: the generated .pyi describe the synchronous API, while these
    # run on grpc.aio channels (awaitables, stream calls with read/write).
    def log(self, address: str) -> Any:
        return log_pb2_grpc.LogStub(self.channel(address))

    def admin(self, address: str) -> Any:
        return admin_pb2_grpc.AdminStub(self.channel(address))

    def group(self, address: str) -> Any:
        return group_pb2_grpc.GroupStub(self.channel(address))

    def cluster(self, address: str) -> Any:
        return cluster_pb2_grpc.ClusterStub(self.channel(address))

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(None)
