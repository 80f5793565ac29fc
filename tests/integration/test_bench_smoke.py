"""Smoke test of the benchmark harness: `python -m bench --quick` (Tidelog only, no Kafka)
runs to the end and writes a latest.json in the issue-2 schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = ("workload", "system", "records_per_s", "mb_per_s", "p50_ms", "p99_ms", "rss_mb")


@pytest.mark.timeout(120)
def test_quick_bench_writes_valid_latest_json(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--no-docs", "--output", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "latest.json").read_text())
    failed = [note for note in doc["notes"] if "failed" in note]
    assert not failed, f"{failed}\n{proc.stderr[-3000:]}"

    assert {"cpu_count", "cpu_model", "memory_gb", "python", "kernel"} <= doc["machine"].keys()
    assert doc["date"]
    results = doc["results"]
    for row in results:
        missing = [key for key in REQUIRED if key not in row]
        assert not missing, f"{row['workload']}/{row['system']} lacks {missing}"
        assert {"broker", "client"} <= row["cpu_s_per_million"].keys()
    tidelog = {r["workload"]: r for r in results if r["system"] == "tidelog"}
    for workload in ("produce_100B", "consume_100B_5M", "produce_1KB", "consume_1KB_2GB"):
        # Every record asked for was written or read (how fast: the bench's figure).
        assert tidelog[workload]["records"] > 0, workload
        assert tidelog[workload]["rss_mb"] > 0, workload
        assert "short_by" not in tidelog[workload]["detail"], workload
    # The columnar consume (poll_arrow) read every record of the same logs, checked.
    for workload in ("consume_100B_5M", "consume_1KB_2GB"):
        arrow = tidelog[f"{workload}_arrow"]
        assert arrow["records"] == tidelog[workload]["records"], workload
        assert arrow["detail"]["checked"]["rows"] == tidelog[workload]["records"], workload
    assert {r["workload"] for r in doc["ratios"]} >= {"consume_100B_5M_arrow"}
    for variant in ("e2e_latency_10k", "e2e_latency_10k_2proc", "e2e_latency_10k_async"):
        e2e = tidelog[variant]
        assert 0 < e2e["p50_ms"] <= e2e["p99_ms"], variant
        assert e2e["records"] == e2e["detail"]["measured"] > 0, variant
    assert any(r["system"] == "grpc-ceiling" for r in results)
    assert {c["status"] for c in doc["checks"]} <= {"PASS", "BELOW"}
    assert len(doc["micro"]) == 2
    assert "PASS" in proc.stdout or "BELOW" in proc.stdout


@pytest.mark.timeout(180)
def test_quick_gateway_bench_compares_through_the_gateway_with_direct(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gateway_bench", "--quick", "--output", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=160,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "gateway.json").read_text())
    summary = doc["summary"]
    for workload in ("produce_100B", "consume_100B"):
        assert summary[workload]["direct"] > 0 and summary[workload]["gateway"] > 0, workload
        assert summary[workload]["ratio"] > 0
    for q in ("p50_ms", "p99_ms"):
        assert summary["e2e_latency_10k"][q]["direct"] > 0
        assert summary["e2e_latency_10k"][q]["gateway"] > 0
    assert summary["idle_consume_streams"]["rss_peak_mib"] > 0
    assert all("short_by" not in r["detail"] for r in doc["results"])
