"""AsyncConsumer.set_fetch_window against a real broker: the window bounds
what is fetched ahead of the application while it changes (the gateway sizes
each client stream's window from the client's credit, issue 10)."""

from __future__ import annotations

import asyncio

import pytest
from tidelog import AsyncConsumer, AsyncProducer, ConsumerRecord, TopicPartition

pytestmark = pytest.mark.timeout(60)

RECORDS = 500
VALUE = b"v" * 100
# ~1.1 KiB batches: 10 records each.
BATCH_SIZE = 10 * len(VALUE)


async def _drain(consumer: AsyncConsumer) -> list[ConsumerRecord]:
    """What the consumer has fetched already (no waiting)."""
    out: list[ConsumerRecord] = []
    while polled := await consumer.getmany(timeout_ms=0, max_records=RECORDS):
        for records in polled.values():
            out.extend(records)
    return out


def test_the_fetch_window_bounds_what_is_fetched_ahead(
    broker_address: str, topic_name: str
) -> None:
    async def main() -> None:
        async with AsyncProducer(broker_address, batch_size=BATCH_SIZE, linger_ms=50) as producer:
            for i in range(RECORDS):
                await producer.send(topic_name, VALUE, key=b"%d" % i, partition=0)
            await producer.flush()
        tp = TopicPartition(topic_name, 0)
        async with AsyncConsumer(bootstrap_servers=broker_address) as consumer:
            consumer.set_fetch_window(0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            # A zero window fetches nothing.
            assert await consumer.getmany(timeout_ms=1000) == {}

            consumer.set_fetch_window(2048)
            got = list((await consumer.getmany(timeout_ms=10_000)).get(tp, []))
            assert got
            await asyncio.sleep(1)  # time to fetch ahead, were it allowed to
            ahead = await _drain(consumer)
            # 2 KiB ahead (~18 records) plus one batch (a broker sends a whole
            # batch), not the default 8 MiB window's whole partition.
            assert 0 < len(ahead) <= 30
            got += ahead

            # Closed again: the credit the broker still has (at most the
            # window) is spent, and consumed bytes are not granted back.
            consumer.set_fetch_window(0)
            after = []
            while polled := await consumer.getmany(timeout_ms=1000):
                for records in polled.values():
                    after.extend(records)
            assert len(after) <= 30
            got += after

            consumer.set_fetch_window(1024 * 1024)
            while len(got) < RECORDS:
                for records in (await consumer.getmany(timeout_ms=10_000)).values():
                    got.extend(records)
            assert [r.offset for r in got] == list(range(RECORDS))

    asyncio.run(main())
