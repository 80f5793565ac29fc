"""`df.write.format("tidelog")` and `df.writeStream.format("tidelog")` in a real
Spark session against a real cluster: the Kafka sink's columns, options
checked at start, and a micro-batch that Spark replays written once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.spark.queries import await_end
from tests.spark.readback import read_topic

pytestmark = pytest.mark.timeout(300)


def read_records(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    return read_topic(bootstrap, topic, partitions)


def test_batch_write_takes_the_kafka_sinks_columns(
    spark: Any, new_topic: Callable[..., str], tidelog_bootstrap: str
) -> None:
    topic = new_topic(partitions=3)
    other = new_topic(partitions=1, suffix="-other")
    rows = [
        # key, value, headers, topic (None: the option's), partition (None: by key)
        (b"a", b"one", [("h", b"1")], None, 2),
        (b"b", b"two", None, None, None),
        (None, b"three", [("x", None)], other, None),
        (b"c", None, [], None, 0),
    ]
    df = spark.createDataFrame(
        rows,
        "key binary, value binary, headers array<struct<key:string,value:binary>>, "
        "topic string, partition int",
    )
    (
        df.write.format("tidelog")
        .mode("append")  # Spark's default (errorifexists) is refused for Python data sources
        .option("kafka.bootstrap.servers", tidelog_bootstrap)  # Kafka's name, as an alias
        .option("topic", topic)
        .option("kafka.compression.type", "gzip")
        .save()
    )
    written = read_records(tidelog_bootstrap, topic, 3)
    by_value = {r.value: r for r in written}
    assert sorted(by_value, key=str) == sorted([b"one", b"two", None], key=str)
    assert by_value[b"one"].partition == 2 and by_value[b"one"].key == b"a"
    assert list(by_value[b"one"].headers) == [("h", b"1")]
    assert by_value[None].partition == 0 and by_value[None].key == b"c"
    (moved,) = read_records(tidelog_bootstrap, other, 1)
    assert moved.value == b"three" and moved.key is None
    assert list(moved.headers) == [("x", None)]


def test_string_columns_are_written_as_utf8(
    spark: Any, new_topic: Callable[..., str], tidelog_bootstrap: str
) -> None:
    topic = new_topic(partitions=1)
    df = spark.createDataFrame([("k", "héllo")], "key string, value string")
    df.write.format("tidelog").mode("append").option(
        "tidelog.bootstrap.servers", tidelog_bootstrap
    ).option("topic", topic).save()
    (record,) = read_records(tidelog_bootstrap, topic, 1)
    assert (record.key, record.value) == (b"k", "héllo".encode())


@pytest.mark.parametrize(
    ("schema", "options", "named"),
    [
        ("value binary", {"topc": "T"}, "'topc'"),
        ("value binary", {"topic": "T", "kafka.acks": "0"}, "'kafka.acks'"),
        ("value binary", {"topic": "T", "kafka.key.serializer": "x"}, "'kafka.key.serializer'"),
        ("value binary", {"topic": "T", "kafka.batch.size": "big"}, "'kafka.batch.size'"),
        ("value binary", {"topic": "T", "kafka.fetch.max.bytes": "1"}, "'kafka.fetch.max.bytes'"),
        ("value binary", {}, "'topic' option"),
        ("value binary", {"topic": "no-such-topic-here"}, "'no-such-topic-here' does not exist"),
        ("value int", {"topic": "T"}, "column 'value' is int"),
        ("key int, value binary", {"topic": "T"}, "column 'key' is int"),
        ("data binary", {"topic": "T"}, "needs a 'value' column"),
        ("value binary, partition bigint", {"topic": "T"}, "column 'partition' is bigint"),
        ("value binary, headers array<string>", {"topic": "T"}, "column 'headers'"),
    ],
)
def test_bad_columns_and_options_fail_at_start_naming_them(
    spark: Any,
    new_topic: Callable[..., str],
    tidelog_bootstrap: str,
    schema: str,
    options: dict[str, str],
    named: str,
) -> None:
    topic = new_topic(partitions=1)
    options = {k: (topic if v == "T" else v) for k, v in options.items()}
    df = spark.createDataFrame([], schema)
    writer = (
        df.write.format("tidelog")
        .mode("append")
        .option("tidelog.bootstrap.servers", tidelog_bootstrap)
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    with pytest.raises(Exception, match="SinkOptionError") as failure:
        writer.save()
    assert named in str(failure.value)
    assert read_records(tidelog_bootstrap, topic, 1) == []


def test_a_batch_write_repeated_with_its_writer_id_is_written_once(
    spark: Any, new_topic: Callable[..., str], tidelog_bootstrap: str
) -> None:
    """foreachBatch may run its function again for a replayed batch id: with
    `writerId` naming query and batch, the second write writes nothing."""
    topic = new_topic(partitions=2)
    df = spark.createDataFrame([(f"v{i}".encode(),) for i in range(50)], "value binary")
    for _ in range(2):
        df.write.format("tidelog").mode("append").option(
            "tidelog.bootstrap.servers", tidelog_bootstrap
        ).option("topic", topic).option("writerId", "query-q1/batch-7").save()
    values = sorted(r.value for r in read_records(tidelog_bootstrap, topic, 2))
    assert values == sorted(f"v{i}".encode() for i in range(50))


def test_overwrite_mode_is_refused(
    spark: Any, new_topic: Callable[..., str], tidelog_bootstrap: str
) -> None:
    topic = new_topic(partitions=1)
    df = spark.createDataFrame([(b"v",)], "value binary")
    writer = df.write.format("tidelog").mode("overwrite").option("topic", topic)
    with pytest.raises(Exception, match="cannot be overwritten"):
        writer.option("tidelog.bootstrap.servers", tidelog_bootstrap).save()


@pytest.mark.timeout(600)  # two queries, each given queries.END_S to end
def test_a_micro_batch_that_spark_replays_is_written_once(
    spark: Any,
    new_topic: Callable[..., str],
    produce: Callable[..., None],
    tidelog_bootstrap: str,
    tmp_path: Path,
) -> None:
    """The driver dies between the tasks' writes and the batch's commit (here:
    the sink's commit of batch 1 fails, so Spark never records batch 1 as
    done); the query restarted from its checkpoint runs batch 1 again with
    the same batch id, and its records are in the output once."""
    from tidelog.spark.datasource import TidelogDataSource
    from tidelog.spark.sink import TidelogStreamWriter

    source = new_topic(partitions=2, suffix="-in")
    sink = new_topic(partitions=2, suffix="-out")
    produce(source, [f"event-{i:04d}".encode() for i in range(300)], keys=[b"a", b"b", b"c"] * 100)

    # Defined in the test, so pickled by value to Spark's Python workers.
    class CommitFails(TidelogStreamWriter):
        def commit(self, messages: list[Any], batchId: int) -> None:
            if batchId == 1:
                raise RuntimeError("driver died before committing batch 1")
            super().commit(messages, batchId)

    class CommitFailsSource(TidelogDataSource):
        @classmethod
        def name(cls) -> str:
            return "tidelog_commit_fails"

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            writer = super().streamWriter(schema, overwrite)
            return CommitFails(writer._options)

    spark.dataSource.register(CommitFailsSource)
    checkpoint = str(tmp_path / "checkpoint")

    def run(sink_format: str) -> Any:
        stream = (
            spark.readStream.format("tidelog")
            .option("tidelog.bootstrap.servers", tidelog_bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", 100)
            .load()
            .select("key", "value")
        )
        return (
            stream.writeStream.format(sink_format)
            .option("tidelog.bootstrap.servers", tidelog_bootstrap)
            .option("topic", sink)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )

    error = await_end(run("tidelog_commit_fails"))
    assert "driver died before committing batch 1" in str(error), error
    # Batches 0 and 1 were written; only batch 0 is in the commit log.
    assert len(read_records(tidelog_bootstrap, sink, 2)) == 200

    error = await_end(run("tidelog"))
    assert error is None, error
    values = sorted(r.value for r in read_records(tidelog_bootstrap, sink, 2))
    assert values == [f"event-{i:04d}".encode() for i in range(300)]
