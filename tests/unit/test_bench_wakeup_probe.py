"""bench/wakeup_probe.py: the machine's wake-up latency, the yardstick of the latency rows,
measured with a real child process and a real thread."""

from __future__ import annotations

import pytest

from bench import wakeup_probe


@pytest.mark.timeout(60)
def test_the_probe_times_every_wake_up_of_the_child_and_the_thread() -> None:
    row = wakeup_probe.measure(rate=2_000, seconds=0.5, workload="wakeup_test")
    assert (row["workload"], row["system"]) == ("wakeup_test", "machine")
    # Every paced send is one wake-up the child timed: none lost, none stale from before it ran.
    assert row["records"] == 1_000
    assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["p999_ms"] < 1_000
    thread = row["detail"]["thread_event"]
    assert 0 < thread["p50_ms"] <= thread["p99_ms"] <= thread["p999_ms"] < 1_000
