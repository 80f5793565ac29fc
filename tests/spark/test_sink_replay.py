"""The sink's exactly-once writer, task by task, against a real cluster.

Each test runs what one Spark task of the sink runs (`sink_task.run_task`)
twice with the same writer key, as Spark does when it retries a task or
replays a micro-batch with the same batch id, and reads the topic back.
(tests/spark/test_sink_spark.py does the same through real Spark queries.)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest
from tidelog.config import ProducerConfig
from tidelog.spark import sink_task
from tidelog.spark.sink_task import run_task

from tests.spark.readback import read_topic

pytestmark = pytest.mark.timeout(120)


def read_all(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[bytes, bytes]]]:
    """Every record of `topic`: partition -> [(key, value)] in offset order."""
    out: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(partitions)}
    for record in read_topic(bootstrap, topic, partitions):
        out[record.partition].append((record.key, record.value))
    return out


def rows(count: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    return [(f"k{i % 7}".encode(), f"value-{i:06d}".encode()) for i in range(start, start + count)]


def arrow_batches(items: list[tuple[bytes, bytes]], per_batch: int) -> list[pa.RecordBatch]:
    return [
        pa.RecordBatch.from_arrays(
            [
                pa.array([k for k, _ in items[i : i + per_batch]], pa.binary()),
                pa.array([v for _, v in items[i : i + per_batch]], pa.binary()),
            ],
            names=["key", "value"],
        )
        for i in range(0, len(items), per_batch)
    ]


def failing_after(batches: list[pa.RecordBatch], count: int) -> Iterator[pa.RecordBatch]:
    """The first `count` batches, then the task dies (an executor lost)."""
    yield from batches[:count]
    raise RuntimeError("task killed")


@pytest.fixture
def config(tidelog_bootstrap: str) -> ProducerConfig:
    # Small batches so that a task's rows make many of them (more than the
    # five the broker remembers per producer), sent as they fill.
    return ProducerConfig(bootstrap_servers=tidelog_bootstrap, acks="all", batch_size=2048)


def check_once(
    bootstrap: str, topic: str, partitions: int, expected: list[tuple[bytes, bytes]]
) -> None:
    written = read_all(bootstrap, topic, partitions)
    values = [v for records in written.values() for _, v in records]
    assert len(values) == len(expected), "records written more or less than once"
    assert sorted(values) == sorted(v for _, v in expected)
    # Per key, in the order the task saw them (one key, one partition).
    for records in written.values():
        for key in {k for k, _ in records}:
            mine = [v for k, v in records if k == key]
            assert mine == [v for k, v in expected if k == key]


def test_a_replayed_task_writes_nothing_twice(
    config: ProducerConfig, new_topic: Callable[..., str], tidelog_bootstrap: str
) -> None:
    topic = new_topic(partitions=3)
    items = rows(3000)
    key = f"spark-sink/test-{uuid.uuid4()}/0/0"

    first = run_task(config, topic, key, iter(arrow_batches(items, 500)))
    assert not first.replay and first.total == 3000

    # Spark replays the batch: the same writer key, the same rows.
    again = run_task(config, topic, key, iter(arrow_batches(items, 500)))
    assert again.replay
    assert again.total == 3000 and again.total_resent == 0
    check_once(tidelog_bootstrap, topic, 3, items)


def test_a_replay_in_another_order_is_still_exact_when_the_first_attempt_finished(
    config: ProducerConfig, new_topic: Callable[..., str], tidelog_bootstrap: str
) -> None:
    """After a shuffle the rows of a replayed task may come in another order:
    a complete earlier attempt is recognised by its seals (counts only)."""
    topic = new_topic(partitions=2)
    items = rows(2000)
    key = f"spark-sink/test-{uuid.uuid4()}/3/1"
    run_task(config, topic, key, iter(arrow_batches(items, 300)))
    again = run_task(config, topic, key, iter(arrow_batches(items[::-1], 300)))
    assert again.replay and again.total_resent == 0
    check_once(tidelog_bootstrap, topic, 2, items)


def test_a_task_that_died_half_way_is_completed_by_its_retry(
    config: ProducerConfig, new_topic: Callable[..., str], tidelog_bootstrap: str
) -> None:
    topic = new_topic(partitions=2)
    items = rows(4000)
    key = f"spark-sink/test-{uuid.uuid4()}/5/0"
    batches = arrow_batches(items, 250)

    with pytest.raises(RuntimeError, match="task killed"):
        run_task(config, topic, key, failing_after(batches, 9))
    partial = sum(len(r) for r in read_all(tidelog_bootstrap, topic, 2).values())
    assert 0 < partial < 4000, "the first attempt should have written a part"

    retry = run_task(config, topic, key, iter(batches))
    assert retry.replay and 0 < retry.total_resent < 4000
    check_once(tidelog_bootstrap, topic, 2, items)
    # And a third attempt (the batch replayed once more) adds nothing.
    third = run_task(config, topic, key, iter(batches))
    assert third.total_resent == 0
    check_once(tidelog_bootstrap, topic, 2, items)


def test_rows_without_key_spread_round_robin_and_replay_exactly(
    config: ProducerConfig, new_topic: Callable[..., str], tidelog_bootstrap: str
) -> None:
    topic = new_topic(partitions=3)
    values = [f"v{i}".encode() for i in range(100)]
    batch = pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], names=["value"])
    key = f"spark-sink/test-{uuid.uuid4()}/0/0"
    first = run_task(config, topic, key, iter([batch]))
    assert sorted(first.records.values()) == [33, 33, 34]
    run_task(config, topic, key, iter([batch]))
    written = read_all(tidelog_bootstrap, topic, 3)
    assert sorted(v for r in written.values() for _, v in r) == sorted(values)


def test_a_replay_that_does_not_line_up_fails_by_name(
    config: ProducerConfig, new_topic: Callable[..., str], tidelog_bootstrap: str
) -> None:
    """A replayed task with more rows than its earlier attempt wrote in
    full cannot be matched: it fails rather than guess."""
    topic = new_topic(partitions=1)
    key = f"spark-sink/test-{uuid.uuid4()}/0/0"
    # Many batches: the earlier ones fall out of what the broker remembers.
    run_task(config, topic, key, iter(arrow_batches(rows(3000), 500)))
    with pytest.raises(sink_task.ReplayMismatchError, match="lines up"):
        run_task(config, topic, key, iter(arrow_batches(rows(3000, start=10_000)[:2500], 500)))
