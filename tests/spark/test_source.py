"""The tidelog source in a real Spark session against a real cluster: found by
its format name, rows with Kafka's source's schema, batch reads by offsets and
times, streams with AvailableNow and once, rate limits, minPartitions, new
partitions and topics picked up, headers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tidelog import NewTopic

from tests.spark.queries import await_end, wait_for

pytestmark = pytest.mark.timeout(300)


def read(spark: Any, bootstrap: str, **options: str) -> Any:
    reader = spark.read.format("tidelog").option("tidelog.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def stream(spark: Any, bootstrap: str, **options: str) -> Any:
    reader = spark.readStream.format("tidelog").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_available_now(
    df: Any, checkpoint: Path, trigger: str = "availableNow", batch_sizes: list[int] | None = None
) -> list[Any]:
    """Run a stream to its end (AvailableNow or once) into memory; the rows
    (and each micro-batch's row count into `batch_sizes`)."""
    rows: list[Any] = []

    def collect(batch: Any, batch_id: int) -> None:
        got = batch.collect()
        rows.extend(got)
        if batch_sizes is not None:
            batch_sizes.append(len(got))

    query = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**{trigger: True})
        .start()
    )
    error = await_end(query)
    assert error is None, error
    return rows


def test_format_name_finds_the_source_without_registering(
    spark: Any, tidelog_bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., None]
) -> None:
    topic = new_topic(partitions=2)
    produce(topic, [b"a", b"b", b"c"], partition=0, keys=[b"k", None, b"k"])
    produce(topic, [b"d"], partition=1)
    df = read(spark, tidelog_bootstrap, subscribe=topic)
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("key", "binary"),
        ("value", "binary"),
        ("topic", "string"),
        ("partition", "int"),
        ("offset", "bigint"),
        ("timestamp", "timestamp"),
        ("timestampType", "int"),
    ]
    rows = sorted(
        (r.partition, r.offset, r.key, r.value, r.topic, r.timestampType) for r in df.collect()
    )
    assert rows == [
        (0, 0, b"k", b"a", topic, 0),
        (0, 1, None, b"b", topic, 0),
        (0, 2, b"k", b"c", topic, 0),
        (1, 0, None, b"d", topic, 0),
    ]


def test_batch_read_between_offsets_and_times(
    spark: Any, tidelog_bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., None]
) -> None:
    topic = new_topic(partitions=1)
    produce(topic, [b"%d" % i for i in range(10)], partition=0,
            timestamps=[1_000_000 + i * 1000 for i in range(10)])  # fmt: skip
    df = read(
        spark,
        tidelog_bootstrap,
        subscribe=topic,
        startingOffsets=f'{{"{topic}":{{"0":3}}}}',
        endingOffsets=f'{{"{topic}":{{"0":7}}}}',
    )
    assert sorted(r.offset for r in df.collect()) == [3, 4, 5, 6]
    df = read(
        spark,
        tidelog_bootstrap,
        subscribe=topic,
        startingTimestamp="1002500",
        endingOffsetsByTimestamp=f'{{"{topic}":{{"0":1005000}}}}',
    )
    assert sorted(r.offset for r in df.collect()) == [3, 4]
    # minPartitions splits the one partition's range over several tasks.
    df = read(spark, tidelog_bootstrap, subscribe=topic, minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    assert sorted(r.offset for r in df.collect()) == list(range(10))


def test_headers_when_asked_for(
    spark: Any, tidelog_bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., None]
) -> None:
    topic = new_topic()
    produce(topic, [b"x", b"y"], headers=[[("h", b"1"), ("n", None)], None])
    rows = read(spark, tidelog_bootstrap, subscribe=topic, includeHeaders="true").collect()
    by_value = {r.value: r.headers for r in rows}
    assert [(h.key, h.value) for h in by_value[b"x"]] == [("h", b"1"), ("n", None)]
    assert by_value[b"y"] is None


@pytest.mark.timeout(900)  # three queries, each given queries.END_S to end
def test_available_now_and_once_read_what_is_there(
    spark: Any,
    tidelog_bootstrap: str,
    new_topic: Callable[..., str],
    produce: Callable[..., None],
    tmp_path: Path,
) -> None:
    topic = new_topic(partitions=3)
    for p in range(3):
        produce(topic, [b"p%d-%d" % (p, i) for i in range(20)], partition=p)
    df = stream(spark, tidelog_bootstrap, subscribe=topic, startingOffsets="earliest",
                maxOffsetsPerTrigger="25")  # fmt: skip
    sizes: list[int] = []
    rows = run_available_now(df, tmp_path / "available-now", batch_sizes=sizes)
    # maxOffsetsPerTrigger holds under AvailableNow too: 60 records in batches of ~25.
    assert len(sizes) >= 3 and max(sizes) <= 27, sizes
    assert sorted(r.value for r in rows) == sorted(
        b"p%d-%d" % (p, i) for p in range(3) for i in range(20)
    )
    # A second run from the same checkpoint reads only what came since.
    produce(topic, [b"late"], partition=1)
    rows = run_available_now(df, tmp_path / "available-now")
    assert [(r.value, r.partition, r.offset) for r in rows] == [(b"late", 1, 20)]
    once = run_available_now(
        stream(spark, tidelog_bootstrap, subscribe=topic, startingOffsets="earliest"),
        tmp_path / "once",
        trigger="once",
    )
    assert len(once) == 61


def test_new_partitions_and_pattern_topics_are_picked_up(
    spark: Any,
    tidelog_bootstrap: str,
    new_topic: Callable[..., str],
    produce: Callable[..., None],
    admin: Any,
    tmp_path: Path,
) -> None:
    first = new_topic(partitions=1, suffix="-pat")
    prefix = first.rsplit("-", 1)[0]
    produce(first, [b"one"])
    seen: list[tuple[str, int, bytes]] = []

    def collect(batch: Any, batch_id: int) -> None:
        seen.extend((r.topic, r.partition, r.value) for r in batch.collect())

    df = stream(spark, tidelog_bootstrap, subscribePattern=f"{prefix}.*",
                startingOffsets="earliest")  # fmt: skip
    query = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: (first, 0, b"one") in seen, query)
        # A new topic matching the pattern: its two (new) partitions are read
        # from their start. (Tidelog cannot add partitions to a topic yet.)
        second = f"{prefix}-second"
        admin.create_topics([NewTopic(second, num_partitions=2, replication_factor=1)])
        produce(second, [b"two-0"], partition=0)
        produce(second, [b"two-1"], partition=1)
        wait_for(lambda: {(second, 0, b"two-0"), (second, 1, b"two-1")} <= set(seen), query)
    finally:
        query.stop()
    assert sorted(seen) == sorted(
        [(first, 0, b"one"), (second, 0, b"two-0"), (second, 1, b"two-1")]
    )
