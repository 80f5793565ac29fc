"""Connecting to etcd, and telling "etcd is unreachable" apart from other failures."""

from __future__ import annotations

import aetcd
import aetcd.exceptions
import grpc

#: Per-call deadline: long enough for a loaded etcd, short enough that a
#: replica notices an outage within one session TTL.
ETCD_CALL_TIMEOUT_S = 5

#: gRPC codes that mean "no answer from etcd, try again later". etcd itself
#: answers UNAVAILABLE for its transient states too (no leader, request timed
#: out, leader changed, server stopping).
_UNREACHABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


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
    """True when `exc` means etcd could not be reached or did not answer in time.

    Those are worth retrying (and answer COORDINATOR_NOT_AVAILABLE). Anything
    else etcd answers (an invalid request, a missing lease, a permission
    error, a full database) is an application error: retrying it unchanged
    fails again, so it is reported as one, with its traceback.

    aetcd turns UNAVAILABLE into ConnectionFailedError and DEADLINE_EXCEEDED
    into ConnectionTimeoutError; a watch whose creation got no answer in time
    raises WatchTimeoutError; calls that bypass aetcd's wrappers (the raw
    stubs) raise grpc.aio.AioRpcError, judged by its code.
    """
    if isinstance(
        exc,
        aetcd.exceptions.ConnectionFailedError
        | aetcd.exceptions.ConnectionTimeoutError
        | aetcd.exceptions.WatchTimeoutError,
    ):
        return True
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in _UNREACHABLE_CODES
