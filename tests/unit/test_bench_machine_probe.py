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
    # The live probe: its shape only (its speed is the benchmark's figure,
    # `python -m bench.machine_probe`, whatever a loaded machine makes it).
    row = machine_probe.python_speed()
    assert (row["workload"], row["system"]) == ("python_speed", "machine")
    assert isinstance(row["records"], int) and isinstance(row["records_per_s"], float)
    assert row["p99_ms"] is None and row["cpu_s_per_million"] == {"broker": None, "client": None}


@pytest.mark.parametrize("speed", [3_052_999.96, 3_052_999.4, 2_500_000.0, 0.5])
def test_a_speed_row_carries_the_rate_and_the_same_rate_as_a_count(speed: float) -> None:
    # Fixed rates, including one CI measured (3052999.96: rounded to a tenth
    # it is 3053000.0, truncated 3052999).
    row = machine_probe.speed_row(speed)
    assert (row["workload"], row["system"]) == ("python_speed", "machine")
    assert row["records_per_s"] > 0
    assert abs(row["records"] - row["records_per_s"]) <= 1
    assert row["records_per_s"] == round(speed, 1) and row["records"] == round(speed)
    assert row["p99_ms"] is None and row["cpu_s_per_million"] == {"broker": None, "client": None}
