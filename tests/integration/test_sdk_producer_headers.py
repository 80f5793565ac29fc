"""Record headers a header block cannot hold are refused by send() naming the limit, and
nothing else is lost: before, a header key over 65,535 bytes in UTF-8 (or over 65,535
headers) reached the sender, whose encode raised struct.error and stopped it for good, so
that record, the records batched with it and every record sent after it timed out. A batch
that cannot be encoded for any other reason fails alone and the sender goes on."""

from __future__ import annotations

import time

import pytest
from tidelog import AsyncProducer, Consumer, Producer, TopicPartition
from tidelog.errors import InvalidRecordError
from tidelog.records import MAX_HEADER_KEY_BYTES, MAX_HEADERS_PER_RECORD

pytestmark = pytest.mark.timeout(60)


def read_all(address: str, topic: str, count: int) -> list[tuple[bytes | None, list]]:
    with Consumer(bootstrap_servers=address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got: list[tuple[bytes | None, list]] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got += [(r.value, list(r.headers)) for r in records]
        return got


def test_headers_past_the_format_are_refused_and_nothing_else_is_lost(
    broker_address: str, topic_name: str
) -> None:
    long_key = "k" * (MAX_HEADER_KEY_BYTES + 1)
    # 32,768 two-byte characters: under the limit in characters, over it in UTF-8.
    wide_key = "é" * (MAX_HEADER_KEY_BYTES // 2 + 1)
    too_many = [("h", b"")] * (MAX_HEADERS_PER_RECORD + 1)
    with Producer(broker_address, linger_ms=50) as producer:
        before = producer.send(topic_name, b"before", headers=[("trace", b"1")])
        with pytest.raises(ValueError, match="MAX_HEADER_KEY_BYTES"):
            producer.send(topic_name, b"x", headers=[(long_key, b"v")])
        with pytest.raises(ValueError, match=r"65536 bytes in UTF-8.*MAX_HEADER_KEY_BYTES"):
            producer.send(topic_name, b"x", headers=[(wide_key, b"v")])
        with pytest.raises(ValueError, match="MAX_HEADERS_PER_RECORD"):
            producer.send(topic_name, b"x", headers=too_many)
        with pytest.raises(TypeError, match="a header must be"):
            producer.send(topic_name, b"x", headers=[("k", "not bytes")])
        # At the limit exactly: accepted and delivered.
        at_limit = producer.send(
            topic_name, b"at-limit", headers=[("k" * MAX_HEADER_KEY_BYTES, None)]
        )
        after = producer.send(topic_name, b"after", headers=[("trace", b"2")])
        assert (before.get(30).offset, at_limit.get(30).offset, after.get(30).offset) == (0, 1, 2)
    got = read_all(broker_address, topic_name, 3)
    assert [value for value, _ in got] == [b"before", b"at-limit", b"after"]
    assert got[1][1] == [("k" * MAX_HEADER_KEY_BYTES, None)]


def test_the_async_producer_refuses_them_too(broker_address: str, topic_name: str) -> None:
    import asyncio

    async def scenario() -> None:
        async with AsyncProducer(broker_address) as producer:
            with pytest.raises(ValueError, match="MAX_HEADER_KEY_BYTES"):
                await producer.send(topic_name, b"x", headers=[("k" * 70_000, b"v")])
            sent = await (await producer.send(topic_name, b"ok", headers=[("a", b"b")]))
            assert sent.offset == 0

    asyncio.run(scenario())


def test_a_batch_that_cannot_be_encoded_fails_alone(broker_address: str, topic_name: str) -> None:
    with Producer(broker_address, linger_ms=0) as producer:
        producer.send(topic_name, b"first").get(30)
        # Past send()'s checks, straight into the accumulator: what a bug in them would let in.
        acc = producer._acc
        bad = acc.append(topic_name, 0, 1, None, b"bad", [("k" * 70_000, b"")], 1, 70_100, 5.0)
        with pytest.raises(InvalidRecordError, match="cannot be encoded"):
            bad.get(30)
        assert producer.send(topic_name, b"after").get(30).offset == 1
    assert [value for value, _ in read_all(broker_address, topic_name, 2)] == [b"first", b"after"]
