"""A Spark driver killed with SIGKILL between a micro-batch's writes and its
commit: the query restarted from its checkpoint (a new driver process) runs
the batch again with the same batch id, and the sink writes nothing twice.

The drivers are processes of their own (tests/spark/sink_driver.py), each in
its own process group so that the kill takes the JVM and Spark's Python
workers with it; both groups are killed by id at the end whatever happens."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.spark.readback import read_topic

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

DRIVER = Path(__file__).with_name("sink_driver.py")


def read_values(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    return sorted(r.value for r in read_topic(bootstrap, topic, partitions))


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver's process group (its id is the driver's pid)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_a_driver_killed_between_write_and_commit_writes_nothing_twice(
    spark_runnable: object,  # Java and pyspark are there (else a skip); no session here
    new_topic: Callable[..., str],
    produce: Callable[..., None],
    tidelog_bootstrap: str,
    tmp_path: Path,
) -> None:
    source = new_topic(partitions=2, suffix="-in")
    sink = new_topic(partitions=2, suffix="-out")
    expected = sorted(f"event-{i:04d}".encode() for i in range(300))
    produce(source, expected, keys=[b"a", b"b", b"c"] * 100)
    checkpoint, marker = tmp_path / "checkpoint", tmp_path / "in-commit"
    common = [sys.executable, str(DRIVER), tidelog_bootstrap, source, sink, str(checkpoint)]
    logs = (tmp_path / "driver-1.log").open("wb")
    first = subprocess.Popen(
        [*common, str(tmp_path / "scratch-1"), "--hang-in-commit", "1", "--marker", str(marker)],
        stdout=logs,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    second = None
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert first.poll() is None, (tmp_path / "driver-1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "batch 1 never reached its commit"
            time.sleep(0.2)
        # Batch 1 is written and not committed: kill the driver there.
        kill_group(first)
        written = read_values(tidelog_bootstrap, sink, 2)
        assert len(written) == 200, "batches 0 and 1 should be written before the kill"

        second = subprocess.Popen(
            [*common, str(tmp_path / "scratch-2")],
            stdout=(tmp_path / "driver-2.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert second.wait(timeout=600) == 0, (tmp_path / "driver-2.log").read_text()[-3000:]
        assert read_values(tidelog_bootstrap, sink, 2) == expected
    finally:
        kill_group(first)
        if second is not None:
            kill_group(second)
