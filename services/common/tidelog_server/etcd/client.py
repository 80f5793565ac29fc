"""Connecting to etcd, and telling "etcd is unreachable" apart from other failures."""

from __future__ import annotations

import aetcd
import aetcd.exceptions
import grpc

#: Per-call deadline: long enough for a loaded etcd, short enough that a
#: replica notices an outage within one session TTL.
ETCD_CALL_TIMEOUT_S = 5


class EtcdUnavailableError(Exception):
    """etcd could not be reached; retry later (mapped to COORDINATOR_NOT_AVAILABLE)."""


def connect(endpoint: str) -> aetcd.Client:
    """An aetcd client for `host:port` (lazy: connects on first use)."""
    host, _, port = endpoint.rpartition(":")
    return aetcd.Client(
        host=host or "127.0.0.1",
        port=int(port),
        timeout=ETCD_CALL_TIMEOUT_S,
        options={
            # Reconnect within ~0.5 s of etcd coming back, instead of gRPC's
            # default backoff that grows to two minutes: sessions (leases of a
            # few seconds) must be refreshed soon after an etcd restart.
            "grpc.initial_reconnect_backoff_ms": 100,
            "grpc.max_reconnect_backoff_ms": 500,
            "grpc.keepalive_time_ms": 10_000,
        },
    )


def is_unavailable(exc: BaseException) -> bool:
    """True when `exc` means etcd could not be reached or timed out."""
    return isinstance(
        exc,
        aetcd.exceptions.ConnectionFailedError
        | aetcd.exceptions.ConnectionTimeoutError
        | grpc.aio.AioRpcError
        | TimeoutError
        | EtcdUnavailableError,
    )
