"""Channels to coordinator replicas, with failover to the next one on UNAVAILABLE.

Any coordinator replica serves Group requests, so a client keeps one channel
to one replica and moves to the next address when that one stops answering.
After every address has failed in turn, the list is asked for again
(`rediscover`, DescribeCluster on the bootstrap servers), so a client whose
replicas were all replaced, or that reached the coordinators through a
gateway replica that went away, finds the live ones.
Not thread-safe: one event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import grpc
import grpc.aio

from tidelog.errors import (
    CoordinatorNotAvailableError,
    TidelogError,
    error_from_rpc,
    is_unanswered,
)
from tidelog.security import PLAINTEXT, ChannelSecurity

log = logging.getLogger(__name__)

#: Asks for the coordinator addresses again (None: keep the first list).
Rediscover = Callable[[], Awaitable[list[str]]]

CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    # Notice a dead coordinator within seconds even when no call is active,
    # so the heartbeat stream fails over well within the session timeout.
    ("grpc.keepalive_time_ms", 5_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[str]:
    if isinstance(bootstrap, str):
        bootstrap = bootstrap.split(",")
    addresses = [a.strip() for a in bootstrap if a.strip()]
    if not addresses:
        raise ValueError("no coordinator address given")
    return addresses


class CoordinatorChannels:
    """One live channel at a time, to `addresses[index]`."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        rediscover: Rediscover | None = None,
        security: ChannelSecurity = PLAINTEXT,
    ) -> None:
        self.addresses = parse_bootstrap(bootstrap)
        self._security = security
        self.index = 0
        self._rediscover = rediscover
        self._channel: grpc.aio.Channel | None = None

    @property
    def address(self) -> str:
        return self.addresses[self.index]

    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = self._security.aio_channel(self.address, options=CHANNEL_OPTIONS)
        return self._channel

    async def rotate(self) -> None:
        """Move to the next address (after the current one failed); after
        the last one, ask for the list again."""
        await self.close()
        self.index = (self.index + 1) % len(self.addresses)
        if self.index == 0 and self._rediscover is not None:
            try:
                found = await self._rediscover()
            except Exception as exc:
                log.info("finding the coordinators again failed: %s", exc)
                return
            if found:
                self.addresses = list(found)

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close(None)


def is_unavailable(exc: BaseException) -> bool:
    """Whether a call failed because its coordinator did not answer (try
    another: tidelog.errors.is_unanswered). A call the coordinator's side
    cancelled counts: one it had no room to queue, or
    one still running when it shut down (SIGTERM) after its grace period
    (seen in CI: a commit sent over the unary call to a draining replica
    failed instead of moving on)."""
    return is_unanswered(exc)


def unanswered(exc: grpc.aio.AioRpcError, address: str) -> TidelogError:
    """What a coordinator call that `is_unavailable` failed with, for the
    message of the CoordinatorNotAvailableError raised once no replica
    answered (str() of an AioRpcError is gRPC's multi-line debug dump)."""
    return error_from_rpc(exc, address=address, unavailable=CoordinatorNotAvailableError)
