"""The gateway's gRPC channels to brokers and coordinators.

Every client stream the gateway proxies opens its own calls on these shared
channels (gRPC multiplexes calls on a connection). A broker limits the Fetch
streams of one connection (fetch.max.streams.per.connection) because it
expects one client process behind it, but the gateway's streams belong to
many clients: so the streams to one address are spread round-robin over
`connections_per_address` channels, each on a TCP connection of its own.
Unary calls use the first. Channels live as long as the gateway; those to
an address that left the cluster cost idle connections until `close`.

Not thread-safe: one event loop.
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio
from tidelog.security import PLAINTEXT, ChannelSecurity
from tidelog.v1 import admin_pb2_grpc, cluster_pb2_grpc, group_pb2_grpc, log_pb2_grpc


class Channels:
    """One grpc.aio channel per upstream address."""

    def __init__(
        self,
        max_message_bytes: int,
        connections_per_address: int = 4,
        security: ChannelSecurity = PLAINTEXT,
    ) -> None:
        self._connections = max(1, connections_per_address)
        self._security = security
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
            # A connection per channel, not one shared by every channel to
            # the same address.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        self._channels: dict[str, list[grpc.aio.Channel]] = {}
        self._next: dict[str, int] = {}

    def channel(self, address: str, index: int = 0) -> grpc.aio.Channel:
        channels = self._channels.setdefault(address, [])
        while len(channels) <= index:
            channels.append(self._security.aio_channel(address, options=self._options))
        return channels[index]

    def stream_channel(self, address: str) -> grpc.aio.Channel:
        """A channel for one more stream to `address` (round-robin)."""
        index = self._next.get(address, 0)
        self._next[address] = (index + 1) % self._connections
        return self.channel(address, index)

    def log_streams(self, address: str) -> Any:
        """The Log stub for a Produce or Fetch stream."""
        return log_pb2_grpc.LogStub(self.stream_channel(address))

    def group_streams(self, address: str) -> Any:
        """The Group stub for a Heartbeat stream."""
        return group_pb2_grpc.GroupStub(self.stream_channel(address))

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
        for pool in channels:
            for channel in pool:
                await channel.close(None)
