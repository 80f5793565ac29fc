"""Regression guard: this run's figures against a committed baseline.

``python -m bench.baseline compare`` (the last step of ``make bench``) reads the
figures the benchmarks wrote (``bench/results/latest.json`` from ``python -m
bench``, ``bench/results/group_bench.json`` from ``python -m bench.group_bench``,
``bench/results/gateway.json`` from ``python -m bench.gateway_bench``)
and prints every figure that moved by more than 15% either way from
``bench/baselines/<machine kind>.json``, saying whether the move is better or
worse. It is a report, never a failure: this machine is shared and noisy, so a
move is a reason to look (rerun, compare within one run), not a verdict.

``python -m bench.baseline update`` (``make bench-baseline``) writes this run's
figures as the new baseline; commit it with the change that moved them.

The machine kind is ``$TIDELOG_BENCH_MACHINE``, else ``polyglot`` (the 2-core
machines of this workplace); a baseline taken on a different CPU is still
compared, with a warning.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from bench import report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BASELINES = ROOT / "bench" / "baselines"
THRESHOLD = 0.15
#: Inputs, by the name their figures get (the file may be missing: not run).
SOURCES = {"bench": "latest.json", "group": "group_bench.json", "gateway": "gateway.json"}

#: Figures where a larger value is better; every other one is a time, a
#: latency, CPU or memory, where smaller is better.
_HIGHER_IS_BETTER = (
    "records_per_s",
    "mb_per_s",
    "requests_per_s",
    "offsets_per_s",
    "ratio",
    "commits_per_txn",
)


def machine_kind() -> str:
    return os.environ.get("TIDELOG_BENCH_MACHINE", "").strip() or "polyglot"


def figures(doc: dict[str, Any]) -> dict[str, float]:
    """The numbers of one `python -m bench` latest.json, flat, by name."""
    out: dict[str, float] = {}
    for r in doc.get("results", []):
        name = f"{r['workload']}/{r['system']}"
        for metric in ("records_per_s", "p50_ms", "p99_ms", "p999_ms", "rss_mb"):
            if r.get(metric) is not None:
                out[f"{name}/{metric}"] = float(r[metric])
        for side, value in (r.get("cpu_s_per_million") or {}).items():
            if value is not None:
                out[f"{name}/cpu_s_per_million_{side}"] = float(value)
    for e in doc.get("ratios", []):
        for key, value in e.items():
            if key not in ("workload", "vs") and isinstance(value, int | float):
                out[f"{e['workload']}/vs_{e['vs']}/{key}_ratio"] = float(value)
    for row in doc.get("micro", []):
        for key in ("encode_ns", "decode_ns"):
            if row.get(key) is not None:
                out[f"codec/{row['layout']}/{key}"] = float(row[key])
    return out


def current(results: Path = RESULTS) -> dict[str, Any]:
    """This run's figures, from every benchmark output present."""
    found: dict[str, float] = {}
    machine: dict[str, Any] = {}
    for prefix, file in SOURCES.items():
        path = results / file
        if not path.is_file():
            continue
        doc = json.loads(path.read_text())
        machine = machine or doc.get("machine", {})
        if prefix == "bench":
            flat = figures(doc)
        elif prefix == "gateway":  # its runs, one per repeat: their medians
            flat = figures({"results": report.aggregate(doc.get("results", []))})
        else:
            flat = doc.get("figures", {})
        found.update({f"{prefix}/{k}": float(v) for k, v in flat.items()})
    return {"machine": machine, "figures": found}


def _higher_is_better(name: str) -> bool:
    return any(name.endswith(s) or f"/{s}" in name for s in _HIGHER_IS_BETTER)


def compare(
    baseline: dict[str, Any], now: dict[str, Any], threshold: float = THRESHOLD
) -> list[str]:
    """One line per figure that moved by more than `threshold` (either way),
    then the figures present on one side only."""
    old, new = baseline.get("figures", {}), now.get("figures", {})
    lines = []
    for name in sorted(set(old) & set(new)):
        before, after = old[name], new[name]
        if before == 0:
            continue
        change = (after - before) / abs(before)
        if abs(change) <= threshold:
            continue
        better = (change > 0) == _higher_is_better(name)
        lines.append(
            f"  {'better' if better else 'WORSE ':<6} {change:+7.0%}  {name}: "
            f"{before:,.4g} -> {after:,.4g}"
        )
    missing = sorted(set(old) - set(new))
    if missing:
        lines.append(f"  not measured this run ({len(missing)}): {', '.join(missing[:8])}" +
                     (" ..." if len(missing) > 8 else ""))  # fmt: skip
    added = sorted(set(new) - set(old))
    if added:
        lines.append(f"  new figures, not in the baseline ({len(added)}): "
                     f"{', '.join(added[:8])}" + (" ..." if len(added) > 8 else ""))  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.baseline", description=__doc__)
    ap.add_argument("action", choices=("compare", "update"))
    ap.add_argument("--results", type=Path, default=RESULTS, help="where the runs wrote JSON")
    ap.add_argument("--kind", default=machine_kind(), help="machine kind (baseline file name)")
    ap.add_argument("--threshold", type=float, default=THRESHOLD)
    args = ap.parse_args(argv)
    path = BASELINES / f"{args.kind}.json"
    now = current(args.results)
    if not now["figures"]:
        print(f"no benchmark results in {args.results}: run make bench first")
        return 0
    if args.action == "update":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(now, indent=2, sort_keys=True) + "\n")
        print(f"wrote {len(now['figures'])} figures to {path}")
        return 0
    if not path.is_file():
        print(f"no baseline for machine kind {args.kind!r} ({path}): make bench-baseline")
        return 0
    baseline = json.loads(path.read_text())
    print(f"\nAgainst the baseline {path.relative_to(ROOT)} (moves over {args.threshold:.0%}):")
    was, now_m = baseline.get("machine", {}), now["machine"]
    for key in ("cpu_model", "cpu_count"):
        if was.get(key) and now_m.get(key) and was[key] != now_m[key]:
            print(f"  warning: the baseline ran on {key} {was[key]!r}, this run on {now_m[key]!r}")
    lines = compare(baseline, now, args.threshold)
    print("\n".join(lines) if lines else "  every figure within the threshold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
