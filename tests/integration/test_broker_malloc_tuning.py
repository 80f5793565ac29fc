"""A real broker process applies `--malloc-tuning` at start, and serving fetch answers
then stops faulting in fresh pages (issue 15: ~250 page faults per thousand 1 KiB records
consumed with glibc's defaults). Runs bench/malloc_ab.py's workloads on a small log, once
with the broker's allocator `off` and once `default`, and compares the broker's minor page
faults (/proc/PID/stat) per million records consumed."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidelog_broker.malloc_tuning import glibc

from bench import malloc_ab

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(glibc() is None, reason="needs glibc (the broker's mallopt tuning)"),
]

SCALE = 0.01  # 50k 100 B records and 20k 1 KiB records: ~20 MiB of fetch answers
#: The 1 KiB records one_run produces and consumes at SCALE.
KIB_RECORDS = int(malloc_ab.KIB_RECORDS_AT_FULL_SCALE * SCALE)


def _consume_faults_per_million(tmp_path: Path, mode: str) -> int:
    rows = malloc_ab.one_run(tmp_path, mode, 0, SCALE)
    (row,) = [r for r in rows if r["workload"] == "consume_1KB"]
    # Every record of the log was read (what the faults are counted per).
    assert row["records"] == KIB_RECORDS, row
    return int(row["broker_faults_per_m"])


def test_a_tuned_broker_serves_fetch_answers_without_fresh_page_faults(tmp_path: Path) -> None:
    untuned = _consume_faults_per_million(tmp_path, "off")
    tuned = _consume_faults_per_million(tmp_path, "default")
    # ~250k per million untuned (one fresh 1 MiB buffer or more per answer); ~0 tuned.
    assert untuned > 50_000
    assert tuned < untuned // 10, (tuned, untuned)
