"""What Fetch streams may make the broker hold: a broker-wide budget of
response bytes not yet delivered, and how many streams may be open.

A consumer's credit says how much it is willing to receive, not how fast it
reads. A response handed to gRPC stays in memory (the message, its
serialized copy, the transport's buffer) until the client reads it, so a
client that grants huge credit and never reads would make the broker hold
one full response per stream, for as many streams as it opens (issue 16,
item 8). Three limits bound that, whatever credit was granted:

- each stream has at most one response in flight: the session produces the
  next one only after gRPC has taken the previous one (the handler's
  generator resumes once the write completed);
- every response reserves its bytes from the broker-wide budget
  (`fetch.buffer.max.bytes`) and its connection's share of it
  (`fetch.buffer.max.bytes.per.connection`) until its write completed; when
  either is spent, the stream waits instead of building responses. A client
  that stops reading thus holds at most its connection's share, and
  consumers on other connections keep being served;
- streams are counted per connection (`fetch.max.streams.per.connection`)
  and per broker (`fetch.max.streams`); one beyond is refused with
  RESOURCE_EXHAUSTED naming the limit, typed INVALID_REQUEST
  (`StreamLimitError`, shared with the other services).

Not thread-safe: lives on the broker's event loop.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from tidelog_server.stream_refusal import StreamLimitError

MIB = 1024 * 1024

#: Largest credit a stream may have outstanding (granted, not yet spent).
#: The SDK grants its fetch buffer (8 MiB by default); credit is a promise
#: the consumer can take the bytes, so a client promising more than this is
#: refused with INVALID_ARGUMENT rather than believed.
MAX_CREDIT_BYTES = 1024 * MIB


@dataclass(frozen=True)
class FetchLimits:
    """The broker's fetch limits (BrokerConfig fields of the same meaning)."""

    #: fetch.buffer.max.bytes: response bytes in flight, all streams together.
    buffer_max_bytes: int = 256 * MIB
    #: fetch.buffer.max.bytes.per.connection: response bytes in flight on one
    #: connection, so that a client that stops reading holds at most this
    #: much and cannot starve the other connections of the broker's budget.
    buffer_max_bytes_per_connection: int = 64 * MIB
    #: fetch.max.streams: Fetch streams open at once on this broker.
    max_streams: int = 4096
    #: fetch.max.streams.per.connection: Fetch streams open on one connection.
    #: Generous: gRPC puts the channels of one process to one address on one
    #: connection, so every consumer of a client process counts here.
    max_streams_per_connection: int = 512
    #: Largest credit outstanding on one stream (MAX_CREDIT_BYTES).
    max_credit_bytes: int = MAX_CREDIT_BYTES


class FetchBudget:
    """The byte budget of responses handed to gRPC and not yet written, for
    the broker and for each connection, and the count of open streams."""

    def __init__(self, limits: FetchLimits) -> None:
        self.limits = limits
        self._in_flight = 0
        self._in_flight_by_peer: Counter[str] = Counter()
        self._released = asyncio.Event()
        self._streams = 0
        self._streams_by_peer: Counter[str] = Counter()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def available(self, peer: str) -> int:
        """Bytes a new response to `peer` may use now (0: wait_released)."""
        limits = self.limits
        return max(
            0,
            min(
                limits.buffer_max_bytes - self._in_flight,
                limits.buffer_max_bytes_per_connection - self._in_flight_by_peer[peer],
            ),
        )

    def reserve(self, peer: str, size: int) -> None:
        """Take `size` bytes for a response about to be handed to gRPC. It may
        pass the budget by less than one batch (a batch is never split)."""
        self._in_flight += size
        self._in_flight_by_peer[peer] += size

    def release(self, peer: str, size: int) -> None:
        self._in_flight -= size
        self._in_flight_by_peer[peer] -= size
        if self._in_flight_by_peer[peer] <= 0:
            del self._in_flight_by_peer[peer]
        # Wake every waiter; each re-reads available() (no lost wake-ups).
        self._released.set()
        self._released = asyncio.Event()

    async def wait_released(self) -> None:
        """Until some bytes come back to the budget."""
        await self._released.wait()

    def open_stream(self, peer: str) -> None:
        """Count one more stream from `peer` (one connection), or raise."""
        limits = self.limits
        if self._streams >= limits.max_streams:
            raise StreamLimitError(
                f"this broker already serves {self._streams} Fetch streams, "
                f"its limit (fetch.max.streams={limits.max_streams}): "
                "close streams or use another broker"
            )
        if self._streams_by_peer[peer] >= limits.max_streams_per_connection:
            raise StreamLimitError(
                f"this connection already has {self._streams_by_peer[peer]} Fetch streams, "
                "its limit (fetch.max.streams.per.connection="
                f"{limits.max_streams_per_connection}): one stream can read many partitions"
            )
        self._streams += 1
        self._streams_by_peer[peer] += 1

    def close_stream(self, peer: str) -> None:
        self._streams -= 1
        self._streams_by_peer[peer] -= 1
        if self._streams_by_peer[peer] <= 0:
            del self._streams_by_peer[peer]
