"""Consumer.poll_arrow against a real broker: the same records as poll(), one
RecordBatch per fetch answer, positions that move past what it returned,
mixed with poll() without a record skipped or repeated, paused partitions
held back, and headers (every codec: tests/unit/sdk/test_columnar.py)."""

from __future__ import annotations

import pyarrow as pa
from tidelog import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tidelog.columnar import arrow_schema

from tests.support.processes import BrokerProcess


def produce(address: str, topic: str, count: int, partition: int = 0, **options: object) -> None:
    with Producer(address, linger_ms=20, **options) as producer:
        for i in range(count):
            key = None if i % 3 else b"k%d" % i
            headers = [("i", b"%d" % i)] if i % 5 == 0 else None
            producer.send(topic, b"value-%d" % i, key=key, partition=partition, headers=headers)
        producer.flush(30)


def drain_arrow(consumer: Consumer, tp: TopicPartition, count: int) -> list[pa.RecordBatch]:
    batches: list[pa.RecordBatch] = []
    rows = 0
    for _ in range(100):
        for batch in consumer.poll_arrow(timeout_ms=2000, include_headers=True).get(tp, []):
            assert batch.schema == arrow_schema(True)
            batches.append(batch)
            rows += batch.num_rows
        if rows >= count:
            break
    return batches


def test_poll_arrow_returns_what_poll_returns(broker: BrokerProcess, topic_name: str) -> None:
    produce(broker.address, topic_name, 2000, batch_size=4096)
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap_servers=broker.address, max_partition_fetch_bytes=16 * 1024) as c:
        c.assign([tp])
        c.seek(tp, 0)
        expected = []
        while len(expected) < 2000:
            for records in c.poll(timeout_ms=2000).values():
                expected.extend(records)
        c.seek(tp, 0)
        batches = drain_arrow(c, tp, 2000)
        assert len(batches) > 1  # one per fetch answer, several answers of 16 KiB
        table = pa.Table.from_batches(batches)
        assert table.column("offset").to_pylist() == [r.offset for r in expected]
        assert table.column("key").to_pylist() == [r.key for r in expected]
        assert table.column("value").to_pylist() == [r.value for r in expected]
        headers = [
            [(h["key"], h["value"]) for h in hs] if hs else []
            for hs in table["headers"].to_pylist()
        ]
        assert headers == [list(r.headers) for r in expected]
        assert c.position(tp) == 2000


def test_mixed_with_poll_pause_and_seek(broker: BrokerProcess, topic_name: str) -> None:
    with AdminClient(broker.address) as admin:
        admin.create_topics([NewTopic(topic_name, num_partitions=2)])
    produce(broker.address, topic_name, 300, partition=0)
    produce(broker.address, topic_name, 300, partition=1)
    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    with Consumer(bootstrap_servers=broker.address) as c:
        c.assign([tp0, tp1])
        c.seek(tp0, 0)
        c.seek(tp1, 0)
        first = {}
        while not first:
            first = c.poll(timeout_ms=2000, max_records=7)
        taken = {tp: [r.offset for r in records] for tp, records in first.items()}
        c.pause(tp1)
        seen: dict[TopicPartition, list[int]] = {tp: list(v) for tp, v in taken.items()}
        for _ in range(50):
            for tp, batches in c.poll_arrow(timeout_ms=500).items():
                for batch in batches:
                    seen.setdefault(tp, []).extend(batch.column("offset").to_pylist())
            if len(seen.get(tp0, [])) >= 300:
                break
        assert seen[tp0] == list(range(300))  # nothing skipped or repeated across the calls
        assert len(seen.get(tp1, [])) < 300  # paused: held back
        c.resume(tp1)
        for _ in range(50):
            for tp, batches in c.poll_arrow(timeout_ms=500).items():
                for batch in batches:
                    seen.setdefault(tp, []).extend(batch.column("offset").to_pylist())
            if len(seen.get(tp1, [])) >= 300:
                break
        assert seen[tp1] == list(range(300))
        c.seek(tp0, 250)
        again: list[int] = []
        while len(again) < 50:
            for batch in c.poll_arrow(timeout_ms=2000).get(tp0, []):
                again.extend(batch.column("offset").to_pylist())
        assert again == list(range(250, 300))
        assert c.poll_arrow(timeout_ms=200) == {}
