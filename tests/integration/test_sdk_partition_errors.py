"""A partition's error reaches the calls about that partition only, against
a real broker: position(tp) raises the error that keeps tp's position
unknown, never another partition's; poll() (getmany()) raises each
partition's error once; a read of named partitions raises theirs only.

position(B) waiting for B's reset took every item the fetcher had queued and
raised the first error among them, whichever partition it was about (and
poll() never saw that error again)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from tidelog import AdminClient, AsyncConsumer, Consumer, NewTopic, Producer, TopicPartition
from tidelog.errors import NoOffsetForPartitionError

pytestmark = pytest.mark.timeout(60)

#: Generous: the records are there at once; this only bounds a broken test.
DEADLINE_S = 20


def create_with_records(address: str, topic: str) -> tuple[TopicPartition, TopicPartition]:
    """Topic `topic` with 2 partitions, 3 records in partition 1."""
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=2)])
    with Producer(address, linger_ms=2) as producer:
        for i in range(3):
            producer.send(topic, b"v%d" % i, partition=1)
        producer.flush()
    return TopicPartition(topic, 0), TopicPartition(topic, 1)


def test_position_raises_only_the_error_of_the_partition_asked(
    broker_address: str, topic_name: str
) -> None:
    failing, reading = create_with_records(broker_address, topic_name)
    with Consumer(bootstrap_servers=broker_address, auto_offset_reset="none") as consumer:
        # Neither partition has a position: each gets NoOffsetForPartitionError
        # queued for poll(); `reading` is then reset explicitly, after it.
        consumer.assign([failing, reading])
        consumer.seek_to_beginning(reading)
        assert consumer.position(reading) == 0
        with pytest.raises(NoOffsetForPartitionError) as raised:
            consumer.position(failing)
        assert (raised.value.topic, raised.value.partition) == tuple(failing)
        # While the position stays unknown, position() says why (no wait).
        with pytest.raises(NoOffsetForPartitionError):
            consumer.position(failing, timeout=DEADLINE_S)

        # poll() raises the error of `failing` once, and reads the rest.
        errors: list[NoOffsetForPartitionError] = []
        got: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < 3 and time.monotonic() < deadline:
            try:
                for records in consumer.poll(timeout_ms=200).values():
                    got.extend(r.value for r in records)
            except NoOffsetForPartitionError as exc:
                errors.append(exc)
        assert got == [b"v0", b"v1", b"v2"]
        assert [(e.topic, e.partition) for e in errors] == [tuple(failing)]


def test_async_position_and_reads_of_named_partitions_raise_only_their_own_errors(
    broker_address: str, topic_name: str
) -> None:
    failing, reading = create_with_records(broker_address, topic_name)

    async def gather(
        read: Callable[[], Awaitable[dict]],
    ) -> tuple[list[bytes], list[NoOffsetForPartitionError]]:
        got: list[bytes] = []
        errors: list[NoOffsetForPartitionError] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < 3 and time.monotonic() < deadline:
            try:
                for records in (await read()).values():
                    got.extend(r.value for r in records)
            except NoOffsetForPartitionError as exc:
                errors.append(exc)
        return got, errors

    async def main() -> None:
        async with AsyncConsumer(
            bootstrap_servers=broker_address, auto_offset_reset="none"
        ) as consumer:
            consumer.assign([failing, reading])
            await consumer.seek_to_beginning(reading)
            assert await consumer.position(reading) == 0
            with pytest.raises(NoOffsetForPartitionError) as raised:
                await consumer.position(failing)
            assert (raised.value.topic, raised.value.partition) == tuple(failing)

            # A read of `reading` alone is not stopped by the other's error ...
            got, errors = await gather(lambda: consumer.getmany(reading, timeout_ms=200))
            assert (got, errors) == ([b"v0", b"v1", b"v2"], [])
            # ... which getmany() of every partition raises, once.
            consumer.seek(reading, 0)
            got, errors = await gather(lambda: consumer.getmany(timeout_ms=200))
            assert got == [b"v0", b"v1", b"v2"]
            assert [(e.topic, e.partition) for e in errors] == [tuple(failing)]

    asyncio.run(asyncio.wait_for(main(), 50))
