"""AsyncProducer and AsyncConsumer against a real broker process."""

from __future__ import annotations

import asyncio

import pytest
from tidelog import AsyncConsumer, AsyncProducer, ConsumerRecord, TopicPartition
from tidelog.errors import MessageTooLargeError

pytestmark = pytest.mark.timeout(30)


async def take(consumer: AsyncConsumer, count: int) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    while len(out) < count:
        for records in (await consumer.getmany(timeout_ms=200)).values():
            out.extend(records)
    return out


def test_async_round_trip(broker_address: str, topic_name: str) -> None:
    async def main() -> None:
        async with AsyncProducer(broker_address, compression_type="lz4") as producer:
            futures = [
                await producer.send(topic_name, b"v%d" % i, key=b"k", partition=0)
                for i in range(100)
            ]
            first = await futures[0]
            assert first.offset == 0
            await producer.flush()
            assert [f.get(0).offset for f in futures] == list(range(100))
            md = await producer.send_and_wait(topic_name, b"last", partition=0)
            assert md.offset == 100
            assert await producer.partitions_for(topic_name) == {0}
            with pytest.raises(MessageTooLargeError):
                await (await producer.send(topic_name, b"x" * (2 << 20)))

        tp = TopicPartition(topic_name, 0)
        async with AsyncConsumer(bootstrap_servers=broker_address) as consumer:
            consumer.assign([tp])
            records = await take(consumer, 101)
            assert [r.value for r in records[:3]] == [b"v0", b"v1", b"v2"]
            assert records[-1].value == b"last"
            assert await consumer.position(tp) == 101
            await consumer.seek_to_beginning(tp)
            assert (await consumer.getone()).offset == 0
            consumer.seek(tp, 99)
            seen = []
            async for record in consumer:
                seen.append(record.offset)
                if record.offset == 100:
                    break
            assert seen == [99, 100]
            assert await consumer.end_offsets([tp]) == {tp: 101}
            assert await consumer.beginning_offsets([tp]) == {tp: 0}

    asyncio.run(asyncio.wait_for(main(), 25))


def test_async_getmany_timeout(broker_address: str, topic_name: str) -> None:
    async def main() -> None:
        async with AsyncProducer(broker_address) as producer:
            await producer.send_and_wait(topic_name, b"v", partition=0)
        async with AsyncConsumer(bootstrap_servers=broker_address) as consumer:
            consumer.assign([TopicPartition(topic_name, 0)])
            await consumer.seek_to_end()
            loop = asyncio.get_running_loop()
            start = loop.time()
            assert await consumer.getmany(timeout_ms=200) == {}
            # It waited its timeout; the upper bound is a deadline, not a measure.
            assert 0.2 <= loop.time() - start < 20

    asyncio.run(asyncio.wait_for(main(), 25))
