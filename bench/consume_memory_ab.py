"""A/B of the consumer's C record loop and its freed-memory reuse
(sdk/tidelog/_crecords.c, sdk/tidelog/_memory_reuse.py).

    .venv/bin/python -m bench.consume_memory_ab [--repeat 3] [--scale 1.0]

One broker holds the bench's three consume logs (100 B x 5M, 1 KiB x 2M, and the
paper's 200 B x 10M read with 200 KB fetches; `--scale` shrinks them). Each run reads
all three through workloads.consume in a fresh interpreter per variant (the
allocators are process-wide), the variants in rotating order:

- python:      the Python record loop, freed_memory_kept_bytes=0 (what came before)
- c:           the C record loop, freed_memory_kept_bytes=0
- c+kept:      the C record loop and the default 64 MiB of freed memory kept

Per workload and variant: records/s, the client's CPU seconds and minor page faults per
million records, medians over the runs; written to --output as JSON.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import workloads
from bench._processes import tmpdir
from tests.support.processes import start_broker

ROOT = Path(__file__).resolve().parents[1]

MIB = 1024 * 1024
#: variant -> (C record loop, freed_memory_kept_bytes)
VARIANTS = {"python": (False, 0), "c": (True, 0), "c+kept": (True, 64 * MIB)}
#: (workload, record bytes, records at scale 1.0, fetch bytes): the bench's own.
LOGS = (
    ("consume_100B", 100, 5_000_000, None),
    ("consume_1KB", 1024, 2_000_000, None),
    ("paper_consume", 200, 10_000_000, 200 * 1000),
)


def _topic(workload: str) -> str:
    return f"ab-{workload}"


def child(address: str, broker_pid: int, variant: str, scale: float) -> None:
    """Read every log with one variant; one JSON row per workload on stdout."""
    from tidelog import records

    c_loop, kept = VARIANTS[variant]
    if c_loop and records._crecords is None:
        raise SystemExit("tidelog._crecords is not built: nothing to compare")
    if not c_loop:
        records._build_records = records._build_records_py
    for workload, record_bytes, count, fetch_bytes in LOGS:
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        result = workloads.consume(
            address,
            broker_pid,
            _topic(workload),
            int(count * scale),
            record_bytes,
            workload=workload,
            fetch_bytes=fetch_bytes,
            consumer_options={"freed_memory_kept_bytes": kept},
        )
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
        row = {
            "variant": variant,
            "workload": workload,
            "records": result["records"],
            "records_per_s": result["records_per_s"],
            "client_cpu_s_per_m": result["cpu_s_per_million"]["client"],
            "client_faults_per_m": round(faults * 1e6 / max(1, result["records"])),
        }
        print(json.dumps(row), flush=True)


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    keys = ("records_per_s", "client_cpu_s_per_m", "client_faults_per_m")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for workload, *_ in LOGS:
        out[workload] = {}
        for variant in VARIANTS:
            mine = [r for r in rows if r["workload"] == workload and r["variant"] == variant]
            out[workload][variant] = {k: statistics.median(r[k] for r in mine) for k in keys}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per variant (default 3)")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the bench's sizes")
    ap.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "memory_ab.json")
    ap.add_argument("--child", nargs=3, metavar=("ADDRESS", "BROKER_PID", "VARIANT"))
    args = ap.parse_args(argv)
    if args.child:
        address, pid, variant = args.child
        child(address, int(pid), variant, args.scale)
        return 0
    rows: list[dict[str, Any]] = []
    with tmpdir("tidelog-memory-ab-") as root:
        broker = start_broker(root / "broker", extra_args=("--auto-create-topics",))
        try:
            for workload, record_bytes, count, _ in LOGS:
                workloads.produce(
                    broker.address,
                    broker.pid,
                    _topic(workload),
                    int(count * args.scale),
                    record_bytes,
                    workload=workload,
                )
            names = list(VARIANTS)
            for run in range(args.repeat):
                for variant in names[run % len(names) :] + names[: run % len(names)]:
                    out = subprocess.run(
                        [sys.executable, "-m", "bench.consume_memory_ab", "--scale",
                         str(args.scale), "--child", broker.address, str(broker.pid), variant],
                        cwd=ROOT, capture_output=True, text=True, check=True,
                    ).stdout  # fmt: skip
                    for line in out.splitlines():
                        if line.startswith("{"):
                            rows.append({"run": run, **json.loads(line)})
                            print(line, flush=True)
        finally:
            broker.stop()
    summary = summarize(rows)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"rows": rows, "medians": summary}, indent=1))
    print(f"{'workload':<16}{'variant':<10}{'rec/s':>12}{'client cpu/M':>14}{'faults/M':>10}")
    for workload, variants in summary.items():
        for variant, m in variants.items():
            print(
                f"{workload:<16}{variant:<10}{m['records_per_s']:>12.0f}"
                f"{m['client_cpu_s_per_m']:>14.3f}{m['client_faults_per_m']:>10.0f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
