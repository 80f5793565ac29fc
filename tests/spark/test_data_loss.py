"""failOnDataLoss both ways: records removed by retention before a query read
them, and a topic deleted under a running query. True: the query fails with
a message saying what was lost and naming the option. False: the loss is
logged and the query goes on (a topic created again with more partitions is
read, its new partitions included)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tidelog import Consumer, NewTopic, TopicPartition

from tests.spark.queries import await_end, wait_for

pytestmark = pytest.mark.timeout(300)


def topic_with_removed_records(
    new_topic: Callable[..., str], produce: Callable[..., None], bootstrap: str
) -> tuple[str, int]:
    """A topic whose first records retention removed: (name, log start)."""
    topic = new_topic(**{"segment.bytes": "1024", "retention.ms": "1"})
    for i in range(6):  # one batch of ~2 KB each: every produce closes a segment
        produce(topic, [b"%d-%d-" % (i, j) + b"x" * 200 for j in range(10)])
    with Consumer(bootstrap_servers=bootstrap) as consumer:
        tp = TopicPartition(topic, 0)
        deadline = time.monotonic() + 60
        while (start := consumer.beginning_offsets([tp])[tp]) == 0:
            assert time.monotonic() < deadline, "retention removed nothing"
            time.sleep(0.1)
    return topic, start


def run_from_zero(spark: Any, bootstrap: str, topic: str, fail: str, checkpoint: Path) -> Any:
    df = (
        spark.readStream.format("tidelog")
        .option("tidelog.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", f'{{"{topic}":{{"0":0}}}}')
        .option("failOnDataLoss", fail)
        .load()
    )
    rows: list[Any] = []
    query = (
        df.writeStream.foreachBatch(lambda batch, _: rows.extend(batch.collect()))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    await_end(query)
    return query, rows


@pytest.mark.timeout(600)  # two queries, each given queries.END_S to end
def test_records_removed_by_retention_fail_the_query_or_are_skipped(
    spark: Any,
    tidelog_bootstrap: str,
    new_topic: Callable[..., str],
    produce: Callable[..., None],
    tmp_path: Path,
) -> None:
    topic, start = topic_with_removed_records(new_topic, produce, tidelog_bootstrap)
    query, _ = run_from_zero(spark, tidelog_bootstrap, topic, "true", tmp_path / "a")
    error = str(query.exception())
    # Retention may have gone further since `start` was read.
    assert re.search(r"records \[0, \d+\) were to be read", error), error
    assert "'failOnDataLoss'" in error, error
    query, rows = run_from_zero(spark, tidelog_bootstrap, topic, "false", tmp_path / "b")
    assert query.exception() is None, query.exception()
    assert min(r.offset for r in rows) >= start
    assert max(r.offset for r in rows) == 59


def test_a_batch_read_of_removed_records_fails_or_reads_what_is_left(
    spark: Any,
    tidelog_bootstrap: str,
    new_topic: Callable[..., str],
    produce: Callable[..., None],
) -> None:
    topic, start = topic_with_removed_records(new_topic, produce, tidelog_bootstrap)

    def read(fail: str) -> Any:
        return (
            spark.read.format("tidelog")
            .option("tidelog.bootstrap.servers", tidelog_bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", f'{{"{topic}":{{"0":0}}}}')
            .option("failOnDataLoss", fail)
            .load()
        )

    with pytest.raises(Exception, match="failOnDataLoss"):
        read("true").collect()
    offsets = sorted(r.offset for r in read("false").collect())
    assert offsets[0] >= start and offsets[-1] == 59


@pytest.mark.parametrize("fail", ["true", "false"])
def test_a_topic_deleted_under_a_running_query(
    spark: Any,
    tidelog_bootstrap: str,
    new_topic: Callable[..., str],
    produce: Callable[..., None],
    admin: Any,
    tmp_path: Path,
    fail: str,
) -> None:
    topic = new_topic()
    produce(topic, [b"before-%d" % i for i in range(5)])
    seen: list[tuple[int, int, bytes]] = []
    df = (
        spark.readStream.format("tidelog")
        .option("tidelog.bootstrap.servers", tidelog_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", fail)
        .load()
    )
    query = (
        df.writeStream.foreachBatch(
            lambda batch, _: seen.extend((r.partition, r.offset, r.value) for r in batch.collect())
        )
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: len(seen) == 5, query)
        admin.delete_topics([topic])
        if fail == "true":
            error = str(await_end(query))
            assert f"{topic}-0 are gone" in error and "'failOnDataLoss'" in error, error
            return
        # Kept going: the topic created again, with a second partition, is read.
        time.sleep(1.5)
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
        produce(topic, [b"after-0"], partition=0)
        produce(topic, [b"after-1"], partition=1)
        wait_for(lambda: {(0, 0, b"after-0"), (1, 0, b"after-1")} <= set(seen), query)
        assert query.isActive
    finally:
        query.stop()
