"""What clients may make the gateway hold: streams, produce bytes, fetch bytes.

- `StreamCounter`: streaming calls (Produce, Fetch, Heartbeat) open per
  connection and on the whole gateway; one beyond is refused with
  RESOURCE_EXHAUSTED naming the limit, typed INVALID_REQUEST
  (`StreamLimitError`, shared with the other services).
- `ByteBudget`: bytes of produce requests being forwarded, all streams
  together; a stream waits (and so stops reading its client) while the
  budget is spent.
- `FetchBudget`: record bytes the gateway holds for Fetch streams or has
  asked brokers for (credit granted upstream is a promise that the bytes
  may arrive at any time, so it is reserved when granted, not when the bytes
  come). For the gateway and for each connection; a stream whose share is
  spent grants brokers no more credit until bytes are delivered. So the
  gateway's fetch memory is bounded by `fetch_buffer_max_bytes` whatever
  clients grant, and a connection's by its share.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from tidelog_server.stream_refusal import StreamLimitError


class StreamCounter:
    def __init__(self, max_streams: int, max_per_connection: int) -> None:
        self.max_streams = max_streams
        self.max_per_connection = max_per_connection
        self.open = 0
        self._by_peer: Counter[str] = Counter()

    def acquire(self, peer: str) -> None:
        if self.open >= self.max_streams:
            raise StreamLimitError(
                f"the gateway already serves {self.open} streams, its limit "
                f"(--max-streams={self.max_streams}): use another gateway replica"
            )
        if self._by_peer[peer] >= self.max_per_connection:
            raise StreamLimitError(
                f"this connection already has {self._by_peer[peer]} streams open, its limit "
                f"(--max-streams-per-connection={self.max_per_connection}): one Fetch or "
                "Produce stream can carry every partition"
            )
        self.open += 1
        self._by_peer[peer] += 1

    def release(self, peer: str) -> None:
        self.open -= 1
        self._by_peer[peer] -= 1
        if self._by_peer[peer] <= 0:
            del self._by_peer[peer]


class ByteBudget:
    """Bytes in use out of `max_bytes`; a request larger than the whole
    budget is let through alone, so that it cannot wait forever."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.in_use = 0
        self._released = asyncio.Event()

    async def acquire(self, size: int) -> None:
        while self.in_use > 0 and self.in_use + size > self.max_bytes:
            await self._released.wait()
        self.in_use += size

    def release(self, size: int) -> None:
        self.in_use -= size
        self._released.set()
        self._released = asyncio.Event()


class FetchBudget:
    """Fetch bytes reserved by the gateway and by each connection."""

    def __init__(self, max_bytes: int, max_bytes_per_connection: int) -> None:
        self.max_bytes = max_bytes
        self.max_bytes_per_connection = max_bytes_per_connection
        self.reserved = 0
        self._by_peer: Counter[str] = Counter()
        self._released = asyncio.Event()

    def available(self, peer: str) -> int:
        return max(
            0,
            min(
                self.max_bytes - self.reserved,
                self.max_bytes_per_connection - self._by_peer[peer],
            ),
        )

    def reserve(self, peer: str, size: int) -> None:
        """Take `size` bytes; may pass the budget by one batch (a broker
        sends one whole batch larger than the credit left)."""
        self.reserved += size
        self._by_peer[peer] += size

    def release(self, peer: str, size: int) -> None:
        if size <= 0:
            return
        self.reserved -= size
        self._by_peer[peer] -= size
        if self._by_peer[peer] <= 0:
            del self._by_peer[peer]
        self._released.set()
        self._released = asyncio.Event()

    async def wait_released(self) -> None:
        await self._released.wait()
