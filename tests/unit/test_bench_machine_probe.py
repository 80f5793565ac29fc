"""bench/machine_probe.py: the machine's speed and wake-up latency, the yardsticks of a run,
measured with a real child process and a real thread."""

from __future__ import annotations

import pytest

from bench import machine_probe


@pytest.mark.timeout(60)
def test_the_probe_times_every_wake_up_of_the_child_and_the_thread() -> None:
    row = machine_probe.measure(rate=2_000, seconds=0.5, workload="wakeup_test")
    assert (row["workload"], row["system"]) == ("wakeup_test", "machine")
    # Every paced send is one wake-up the child timed: none lost, none stale from before it ran.
    assert row["records"] == 1_000
    assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["p999_ms"]
    thread = row["detail"]["thread_wakeup"]
    assert 0 < thread["p50_ms"] <= thread["p99_ms"] <= thread["p999_ms"]


@pytest.mark.timeout(60)
def test_python_speed_is_a_throughput_row_of_the_machine() -> None:
    row = machine_probe.python_speed()
    assert (row["workload"], row["system"]) == ("python_speed", "machine")
    # A count of loop iterations, whatever the machine's speed (the speed itself is
    # the benchmark's figure, not this test's).
    assert row["records_per_s"] > 0
    # records is the rate as a whole number: the two are rounded from one float.
    assert abs(row["records"] - row["records_per_s"]) <= 1
    assert row["p99_ms"] is None and row["cpu_s_per_million"] == {"broker": None, "client": None}
