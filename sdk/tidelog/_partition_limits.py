"""What a client has learned of each server's limits on the partitions one
request may name and one Fetch stream may read, and the requests it splits
by the first.

A broker sets no such limit. The gateway sets one (--max-partitions-per-request,
10,000 by default, as MAX_FETCH_PARTITIONS_PER_REQUEST) for a Produce request,
one FetchRequest of a Fetch stream and a ListOffsets request, and says so
(tidelog.errors.MAX_PARTITIONS_METADATA_KEY, decimal digits):

- up front, in the initial metadata of every Produce and Fetch stream it
  accepts, sent before it reads the first request. The SDK reads it in the
  stream's reader task, so learning it adds neither a round trip nor a wait
  to sending: requests written before it arrives go out as before;
- in the trailing metadata of a refusal (INVALID_ARGUMENT, in words too:
  "... over the limit of N (--max-partitions-per-request)"). The gateway
  refuses such a request whole before any of it is forwarded (a Produce
  stream answers the requests before it and reads none after it; a Fetch
  stream ends), so the SDK sends it again, split, and nothing is written or
  placed twice. It is the only way to learn the limit of a unary call
  (ListOffsets), and it covers requests written before the initial metadata
  arrived.

Both are needed: a stream's first requests leave before its initial metadata
can arrive (waiting for it would cost a round trip per stream, and a broker
sends none until its first answer, a long poll away), and a refusal's status
can be lost (grpc.aio reports INTERNAL when a write races the end of the call,
tidelog.errors.is_status_lost), while the initial metadata of the same call
has already arrived. A server that sends neither (a broker, an older gateway)
leaves the SDK as it was: MAX_FETCH_PARTITIONS_PER_REQUEST.

What a server sends is not trusted: a value that is not decimal digits is
ignored, and one outside [1, MAX_FETCH_PARTITIONS_PER_REQUEST] is clamped into
it, so that no answer can make the SDK send empty requests, divide by zero or
split into more requests than partitions. A refusal is taken as "split and
send again" only when the request named more partitions than the limit the
refusal names (`refused_for_size`): a server that refuses a request already
within the limit it names is answered as any refusal, so it cannot make the
SDK send the same request for ever.

The gateway also limits how many partitions one Fetch stream may read at once
(--max-partitions-per-fetch) and names that limit the same two ways, under
tidelog.errors.MAX_PARTITIONS_PER_FETCH_METADATA_KEY: in the initial metadata
of every Fetch stream, and in the trailing metadata of its refusal (a
request that would take the stream over it ends the stream, none of it
applied). The SDK's fetcher reads the partitions it is assigned through such
a server on several streams of at most that many each (tidelog._fetcher);
a server that names nothing leaves it reading them all on one stream. The
same distrust applies: anything but decimal digits is ignored, a value
below 1 counts as 1, and a refusal is taken as "spread and place again"
only when the stream read, or was asked to read, more partitions than the
limit the server names (`refused_for_streams`).

Not thread-safe: used on the client's event loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tidelog.errors import (
    MAX_PARTITIONS_METADATA_KEY,
    MAX_PARTITIONS_PER_FETCH_METADATA_KEY,
    InvalidRequestError,
    TidelogError,
)
from tidelog.request_limits import MAX_FETCH_PARTITIONS_PER_REQUEST

#: Longest value read: MAX_FETCH_PARTITIONS_PER_REQUEST has 5 digits; more
#: is clamped anyway, and a long string is not worth converting.
_MAX_DIGITS = 12


def limit_in(
    metadata: Iterable[tuple[str, Any]] | None,
    name: str = MAX_PARTITIONS_METADATA_KEY,
    most: int = MAX_FETCH_PARTITIONS_PER_REQUEST,
) -> int | None:
    """The limit `metadata` names under the key `name`, clamped to [1, most];
    None when it names none, or not as decimal digits (then the last valid
    one, if several)."""
    found: int | None = None
    for key, value in metadata or ():
        if key != name:
            continue
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        if not isinstance(value, str):
            continue
        text = value.strip()
        sign = -1 if text.startswith("-") else 1
        digits = text[1:] if sign < 0 else text
        if not digits.isascii() or not digits.isdigit() or len(digits) > _MAX_DIGITS:
            continue
        found = min(max(sign * int(digits), 1), most)
    return found


def stream_limit_in(metadata: Iterable[tuple[str, Any]] | None) -> int | None:
    """The limit on partitions per Fetch stream `metadata` names under
    MAX_PARTITIONS_PER_FETCH_METADATA_KEY, at least 1; None when it names
    none, or not as decimal digits. No upper clamp is needed: a larger
    limit only means fewer streams (12 digits at most are read)."""
    return limit_in(metadata, MAX_PARTITIONS_PER_FETCH_METADATA_KEY, 10**_MAX_DIGITS)


class PartitionLimits:
    """Per server address, the most partitions one request to it may name."""

    def __init__(self) -> None:
        self._by_address: dict[str, int] = {}
        self._per_stream: dict[str, int] = {}

    def of(self, address: str) -> int:
        """The limit to split requests to `address` by: what it last said,
        else MAX_FETCH_PARTITIONS_PER_REQUEST."""
        return self._by_address.get(address, MAX_FETCH_PARTITIONS_PER_REQUEST)

    def learn(self, address: str, metadata: Iterable[tuple[str, Any]] | None) -> None:
        """Take the limit `metadata` (a stream's initial metadata, or a
        call's trailing metadata) names, if any: the server's word replaces
        the last one (an operator may raise the limit too)."""
        metadata = list(metadata or ())
        limit = limit_in(metadata)
        if limit is not None:
            self._by_address[address] = limit
        per_stream = stream_limit_in(metadata)
        if per_stream is not None:
            self._per_stream[address] = per_stream

    def per_stream(self, address: str) -> int | None:
        """The most partitions one Fetch stream to `address` may read at
        once, as it last said; None (no limit) when it never said."""
        return self._per_stream.get(address)

    def learn_from(self, address: str, exc: Any) -> None:
        """`learn` from a failed call's trailing metadata."""
        trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
        self.learn(address, trailing)

    def refused_for_size(self, address: str, error: TidelogError, named: int) -> bool:
        """Whether `error`, a call's refusal, is `address` refusing a request
        of `named` partitions for its limit (learned before, or from the
        refusal itself): sending the same partitions again in requests of at
        most `of(address)` can then succeed."""
        return isinstance(error, InvalidRequestError) and named > self.of(address)

    def refused_for_streams(self, address: str, error: TidelogError, reading: int) -> bool:
        """Whether `error`, the end of a Fetch stream that read (or was asked
        to read) at most `reading` partitions at once, is `address` refusing
        it for its limit on partitions per stream (learned before, or from
        the refusal itself): the same partitions spread over streams of at
        most `per_stream(address)` can then be read."""
        limit = self.per_stream(address)
        return isinstance(error, InvalidRequestError) and limit is not None and reading > limit
