"""The partitions a consumer places at one time go to their leader's fetch
session in one FetchRequest (per MAX_FETCH_PARTITIONS_PER_REQUEST), each with
its own position: against an in-process stand-in broker over real gRPC on
loopback (Log.Metadata naming it the leader of every partition, ListOffsets
answering an offset per partition, and a Fetch stream that counts the
requests it receives and the positions and removals in each).

The consumer used to send one FetchRequest per partition: 1,200 requests on
the stream (and a task each) after assign + seek_to_end of 1,200 partitions;
as many for an assignment with positions, a resume of every partition, a
leader change answered for every partition, and removals one by one."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

import grpc
import grpc.aio
import pytest
import tidelog._fetcher
from tidelog import AsyncConsumer, Consumer, TopicPartition
from tidelog.request_limits import MAX_FETCH_PARTITIONS_PER_REQUEST
from tidelog.v1 import common_pb2, log_pb2, log_pb2_grpc

from tests.support.in_process_server import led_by_one_broker, serving

pytestmark = pytest.mark.timeout(120)

TOPIC = "wide"
PARTITIONS = 1200
#: Generous: the stand-in answers at once; this only bounds a broken test.
DEADLINE_S = 60.0
#: A lower limit than the SDK's, so that the split shows with 1,200 partitions.
SMALL_LIMIT = 500


def end_of(partition: int) -> int:
    """What the stand-in answers for latest (earliest is 0)."""
    return 100 + partition


@dataclass
class Received:
    """One FetchRequest as the stand-in received it."""

    positions: dict[int, int]  # partition -> fetch_offset, in request order
    removed: list[int]
    credit_bytes: int


@dataclass
class StandInBroker(log_pb2_grpc.LogServicer):
    """One broker leading every partition of TOPIC (see module doc).
    `refuse_once`: the first time every partition has been placed, answer
    NOT_LEADER_OR_FOLLOWER for each of them, in one response (as a broker
    whose partitions moved answers)."""

    refuse_once: bool = False
    port: int = 0
    requests: list[Received] = field(default_factory=list)
    #: partition -> the last position received.
    placed: dict[int, int] = field(default_factory=dict)
    refused: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def Metadata(
        self, request: log_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.MetadataResponse:
        return led_by_one_broker(self.port, {TOPIC: PARTITIONS})

    async def ListOffsets(
        self, request: log_pb2.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.ListOffsetsResponse:
        return log_pb2.ListOffsetsResponse(
            partitions=[
                log_pb2.ListOffsetsResult(
                    topic=entry.topic,
                    partition=entry.partition,
                    offset=end_of(entry.partition) if entry.timestamp_ms == -1 else 0,
                )
                for entry in request.partitions
            ]
        )

    async def Fetch(
        self,
        request_iterator: AsyncIterator[log_pb2.FetchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[log_pb2.FetchResponse]:
        async for request in request_iterator:
            received = Received(
                {p.partition: p.fetch_offset for p in request.positions},
                [tp.partition for tp in request.remove],
                request.credit_bytes,
            )
            with self._lock:
                self.requests.append(received)
                for partition in received.removed:
                    self.placed.pop(partition, None)
                self.placed.update(received.positions)
                refuse = self.refuse_once and not self.refused and len(self.placed) == PARTITIONS
                if refuse:
                    self.refused = True
                    refusing = dict(self.placed)
            if refuse:
                yield log_pb2.FetchResponse(
                    partitions=[
                        log_pb2.PartitionData(
                            topic=TOPIC,
                            partition=partition,
                            error=common_pb2.Error(
                                code=common_pb2.NOT_LEADER_OR_FOLLOWER, message="not the leader"
                            ),
                            fetch_offset=offset,
                            next_offset=offset,
                        )
                        for partition, offset in refusing.items()
                    ]
                )

    def placing_requests(self) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.positions]

    def removing_requests(self) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.removed]

    def placed_now(self) -> dict[int, int]:
        with self._lock:
            return dict(self.placed)


@pytest.fixture(params=[MAX_FETCH_PARTITIONS_PER_REQUEST, SMALL_LIMIT], ids=["sdk-limit", "500"])
def limit(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The fetcher's split size: the SDK's own, and a lower one (so that a
    placement of 1,200 partitions takes several requests)."""
    monkeypatch.setattr(tidelog._fetcher, "MAX_FETCH_PARTITIONS_PER_REQUEST", request.param)
    yield request.param


PARTITION_LIST = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
ENDS = {p: end_of(p) for p in range(PARTITIONS)}


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (polling) until condition() is true."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def check_split(requests: list[Received], limit: int, placements: int) -> None:
    """`placements` placements of every partition, each in requests of at
    most `limit` partitions, as few as that allows."""
    assert all(len(r.positions) <= limit for r in requests)
    assert len(requests) <= placements * math.ceil(PARTITIONS / limit)


async def run_with_stand_in(
    scenario: Callable[[str], Awaitable[None]], broker: StandInBroker
) -> None:
    """`scenario(address)` while `broker` serves on a free loopback port."""
    async with serving(partial(log_pb2_grpc.add_LogServicer_to_server, broker)) as address:
        broker.port = int(address.rsplit(":", 1)[1])
        await scenario(address)


def test_blocking_consumer_seek_to_end_places_partitions_together(limit: int) -> None:
    broker = StandInBroker()

    async def scenario(address: str) -> None:
        def consume() -> dict[TopicPartition, int]:
            with Consumer(bootstrap_servers=address, auto_offset_reset="earliest") as consumer:
                consumer.assign(PARTITION_LIST)
                consumer.seek_to_end()
                found = {tp: consumer.position(tp, timeout=DEADLINE_S) for tp in PARTITION_LIST}
                # Every partition's last position reaches the stand-in
                # before the consumer closes.
                deadline = time.monotonic() + DEADLINE_S
                while broker.placed_now() != ENDS and time.monotonic() < deadline:
                    time.sleep(0.01)
                return found

        found = await asyncio.to_thread(consume)
        assert found == {tp: ENDS[tp.partition] for tp in PARTITION_LIST}

    asyncio.run(run_with_stand_in(scenario, broker))
    assert broker.placed_now() == ENDS
    # The assignment's reset may be answered before seek_to_end reaches the
    # fetcher (then every partition is placed twice, at 0 and at its end).
    check_split(broker.placing_requests(), limit, placements=2)
    # The session's opening credit travels in its first request.
    assert broker.requests[0].credit_bytes > 0


def test_async_consumer_seek_to_end_places_partitions_together(limit: int) -> None:
    broker = StandInBroker()

    async def scenario(address: str) -> None:
        consumer = AsyncConsumer(bootstrap_servers=address, auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign(PARTITION_LIST)
            await consumer.seek_to_end()
            async with asyncio.timeout(DEADLINE_S):
                found = {tp: await consumer.position(tp) for tp in PARTITION_LIST}
            assert found == {tp: ENDS[tp.partition] for tp in PARTITION_LIST}
            await until(lambda: broker.placed_now() == ENDS, "every position")
            # assign and seek_to_end in one turn of the loop: one round of
            # resets, one placement.
            check_split(broker.placing_requests(), limit, placements=1)
            # Each partition is placed once, in the order of the assignment.
            placed = [p for r in broker.placing_requests() for p in r.positions]
            assert placed == list(range(PARTITIONS))

            # Seeks of one turn of the loop go together too.
            for tp in PARTITION_LIST:
                consumer.seek(tp, tp.partition)
            await until(
                lambda: broker.placed_now() == {p: p for p in range(PARTITIONS)}, "the seeks"
            )
            check_split(broker.placing_requests(), limit, placements=2)

            # So do pauses (removals) and resumes.
            consumer.pause(*PARTITION_LIST)
            await until(lambda: not broker.placed_now(), "the removals")
            removing = broker.removing_requests()
            assert all(len(r.removed) <= limit for r in removing)
            assert len(removing) == math.ceil(PARTITIONS / limit)
            consumer.resume(*PARTITION_LIST)
            await until(lambda: len(broker.placed_now()) == PARTITIONS, "the resumes")
            check_split(broker.placing_requests(), limit, placements=3)
            assert broker.placed_now() == {p: p for p in range(PARTITIONS)}
        finally:
            await consumer.stop()

    asyncio.run(run_with_stand_in(scenario, broker))


def test_partitions_a_leader_change_moved_are_placed_again_together(limit: int) -> None:
    broker = StandInBroker(refuse_once=True)

    async def scenario(address: str) -> None:
        consumer = AsyncConsumer(
            bootstrap_servers=address, auto_offset_reset="latest", retry_backoff_ms=20
        )
        await consumer.start()
        try:
            consumer.assign(PARTITION_LIST)
            await until(lambda: broker.refused, "the refusal")
            # Placed again after the refusal, each at its own position.
            await until(
                lambda: (
                    len(broker.placing_requests()) > 0
                    and sum(len(r.positions) for r in broker.placing_requests()) == 2 * PARTITIONS
                ),
                "every partition placed again",
            )
            assert broker.placed_now() == ENDS
            check_split(broker.placing_requests(), limit, placements=2)
        finally:
            await consumer.stop()

    asyncio.run(run_with_stand_in(scenario, broker))
