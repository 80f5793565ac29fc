"""The sink's batch cuts (tidelog.spark.sink_task._PartitionWriter): a
replayed task must cut its records exactly as the first attempt did, however
Spark splits the rows into Arrow batches, so the cuts are the record-by-record
rule (a record that does not fit cuts the pending ones first) and the last
record is always sealed alone."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tidelog.compression import CompressionType
from tidelog.records import decode_batches
from tidelog.spark.sink_task import RECORD_OVERHEAD, _PartitionWriter
from tidelog.types import TopicPartition

BATCH_BYTES = 300


def cuts_record_by_record(sizes: list[int]) -> list[int]:
    """Batch lengths by the rule, one record at a time."""
    out: list[int] = []
    pending, pending_bytes = 0, 0
    for size in sizes:
        if pending and pending_bytes + size > BATCH_BYTES:
            out.append(pending)
            pending, pending_bytes = 0, 0
        pending += 1
        pending_bytes += size
    if pending > 1:
        out.append(pending - 1)
    if pending:
        out.append(1)
    return out


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 400), min_size=1, max_size=60),
    splits=st.lists(st.integers(1, 20), min_size=1, max_size=10),
)
def test_cuts_do_not_depend_on_how_rows_are_split(lengths: list[int], splits: list[int]) -> None:
    values = [bytes([i % 251]) * n for i, n in enumerate(lengths)]
    sizes = np.array([RECORD_OVERHEAD + n for n in lengths], dtype=np.int64)
    writer = _PartitionWriter(TopicPartition("t", 0), 7, BATCH_BYTES, CompressionType.NONE)
    start, chunk = 0, 0
    while start < len(values):
        end = min(len(values), start + splits[chunk % len(splits)])
        writer.extend([None] * (end - start), values[start:end], None, sizes[start:end])
        start, chunk = end, chunk + 1
    writer.seal()

    batches = list(writer.ready)
    assert [b.count for b in batches] == cuts_record_by_record([int(s) for s in sizes])
    assert batches[-1].count == 1  # the seal
    # Numbered 0..n-1 in order, each batch with the producer's id and epoch 0.
    assert [b.base_sequence for b in batches] == [
        sum(b.count for b in batches[:i]) for i in range(len(batches))
    ]
    decoded = [d for b in batches for d in decode_batches(b.data)]
    assert [v for d in decoded for v in d.values] == values
    assert {(d.header.producer_id, d.header.producer_epoch) for d in decoded} == {(7, 0)}
