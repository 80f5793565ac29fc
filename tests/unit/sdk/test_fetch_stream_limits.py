"""What the SDK takes of a server's limit on partitions per Fetch stream
(tidelog._partition_limits, `tidelog-max-partitions-per-fetch`): values of
at least 1, garbage ignored; and, against an in-process stand-in server over
real gRPC on loopback that names a limit (in a Fetch stream's initial
metadata, or in the trailing metadata of its refusal) and ends a stream that
would read more partitions than it, a consumer's partitions spread over
streams within it, at most MAX_FETCH_STREAMS_PER_SERVER of them, or its
refusal raised when the server refuses a stream within the limit it names
(no loop)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial

import grpc
import grpc.aio
import pytest
from tidelog import AsyncConsumer, TopicPartition
from tidelog._fetcher import MAX_FETCH_STREAMS_PER_SERVER
from tidelog._partition_limits import PartitionLimits, stream_limit_in
from tidelog.errors import (
    ERROR_CODE_METADATA_KEY,
    MAX_PARTITIONS_METADATA_KEY,
    MAX_PARTITIONS_PER_FETCH_METADATA_KEY,
    InvalidRequestError,
)
from tidelog.v1 import log_pb2, log_pb2_grpc

from tests.support.in_process_server import led_by_one_broker, serving

pytestmark = pytest.mark.timeout(120)

TOPIC = "spread"
PARTITIONS = 40
#: Generous: the stand-in answers at once; this only bounds a broken test.
DEADLINE_S = 60.0
KEY = MAX_PARTITIONS_PER_FETCH_METADATA_KEY
#: A limit no request or stream of these tests reaches.
UNLIMITED = 10**6


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("20", 20),
        (" 7 ", 7),
        (b"30", 30),
        ("0", 1),
        ("-5", 1),
        ("99999999999", 99999999999),
        ("9" * 100, None),
        ("", None),
        ("abc", None),
        ("5x", None),
        ("+5", None),
        ("1e3", None),
        ("\uff11\uff12", None),  # digits, but not ASCII ones (fullwidth)
    ],
)
def test_a_named_stream_limit_is_at_least_one_and_garbage_ignored(
    value: str | bytes, expected: int | None
) -> None:
    assert stream_limit_in([(KEY, value)]) == expected


def test_the_two_limits_are_told_apart_and_kept_per_address() -> None:
    limits = PartitionLimits()
    assert limits.per_stream("a:1") is None
    limits.learn("a:1", [(KEY, "20"), (MAX_PARTITIONS_METADATA_KEY, "50")])
    limits.learn("a:1", [(KEY, "junk")])  # ignored: keeps 20
    limits.learn("b:1", [(MAX_PARTITIONS_METADATA_KEY, "5")])
    assert (limits.per_stream("a:1"), limits.of("a:1")) == (20, 50)
    assert (limits.per_stream("b:1"), limits.of("b:1")) == (None, 5)
    refusal = InvalidRequestError("over the limit")
    assert limits.refused_for_streams("a:1", refusal, 21)
    # Within the limit it names, or no limit named: not about the stream's size.
    assert not limits.refused_for_streams("a:1", refusal, 20)
    assert not limits.refused_for_streams("b:1", refusal, 10_000)


@dataclass
class StreamLimitedServer(log_pb2_grpc.LogServicer):
    """One server leading every partition of TOPIC (`partitions` of them)
    whose Fetch stream names `advertised` in its initial metadata (None:
    nothing) and, as a gateway does, ends a stream that a request would
    leave reading more than `refuse_over` partitions (INVALID_ARGUMENT,
    `in_refusal` in the trailing metadata; None: nothing) before applying
    it. Records which partitions each stream reads."""

    advertised: str | None = None
    refuse_over: int = UNLIMITED
    in_refusal: str | None = None
    partitions: int = PARTITIONS
    port: int = 0
    #: Stream number -> the partitions it reads now.
    reading: dict[int, set[int]] = field(default_factory=dict)
    #: Stream number -> the most partitions it read at once.
    most: dict[int, int] = field(default_factory=dict)
    refused: list[int] = field(default_factory=list)
    #: Streams not ended yet.
    open: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def Metadata(
        self, request: log_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.MetadataResponse:
        return led_by_one_broker(self.port, {TOPIC: self.partitions})

    async def Fetch(
        self,
        request_iterator: AsyncIterator[log_pb2.FetchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[log_pb2.FetchResponse]:
        with self._lock:
            stream = len(self.reading) + 1
            self.reading[stream] = set()
            self.most[stream] = 0
            self.open.add(stream)
        if self.advertised is not None:
            await context.send_initial_metadata(((KEY, self.advertised),))
        try:
            async for request in request_iterator:
                with self._lock:
                    after = set(self.reading[stream])
                    after -= {tp.partition for tp in request.remove}
                    after |= {p.partition for p in request.positions}
                    if len(after) > self.refuse_over:
                        self.refused.append(stream)
                    else:
                        self.reading[stream] = after
                        self.most[stream] = max(self.most[stream], len(after))
                if len(after) > self.refuse_over:
                    trailing = [(ERROR_CODE_METADATA_KEY, "INVALID_REQUEST")]
                    if self.in_refusal is not None:
                        trailing.append((KEY, self.in_refusal))
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"the stream would read {len(after)} partitions, over the limit of "
                        f"{self.refuse_over} (--max-partitions-per-fetch)",
                        trailing_metadata=tuple(trailing),
                    )
        finally:
            with self._lock:
                # An ended stream reads nothing more.
                self.reading[stream] = set()
                self.open.discard(stream)
        if False:  # pragma: no cover - an async generator that yields nothing
            yield log_pb2.FetchResponse()

    def read_now(self) -> set[int]:
        """The partitions some open stream reads."""
        with self._lock:
            return set().union(*self.reading.values())


async def place_every_partition(
    server: StreamLimitedServer, want: int | None = None, *, expect_error: bool = False
) -> list[BaseException]:
    """A consumer assigned every partition seeks each at once; returns once
    the server's streams read `want` of them (all by default) and, with
    `expect_error`, poll() has raised; with what it raised meanwhile."""
    want = server.partitions if want is None else want
    raised: list[BaseException] = []
    partitions = [TopicPartition(TOPIC, p) for p in range(server.partitions)]
    async with serving(partial(log_pb2_grpc.add_LogServicer_to_server, server)) as address:
        server.port = int(address.rsplit(":", 1)[1])
        async with AsyncConsumer(bootstrap_servers=address, retry_backoff_ms=20) as consumer:
            consumer.assign(partitions)
            for tp in partitions:
                consumer.seek(tp, 0)
            deadline = time.monotonic() + DEADLINE_S
            while len(server.read_now()) < want or (expect_error and not raised):
                if time.monotonic() > deadline:
                    raise AssertionError(f"not placed: {server.read_now()}; raised {raised}")
                try:
                    await consumer.getmany(timeout_ms=50)
                except InvalidRequestError as exc:
                    raised.append(exc)
    return raised


@pytest.mark.parametrize(
    ("advertised", "refuse_over", "in_refusal", "per_stream"),
    [
        # Named up front, the first stream too large: refused, then spread.
        ("7", 7, "7", 7),
        # Named only in the refusal.
        (None, 7, "7", 7),
        # Named up front only (the refusal's status lost, say).
        ("7", 7, None, 7),
        # 0 or a negative: one partition per stream, never an empty one.
        ("0", 1, "0", 1),
        ("-3", 1, "-3", 1),
    ],
)
def test_partitions_spread_over_streams_within_the_limit_the_server_names(
    advertised: str | None, refuse_over: int, in_refusal: str | None, per_stream: int
) -> None:
    server = StreamLimitedServer(advertised, refuse_over, in_refusal)
    assert asyncio.run(place_every_partition(server)) == []
    # Only the first stream, opened before the limit could be known, was
    # refused; every other one read within the limit.
    assert set(server.refused) <= {1}
    assert all(most <= per_stream for stream, most in server.most.items() if stream != 1)
    streams = len([s for s, most in server.most.items() if most])
    assert streams == -(-PARTITIONS // per_stream)


@pytest.mark.parametrize("advertised", ["junk", "", "+5", "9" * 100])
def test_garbage_leaves_the_sdk_as_it_was(advertised: str) -> None:
    server = StreamLimitedServer(advertised)
    assert asyncio.run(place_every_partition(server)) == []
    # One stream reads every partition, as against a broker.
    assert list(server.most.values()) == [PARTITIONS]


def test_a_huge_limit_means_one_stream() -> None:
    server = StreamLimitedServer("99999999999")
    assert asyncio.run(place_every_partition(server)) == []
    assert list(server.most.values()) == [PARTITIONS]


def test_a_server_refusing_streams_within_the_limit_it_names_is_not_asked_for_ever() -> None:
    # Says 1,000 but refuses more than 5: spreading cannot help, so the
    # refusal reaches the application, as any refusal of a fetch stream.
    server = StreamLimitedServer("1000", 5, "1000")
    raised = asyncio.run(place_every_partition(server, want=0, expect_error=True))
    assert raised and isinstance(raised[0], InvalidRequestError), raised
    assert "over the limit of 5" in str(raised[0])
    assert server.refused == [1]
    # Says 5 and refuses even 5: spread once, then each refusal is raised.
    server = StreamLimitedServer("5", 4, "5")
    raised = asyncio.run(place_every_partition(server, want=0, expect_error=True))
    assert raised and "over the limit of 4" in str(raised[0])
    assert len(server.reading) <= 1 + PARTITIONS // 5


def test_a_tiny_limit_opens_at_most_so_many_streams() -> None:
    # One partition per stream and more partitions than streams allowed:
    # MAX_FETCH_STREAMS_PER_SERVER streams read as many partitions, and
    # poll() says why the others are not read.
    partitions = MAX_FETCH_STREAMS_PER_SERVER + 6
    server = StreamLimitedServer("1", 1, "1", partitions=partitions)
    raised = asyncio.run(
        place_every_partition(server, want=MAX_FETCH_STREAMS_PER_SERVER, expect_error=True)
    )
    assert len([s for s, most in server.most.items() if most]) == MAX_FETCH_STREAMS_PER_SERVER
    assert max(server.most.values()) == 1
    assert raised, "poll() did not say why partitions are not read"
    assert "reads at most 1 partitions per fetch stream" in str(raised[0])
    assert f"{MAX_FETCH_STREAMS_PER_SERVER} streams" in str(raised[0])


def test_streams_left_reading_nothing_are_closed_but_one() -> None:
    """A smaller assignment leaves the streams opened to spread partitions
    empty: they end (each held a credit window and a stream of the
    server's), but for one; a larger one opens them again."""
    server = StreamLimitedServer("7", 7, "7")
    partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]

    async def run() -> tuple[set[int], set[int]]:
        async with serving(partial(log_pb2_grpc.add_LogServicer_to_server, server)) as address:
            server.port = int(address.rsplit(":", 1)[1])
            async with AsyncConsumer(bootstrap_servers=address, retry_backoff_ms=20) as consumer:
                consumer.assign(partitions)
                for tp in partitions:
                    consumer.seek(tp, 0)
                await until(lambda: len(server.read_now()) == PARTITIONS, consumer)
                consumer.assign(partitions[:3])
                await until(lambda: len(server.open) == 1, consumer)
                assert server.read_now() == {0, 1, 2}
                smaller = set(server.open)
                consumer.assign(partitions)
                for tp in partitions:
                    consumer.seek(tp, 0)
                await until(lambda: len(server.read_now()) == PARTITIONS, consumer)
                return smaller, set(server.open)

    smaller, larger = asyncio.run(run())
    assert len(larger) == -(-PARTITIONS // 7)
    assert smaller < larger
    assert all(most <= 7 for stream, most in server.most.items() if stream != 1)


async def until(condition: Callable[[], bool], consumer: AsyncConsumer) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true"
        await consumer.getmany(timeout_ms=20)
