"""Bad options fail a query at start with a message naming the option, as
Spark's Kafka source does; `kafka.bootstrap.servers` is an alias of
`tidelog.bootstrap.servers`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.spark.queries import await_end

pytestmark = pytest.mark.timeout(300)


def start_failure(spark: Any, tmp_path: Path, options: dict[str, str]) -> str:
    """Start a stream with `options`; the error it fails with."""
    reader = spark.readStream.format("tidelog")
    for key, value in options.items():
        reader = reader.option(key, value)
    try:
        query = (
            reader.load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
    except Exception as exc:  # refused before it started
        return str(exc)
    error = await_end(query)
    assert error is not None, "the query did not fail"
    return str(error)


def batch_failure(spark: Any, options: dict[str, str]) -> str:
    reader = spark.read.format("tidelog")
    for key, value in options.items():
        reader = reader.option(key, value)
    with pytest.raises(Exception) as caught:
        reader.load().collect()
    return str(caught.value)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"subscribe": "{topic}", "subscribeTopics": "x"}, "unknown option 'subscribetopics'"),
        ({"subscribe": "{topic}", "assign": '{{"{topic}":[0]}}'}, "'subscribe' and 'assign'"),
        ({"subscribe": "{topic}", "startingOffsets": '{{"{topic}":{{"0":'}, "'startingOffsets'"),
        (
            {"subscribe": "no-such-topic-anywhere"},
            "'no-such-topic-anywhere' named by option 'subscribe'",
        ),
        ({"assign": '{{"{topic}":[5]}}'}, "option 'assign' names"),
        # Every other rule: tests/unit/sdk/test_spark_options.py, without Spark.
    ],
    ids=lambda v: "-" if isinstance(v, str) else ",".join(v) or "none",
)
def test_a_bad_option_fails_the_stream_at_start_naming_it(
    spark: Any,
    tidelog_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path: Path,
    options: dict[str, str],
    named: str,
) -> None:
    topic = new_topic()
    given = {k: v.format(topic=topic) for k, v in options.items()}
    message = start_failure(
        spark, tmp_path, {"tidelog.bootstrap.servers": tidelog_bootstrap, **given}
    )
    assert named in message, message


def test_bad_batch_options_name_the_option(
    spark: Any, tidelog_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic()
    servers = {"kafka.bootstrap.servers": tidelog_bootstrap}
    message = batch_failure(spark, {**servers, "subscribe": topic, "endingOffsets": "earliest"})
    assert "'endingOffsets' cannot be 'earliest'" in message
    message = batch_failure(spark, {**servers, "subscribe": topic, "maxOffsetsPerTrigger": "5"})
    assert "'maxOffsetsPerTrigger' is for streams" in message
    message = batch_failure(
        spark,
        {
            **servers,
            "subscribe": topic,
            "startingOffsets": f'{{"{topic}":{{"0":5}}}}',
            "endingOffsets": f'{{"{topic}":{{"0":-1}}}}',
        },
    )
    assert "starting offset 5 is after the ending offset 0" in message
    message = batch_failure(
        spark,
        {
            "tidelog.bootstrap.servers": tidelog_bootstrap,
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "subscribe": topic,
        },
    )
    assert "'kafka.bootstrap.servers'" in message
