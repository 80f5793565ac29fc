"""The bench's A/B tools run each side's own code: `bench._checkout.export` (the "before"
side of bench.e2e_ab, bench.columnar_ab and bench.gateway_records_ab) gives a ref's SDK its
own compiled modules, and `python -m bench.e2e_ab` runs both sides end to end and says which
code each run imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import _checkout
from bench.e2e_ab import THIS, summarize

ROOT = Path(__file__).resolve().parents[2]

_IMPORTED = (
    "import json, tidelog, tidelog.records as r, tidelog._accumulator as a; "
    "print(json.dumps([tidelog.__file__, getattr(r._crecords, '__file__', None), "
    "getattr(a._cproduce, '__file__', None)]))"
)


@pytest.mark.timeout(300)
def test_an_exported_ref_runs_its_own_compiled_modules(tmp_path: Path) -> None:
    # Without its own build, the export's Python would load this work tree's C modules
    # (the editable install's import hook finds them): a C change measured against itself.
    pythonpath = _checkout.export("HEAD", tmp_path)
    env = {**os.environ, "PYTHONPATH": pythonpath}
    out = subprocess.run(
        [sys.executable, "-c", _IMPORTED],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    imported = json.loads(out.stdout)
    assert Path(imported[0]).is_relative_to(tmp_path), imported
    compiled = _checkout.compiled_modules()
    for name, path in zip(("_crecords", "_cproduce"), imported[1:], strict=True):
        if name in compiled:
            assert path is not None and Path(path).is_relative_to(tmp_path), imported
        else:  # no C compiler here: both sides run the pure-Python paths alike
            assert path is None, imported


def test_export_of_an_unknown_ref_names_it(tmp_path: Path) -> None:
    with pytest.raises(_checkout.CheckoutError, match="no-such-ref-xyz"):
        _checkout.export("no-such-ref-xyz", tmp_path)


@pytest.mark.timeout(600)
def test_e2e_ab_runs_both_sides_and_compares_them(tmp_path: Path) -> None:
    output = tmp_path / "runs.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "bench.e2e_ab", "--base", "HEAD", "--pairs", "1",
            "--layouts", "2proc,async", "--rate", "500", "--seconds", "1",
            "--warmup-s", "0.5", "--output", str(output),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=540, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(output.read_text())
    assert doc["base"] == "HEAD"
    for layout in ("2proc", "async"):
        sides = doc["runs"][layout]
        assert set(sides) == {"HEAD", THIS}
        for side, results in sides.items():
            (result,) = results
            assert result["records"] == result["detail"]["measured"] == 500, (layout, side)
            assert 0 < result["p50_ms"] <= result["p99_ms"], (layout, side)
            on_this_tree = Path(result["code"]["sdk"]).is_relative_to(ROOT)
            assert on_this_tree == (side == THIS), (layout, side, result["code"])
        assert f"{THIS} / HEAD: p50" in proc.stdout, proc.stdout
    assert "rounds" in proc.stdout


def _result(p50: float, p99: float, p999: float) -> dict[str, object]:
    return {
        "p50_ms": p50,
        "p99_ms": p99,
        "p999_ms": p999,
        "cpu_s_per_million": {"broker": 70.0, "client": 60.0},
    }


def test_summary_gives_medians_ratios_and_rounds_won() -> None:
    runs = {
        "2proc": {
            "main": [_result(2, 6, 9), _result(2, 5, 8), _result(2, 7, 10)],
            THIS: [_result(1, 3, 9), _result(1, 6, 8), _result(1, 5, 12)],
        }
    }
    lines = summarize(runs, "main")  # type: ignore[arg-type]
    assert lines[0] == "2proc (e2e_latency_10k_2proc):"
    assert "p99   6.00 (5.00-7.00)" in lines[1]
    assert "p99   5.00 (3.00-6.00)" in lines[2]
    # Medians: p50 1/2, p99 5/6, p99.9 9/9; rounds 1 and 3 had the lower p99 here.
    assert lines[3] == f"  {THIS} / main: p50 0.50x, p99 0.83x, p99.9 1.00x; " + (
        f"{THIS}'s p99 lower in 2 of 3 rounds"
    )
