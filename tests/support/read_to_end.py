"""Reading a topic back to the end offsets taken when the read starts,
shared by the tests that check what a cluster kept (the fault tests'
read-back, the Spark tests').

Not a consumer's `consumer_timeout_ms` (iteration ends after that long
without a record): on a loaded machine the first fetch alone can take
longer, and a read cut short looked like records never written (or, in
the fault tests, like records lost)."""

from __future__ import annotations

import time
from collections.abc import Iterator

from tidelog import Consumer, ConsumerRecord, TopicPartition


def batches_to_end(
    bootstrap: str, topic: str, partitions: int, timeout_s: float, max_records: int = 500
) -> Iterator[tuple[int, list[ConsumerRecord]]]:
    """(partition, records) as polled, from each partition's beginning until
    every one reached its end offset as of the start. Fails, naming each
    partition's position/end and how many records it read, when that takes
    longer than `timeout_s`. A generator: the caller keeps what it needs of
    each batch (a soak reads millions of records)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    read = 0
    with Consumer(bootstrap_servers=bootstrap, enable_auto_commit=False) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while not all(consumer.position(tp) >= ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                behind = {
                    tp.partition: f"{consumer.position(tp)}/{ends[tp]}"
                    for tp in tps
                    if consumer.position(tp) < ends[tp]
                }
                raise AssertionError(
                    f"read {read} records of {topic} in {timeout_s:.0f} s without reaching "
                    f"its end: position/end per partition {behind}"
                )
            for tp, batch in consumer.poll(timeout_ms=500, max_records=max_records).items():
                read += len(batch)
                yield tp.partition, batch
