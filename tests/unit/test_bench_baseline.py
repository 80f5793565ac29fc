"""The benchmark regression guard (bench/baseline.py): every figure that
moved more than 15% either way is reported, better or worse, never failed."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bench import baseline

DOC = {
    "machine": {"cpu_count": 2, "cpu_model": "x"},
    "results": [
        {
            "workload": "consume_100B_5M",
            "system": "tidelog",
            "records_per_s": 1_000_000.0,
            "p99_ms": None,
            "cpu_s_per_million": {"broker": 0.2, "client": 0.5},
        },
        {"workload": "e2e_latency_10k", "system": "tidelog", "p99_ms": 4.0},
    ],
    "ratios": [{"workload": "consume_100B_5M", "vs": "kafka", "records_per_s": 0.8}],
    "micro": [{"layout": "columnar", "encode_ns": 75.0, "decode_ns": 150.0}],
}


def test_a_run_is_flattened_into_named_figures() -> None:
    assert baseline.figures(DOC) == {
        "consume_100B_5M/tidelog/records_per_s": 1_000_000.0,
        "consume_100B_5M/tidelog/cpu_s_per_million_broker": 0.2,
        "consume_100B_5M/tidelog/cpu_s_per_million_client": 0.5,
        "e2e_latency_10k/tidelog/p99_ms": 4.0,
        "consume_100B_5M/vs_kafka/records_per_s_ratio": 0.8,
        "codec/columnar/encode_ns": 75.0,
        "codec/columnar/decode_ns": 150.0,
    }


def test_moves_over_the_threshold_either_way_are_reported_better_or_worse() -> None:
    old = {"figures": {"a/records_per_s": 100.0, "b/p99_ms": 10.0, "c/p99_ms": 10.0, "d/x": 1.0}}
    new = {"figures": {"a/records_per_s": 80.0, "b/p99_ms": 5.0, "c/p99_ms": 11.0, "e/y": 1.0}}
    lines = baseline.compare(old, new)
    assert any("WORSE" in line and "-20%" in line and "a/records_per_s" in line for line in lines)
    assert any("better" in line and "-50%" in line and "b/p99_ms" in line for line in lines)
    assert not any("c/p99_ms" in line for line in lines)  # +10%: within 15%
    assert any("not measured this run" in line and "d/x" in line for line in lines)
    assert any("new figures" in line and "e/y" in line for line in lines)


def test_update_then_compare_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = copy.deepcopy(DOC)
    results = tmp_path / "results"
    results.mkdir()
    (results / "latest.json").write_text(json.dumps(doc))
    (results / "group_bench.json").write_text(
        json.dumps({"figures": {"commits_1p/coalesced/requests_per_s": 2000.0}})
    )
    monkeypatch.setattr(baseline, "BASELINES", tmp_path / "baselines")
    monkeypatch.setattr(baseline, "ROOT", tmp_path)
    assert baseline.main(["update", "--results", str(results), "--kind", "k"]) == 0
    stored = json.loads((tmp_path / "baselines" / "k.json").read_text())
    assert stored["figures"]["group/commits_1p/coalesced/requests_per_s"] == 2000.0
    doc["results"][0]["records_per_s"] = 500_000.0  # type: ignore[index]
    (results / "latest.json").write_text(json.dumps(doc))
    assert baseline.main(["compare", "--results", str(results), "--kind", "k"]) == 0
    out = capsys.readouterr().out
    assert "WORSE" in out and "bench/consume_100B_5M/tidelog/records_per_s" in out
