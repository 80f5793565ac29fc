"""Small async helpers for the coordinator tests (raw etcd, stubs, waiting)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import aetcd


def etcd_client(endpoint: str) -> aetcd.Client:
    host, _, port = endpoint.rpartition(":")
    return aetcd.Client(
        host=host,
        port=int(port),
        timeout=5,
        options={"grpc.initial_reconnect_backoff_ms": 100, "grpc.max_reconnect_backoff_ms": 500},
    )


async def register_broker(
    client: aetcd.Client, prefix: str, broker_id: int, rack: str = "", ttl_s: int = 30
) -> int:
    """Stand in for a broker: a lease-bound registration key. Returns the lease id."""
    lease = await client.lease(ttl_s)
    value = {"id": broker_id, "host": "127.0.0.1", "port": 9000 + broker_id, "rack": rack}
    await client.put(
        f"{prefix}/brokers/ids/{broker_id}".encode(), json.dumps(value).encode(), lease=lease.id
    )
    return int(lease.id)


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout_s: float, what: str, interval_s: float = 0.05
) -> float:
    """Poll until check() is true; returns the seconds it took."""
    start = time.monotonic()
    while True:
        try:
            if await check():
                return time.monotonic() - start
        except Exception:
            # Services in the middle of a fail-over answer errors for a while.
            pass
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(interval_s)
