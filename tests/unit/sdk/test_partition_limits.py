"""What the SDK takes of a server's limit on partitions per request
(tidelog._partition_limits): values clamped to [1, MAX_FETCH_PARTITIONS_PER_REQUEST],
garbage ignored; and, against an in-process stand-in server over real gRPC on
loopback that names a limit (in a Fetch stream's initial metadata, or in the
trailing metadata of its refusal), a consumer's placements split by it, or
refused for good when the server refuses a request within the limit it names
(no loop)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial

import grpc
import grpc.aio
import pytest
from tidelog import AsyncConsumer, TopicPartition
from tidelog._partition_limits import PartitionLimits, limit_in
from tidelog.errors import (
    ERROR_CODE_METADATA_KEY,
    MAX_PARTITIONS_METADATA_KEY,
    InvalidRequestError,
)
from tidelog.request_limits import MAX_FETCH_PARTITIONS_PER_REQUEST
from tidelog.v1 import log_pb2, log_pb2_grpc

from tests.support.in_process_server import led_by_one_broker, serving

pytestmark = pytest.mark.timeout(120)

TOPIC = "limited"
PARTITIONS = 40
PARTITION_LIST = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
#: Generous: the stand-in answers at once; this only bounds a broken test.
DEADLINE_S = 60.0
KEY = MAX_PARTITIONS_METADATA_KEY


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("50", 50),
        (" 7 ", 7),
        (b"30", 30),
        ("0", 1),
        ("-5", 1),
        ("-0", 1),
        ("99999999999", MAX_FETCH_PARTITIONS_PER_REQUEST),
        ("9" * 100, None),
        ("", None),
        ("abc", None),
        ("5x", None),
        ("+5", None),
        ("1e3", None),
        ("\uff11\uff12", None),  # digits, but not ASCII ones (fullwidth)
        ("nan", None),
    ],
)
def test_a_named_limit_is_clamped_and_garbage_ignored(
    value: str | bytes, expected: int | None
) -> None:
    assert limit_in([(KEY, value)]) == expected


def test_other_keys_and_no_metadata_name_no_limit() -> None:
    assert limit_in(None) is None
    assert limit_in([]) is None
    assert limit_in([("tidelog-error-code", "7"), ("x", "3")]) is None
    # The last valid value wins; an invalid one does not undo it.
    assert limit_in([(KEY, "3"), (KEY, "junk"), (KEY, "9")]) == 9


def test_limits_are_per_address_and_default_to_the_sdks() -> None:
    limits = PartitionLimits()
    assert limits.of("a:1") == MAX_FETCH_PARTITIONS_PER_REQUEST
    limits.learn("a:1", [(KEY, "50")])
    limits.learn("a:1", [(KEY, "garbage")])  # ignored: keeps 50
    limits.learn("b:1", [(KEY, "0")])
    assert (limits.of("a:1"), limits.of("b:1"), limits.of("c:1")) == (50, 1, 10_000)
    # A later word replaces an earlier one (the operator raised the limit).
    limits.learn("a:1", [(KEY, "200")])
    assert limits.of("a:1") == 200
    refusal = InvalidRequestError("over the limit")
    assert limits.refused_for_size("a:1", refusal, 201)
    # A refusal of a request within the limit is not about its size.
    assert not limits.refused_for_size("a:1", refusal, 200)
    assert not limits.refused_for_size("a:1", InvalidRequestError("x"), 3)


@dataclass
class LimitedServer(log_pb2_grpc.LogServicer):
    """One server leading every partition of TOPIC whose Fetch stream names
    `advertised` in its initial metadata (None: nothing) and refuses a
    request of more than `refuse_over` partitions, ending the stream
    INVALID_ARGUMENT with `in_refusal` in the trailing metadata (None:
    nothing), as a gateway does. Records every request's partition count."""

    advertised: str | None = None
    refuse_over: int = MAX_FETCH_PARTITIONS_PER_REQUEST
    in_refusal: str | None = None
    port: int = 0
    #: (stream number, positions, removals) of every request received.
    requests: list[tuple[int, int, int]] = field(default_factory=list)
    streams: int = 0
    placed: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def Metadata(
        self, request: log_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.MetadataResponse:
        return led_by_one_broker(self.port, {TOPIC: PARTITIONS})

    async def Fetch(
        self,
        request_iterator: AsyncIterator[log_pb2.FetchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[log_pb2.FetchResponse]:
        with self._lock:
            self.streams += 1
            stream = self.streams
        if self.advertised is not None:
            await context.send_initial_metadata(((KEY, self.advertised),))
        async for request in request_iterator:
            named = len(request.positions) + len(request.remove)
            with self._lock:
                self.requests.append((stream, len(request.positions), len(request.remove)))
            if named > self.refuse_over:
                trailing = [(ERROR_CODE_METADATA_KEY, "INVALID_REQUEST")]
                if self.in_refusal is not None:
                    trailing.append((KEY, self.in_refusal))
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"a fetch request names {named} partitions, over the limit of "
                    f"{self.refuse_over} (--max-partitions-per-request)",
                    trailing_metadata=tuple(trailing),
                )
            with self._lock:
                self.placed.update(p.partition for p in request.positions)
        if False:  # pragma: no cover - an async generator that yields nothing
            yield log_pb2.FetchResponse()

    def placed_now(self) -> set[int]:
        with self._lock:
            return set(self.placed)

    def placing(self) -> list[tuple[int, int, int]]:
        with self._lock:
            return [r for r in self.requests if r[1] or r[2]]


async def place_every_partition(server: LimitedServer) -> BaseException | None:
    """A consumer seeks every partition at once; returns once the server has
    them all placed (None), or what the consumer raised."""
    async with serving(partial(log_pb2_grpc.add_LogServicer_to_server, server)) as address:
        server.port = int(address.rsplit(":", 1)[1])
        async with AsyncConsumer(bootstrap_servers=address, retry_backoff_ms=20) as consumer:
            consumer.assign(PARTITION_LIST)
            for tp in PARTITION_LIST:
                consumer.seek(tp, 0)
            deadline = time.monotonic() + DEADLINE_S
            while server.placed_now() != set(range(PARTITIONS)):
                if time.monotonic() > deadline:
                    raise AssertionError("the partitions were not all placed")
                try:
                    await consumer.getmany(timeout_ms=50)
                except InvalidRequestError as exc:
                    return exc
    return None


@pytest.mark.parametrize(
    ("advertised", "refuse_over", "in_refusal", "split"),
    [
        # Named up front, the first request too large: refused, then split.
        ("7", 7, "7", 7),
        # Named only in the refusal (the status of a unary call, say).
        (None, 7, "7", 7),
        # Named up front only (the refusal's status lost, say).
        ("7", 7, None, 7),
        # 0 or a negative: one partition per request, never an empty one.
        ("0", 1, "0", 1),
        ("-3", 1, "-3", 1),
    ],
)
def test_placements_split_by_the_limit_the_server_names(
    advertised: str | None, refuse_over: int, in_refusal: str | None, split: int
) -> None:
    server = LimitedServer(advertised, refuse_over, in_refusal)
    assert asyncio.run(place_every_partition(server)) is None
    refused = [r for r in server.placing() if r[1] + r[2] > refuse_over]
    # Only requests written before the limit could be known were too large:
    # those of the first stream.
    assert {stream for stream, _, _ in refused} <= {1}
    later = [r for r in server.placing() if r[0] > 1 or r not in refused]
    assert later and all(1 <= positions + removed <= split for _, positions, removed in later)


def test_garbage_or_a_huge_value_leaves_the_sdk_as_it_was() -> None:
    for advertised in ("junk", "99999999999999999999", ""):
        server = LimitedServer(advertised)
        assert asyncio.run(place_every_partition(server)) is None
        # One stream, every partition in one request, as against a broker.
        assert server.streams == 1
        assert server.placing() == [(1, PARTITIONS, 0)]


def test_a_server_refusing_requests_within_the_limit_it_names_is_not_asked_for_ever() -> None:
    # Says 10,000 but refuses more than 5: the SDK cannot split its way out
    # (sending the same request again would be refused again), so the
    # refusal reaches the application, as any refusal of a fetch stream.
    server = LimitedServer(str(MAX_FETCH_PARTITIONS_PER_REQUEST), 5, "10000")
    raised = asyncio.run(place_every_partition(server))
    assert isinstance(raised, InvalidRequestError), raised
    assert "over the limit of 5" in str(raised)
    assert server.streams == 1
