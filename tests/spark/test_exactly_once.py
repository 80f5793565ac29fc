"""Exactly once with checkpoints: a query stopped and started again from its
checkpoint, and one whose driver is killed with SIGKILL in the middle of a
batch, deliver every record exactly once into an idempotent sink."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.spark.queries import await_end

pytestmark = pytest.mark.timeout(420)

REPO = Path(__file__).resolve().parents[2]


def produce_spread(produce: Callable[..., None], topic: str, partitions: int, count: int,
                   tag: str) -> list[str]:  # fmt: skip
    values = []
    for p in range(partitions):
        batch = [f"{tag}-{p}-{i}" for i in range(count)]
        produce(topic, [v.encode() for v in batch], partition=p)
        values.extend(batch)
    return values


def test_a_query_stopped_and_restarted_from_its_checkpoint_delivers_each_record_once(
    spark: Any,
    tidelog_bootstrap: str,
    new_topic: Callable[..., str],
    produce: Callable[..., None],
    tmp_path: Path,
) -> None:
    topic = new_topic(partitions=3)
    expected = produce_spread(produce, topic, 3, 60, "first")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(trigger: dict[str, Any]) -> Any:
        df = (
            spark.readStream.format("tidelog")
            .option("tidelog.bootstrap.servers", tidelog_bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "45")
            .load()
            .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
        )
        # The file sink: exactly once through its own log (_spark_metadata).
        return (
            df.writeStream.format("json")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    query = start({"processingTime": "100 milliseconds"})
    deadline = time.monotonic() + 120
    while (query.lastProgress or {}).get("batchId", -1) < 1:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "two batches did not complete"
        time.sleep(0.05)
    query.stop()  # mid-stream, maybe in the middle of a batch
    expected += produce_spread(produce, topic, 3, 20, "second")
    query = start({"availableNow": True})
    error = await_end(query)
    assert error is None, error
    delivered = [r.value for r in spark.read.json(str(out)).collect()]
    duplicates = [v for v, n in Counter(delivered).items() if n > 1]
    assert not duplicates, duplicates[:10]
    assert sorted(delivered) == sorted(expected)


class Driver:
    """tests/spark/stream_driver.py in its own process; its events are read
    by a thread."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.spark.stream_driver", *args],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.events.append(json.loads(line))

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if predicate(list(self.events)):
                    return
            if self.proc.poll() is not None:
                raise AssertionError(f"the driver exited with {self.proc.returncode}")
            time.sleep(0.05)
        raise AssertionError(f"not seen within {timeout_s} s: {self.events}")

    def kill(self) -> None:
        """SIGKILL the driver: the Python process and, first, its JVM (the
        Spark driver proper) and the JVM's Python workers, each by PID."""
        family = psutil.Process(self.proc.pid).children(recursive=True)
        for child in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait(30)
        psutil.wait_procs(family, timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()


def test_a_driver_killed_in_the_middle_of_a_batch_loses_and_repeats_nothing(
    tidelog_bootstrap: str,
    new_topic: Callable[..., str],
    produce: Callable[..., None],
    tmp_path: Path,
    spark_runnable: Any,  # Java and pyspark are there (else a skip); the drivers are processes
) -> None:
    topic = new_topic(partitions=2)
    expected = produce_spread(produce, topic, 2, 60, "r")
    out = tmp_path / "out"
    common = [
        "--bootstrap", tidelog_bootstrap, "--topic", topic,
        "--checkpoint", str(tmp_path / "checkpoint"), "--out", str(out),
        "--scratch", str(tmp_path / "scratch"), "--max-offsets", "40",
    ]  # fmt: skip
    first = Driver([*common, "--batch-sleep", "1.5"], tmp_path / "driver-1.log")
    try:
        # Batch 0 done, batch 1 read but not written: kill it there.
        first.wait_for(lambda ev: {"event": "batch-start", "id": 1} in ev, timeout_s=180)
        first.kill()
    finally:
        first.stop()
    assert not (out / "batch-00001.json").exists()
    expected += produce_spread(produce, topic, 2, 20, "late")
    second = Driver([*common, "--available-now"], tmp_path / "driver-2.log")
    try:
        second.wait_for(lambda ev: {"event": "finished"} in ev, timeout_s=240)
        assert second.proc.wait(60) == 0
    finally:
        second.stop()
    # Batch 1 ran again, with the same id and the same offsets.
    assert {"event": "batch-start", "id": 1} in second.events
    delivered = []
    for path in sorted(out.glob("batch-*.json")):
        delivered.extend(value for _, _, value in json.loads(path.read_text()))
    duplicates = [v for v, n in Counter(delivered).items() if n > 1]
    assert not duplicates, duplicates[:10]
    assert sorted(delivered) == sorted(expected)
