"""Channels a service opens to its peers, and calls to the first coordinator
replica that answers.

- `ChannelPool`: one grpc.aio channel per address, opened on first use and
  reused (a channel multiplexes every call to its peer), all closed by
  `close` when the service stops. A channel nobody closes keeps its sockets
  and its polling until the process ends.
- `CoordinatorForwarding`: calls a coordinator replica through the pool,
  trying the replicas in turn while they are UNAVAILABLE or cancel the call
  (tidelog.errors.is_server_cancelled: too many calls waiting for that
  replica, or it is stopping). Any other failure is the coordinator's answer
  and is raised as is (the caller passes it on unchanged); with no replica
  answering, CoordinatorNotAvailableError (retriable) naming the last
  failure.
- `LOCAL_METADATA_KEY`: set on a DescribeTopics a service (a broker, the
  gateway) sends to a broker: "answer from your own logs" instead of
  forwarding the call again.

Not thread-safe: used from one service's event loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import grpc
import grpc.aio
from tidelog.errors import (
    CoordinatorNotAvailableError,
    is_server_cancelled,
    server_cancelled_error,
)
from tidelog.security import PLAINTEXT, ChannelSecurity

T = TypeVar("T")

#: Invocation metadata key: "answer DescribeTopics from your own logs".
LOCAL_METADATA_KEY = "tidelog-local"


class ChannelPool:
    """One channel per address, closed together (see module doc)."""

    def __init__(self, security: ChannelSecurity = PLAINTEXT) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._security = security

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._security.aio_channel(address)
        return channel

    def addresses(self) -> list[str]:
        """Addresses with an open channel."""
        return sorted(self._channels)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(None)


def unanswered(exc: grpc.aio.AioRpcError, address: str) -> str | None:
    """Why the replica at `address` gave no answer of its own, so that
    another may be asked: it was UNAVAILABLE, or the call was cancelled on
    its side (tidelog.errors.is_server_cancelled: too many calls waiting for
    it, or it is stopping). None when `exc` is the replica's answer."""
    if is_server_cancelled(exc):
        return server_cancelled_error(address).message
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        return f"{address}: {exc.details()}"
    return None


class CoordinatorForwarding:
    """Calls to coordinator replicas over a shared ChannelPool."""

    def __init__(self, pool: ChannelPool, addresses: Callable[[], Iterable[str]]) -> None:
        self.pool = pool
        #: The live coordinator replicas' addresses, in the order to try them.
        self._addresses = addresses

    async def call(self, invoke: Callable[[grpc.aio.Channel], Awaitable[T]], what: str) -> T:
        """`invoke(channel)` on the first replica that answers (neither
        UNAVAILABLE nor cancelled on its side).

        Raises that replica's AioRpcError when it fails otherwise, and
        CoordinatorNotAvailableError naming the last failure when none answers.
        """
        last = "no coordinator is registered in etcd"
        for address in self._addresses():
            try:
                return await invoke(self.pool.channel(address))
            except grpc.aio.AioRpcError as exc:
                reason = unanswered(exc, address)
                if reason is None:
                    raise
                last = reason
        raise CoordinatorNotAvailableError(f"cannot forward {what} to a coordinator: {last}")
