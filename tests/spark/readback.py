"""Reading a topic back in the Spark tests: every record up to the end
offsets taken when the read starts.

Not a consumer's `consumer_timeout_ms` (iteration ends after that long
without a record): on a loaded machine the first fetch alone can take
longer, and a read cut short looked like records never written."""

from __future__ import annotations

import time

from tidelog import Consumer, ConsumerRecord, TopicPartition

#: How long a read back may take before it fails, naming how far it got.
READ_S = 60


def read_topic(
    bootstrap: str, topic: str, partitions: int, timeout_s: float = READ_S
) -> list[ConsumerRecord]:
    """Every record of `topic`, partition by partition in offset order."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    records: dict[int, list[ConsumerRecord]] = {p: [] for p in range(partitions)}
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
                    f"read {sum(map(len, records.values()))} records of {topic} in "
                    f"{timeout_s:.0f} s without reaching its end: position/end {behind}"
                )
            for tp, batch in consumer.poll(timeout_ms=500).items():
                records[tp.partition].extend(batch)
    return [record for p in range(partitions) for record in records[p]]
