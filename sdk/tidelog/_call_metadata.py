"""Metadata every call of a client carries: its client id.

Servers count quotas per (principal, client id) and read the id from the
`tidelog-client-id` metadata key (tidelog_server.auth). gRPC has no channel
option for metadata sent with every call, call credentials go over TLS only,
and an aio interceptor on a streaming call routes each written message
through a queue and a task (the producer's hot path). So the channel is
wrapped instead: each method the stubs take from it adds the metadata when
it is called, once per call (a stream's messages cost nothing more).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

#: The key the servers read (tidelog_server.auth.CLIENT_ID_METADATA_KEY).
CLIENT_ID_METADATA_KEY = "tidelog-client-id"
#: Longer ids are cut by the servers; refused here, naming the limit.
MAX_CLIENT_ID_CHARS = 255

Metadata = tuple[tuple[str, str], ...]


def check_client_id(client_id: str) -> str:
    """A client id gRPC can carry as metadata (ValueError naming the rule)."""
    if len(client_id) > MAX_CLIENT_ID_CHARS:
        raise ValueError(f"client_id is {len(client_id)} characters; at most {MAX_CLIENT_ID_CHARS}")
    if not all(" " <= char <= "~" for char in client_id):
        raise ValueError(f"client_id must be printable ASCII, got {client_id!r}")
    return client_id


class _AddMetadata:
    """A stub method (multi-callable) whose calls carry `metadata` too."""

    __slots__ = ("_call", "_metadata")

    def __init__(self, call: Any, metadata: Metadata) -> None:
        self._call = call
        self._metadata = metadata

    def __call__(
        self, *args: Any, metadata: Sequence[tuple[str, str]] | None = None, **kw: Any
    ) -> Any:
        merged = self._metadata if metadata is None else (*tuple(metadata), *self._metadata)
        return self._call(*args, metadata=merged, **kw)


class MetadataChannel(grpc.aio.Channel):
    """A grpc.aio channel whose every call carries `metadata`."""

    def __init__(self, channel: grpc.aio.Channel, metadata: Metadata) -> None:
        self._channel = channel
        self._metadata = metadata

    async def __aenter__(self) -> MetadataChannel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._channel.close(None)

    async def close(self, grace: float | None = None) -> None:
        await self._channel.close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._channel.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._channel.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._channel.channel_ready()

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _AddMetadata(self._channel.unary_unary(*args, **kwargs), self._metadata)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _AddMetadata(self._channel.unary_stream(*args, **kwargs), self._metadata)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _AddMetadata(self._channel.stream_unary(*args, **kwargs), self._metadata)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _AddMetadata(self._channel.stream_stream(*args, **kwargs), self._metadata)
