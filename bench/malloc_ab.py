"""A/B of the broker's `--malloc-tuning` (services/broker/tidelog_broker/malloc_tuning.py).

    .venv/bin/python -m bench.malloc_ab [--repeat 3] [--client-tuning default]

For each run, in alternating order, a broker is started with `--malloc-tuning off` and one
with `--malloc-tuning default`; each produces and consumes the bench's logs (5M 100 B
records, 2M 1 KiB records; `--scale` shrinks them) through workloads.produce/consume. Per
workload: records/s, the broker's CPU seconds and minor page faults per million records
(/proc/PID/stat minflt), the client's faults (this process), and the broker's peak RSS
(VmHWM) over its life. Medians per mode are printed and written to --output as JSON.

`--client-tuning SPEC` applies the same mallopt settings to this process (the SDK
consumer's) first, to measure what the tuning would do on the client side; with the default
`off` the consumers' own (ConsumerConfig.freed_memory_kept_bytes) is kept off too.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import sys
from pathlib import Path
from typing import Any

from tidelog import _memory_reuse
from tidelog_broker.malloc_tuning import apply_malloc_tuning, parse_malloc_tuning

from bench import workloads
from bench._processes import hwm_mb, tmpdir
from tests.support.processes import start_broker

ROOT = Path(__file__).resolve().parents[1]

MODES = ("off", "default")
#: The logs of one run at scale 1.0: the bench's own consume workloads' sizes
#: (consume_100B_5M, consume_1KB_2GB's 2M records).
SMALL_RECORDS_AT_FULL_SCALE = 5_000_000
KIB_RECORDS_AT_FULL_SCALE = 2_000_000


def broker_minflt(pid: int) -> int:
    """Minor page faults of a live process so far (/proc/PID/stat field 10)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[7])


def client_minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def one_run(root: Path, mode: str, run: int, scale: float) -> list[dict[str, Any]]:
    """One broker started with `--malloc-tuning MODE` (`off`, `default` or key=value
    pairs); its rows, one per workload."""
    # A key=value mode names a directory and topics: letters, digits and '-' only.
    slug = re.sub(r"[^a-z0-9]+", "-", mode.lower()).strip("-")
    data = root / f"{slug}-{run}"
    broker = start_broker(data, extra_args=("--auto-create-topics", "--malloc-tuning", mode))
    rows: list[dict[str, Any]] = []
    try:
        for record_bytes, count in (
            (100, int(SMALL_RECORDS_AT_FULL_SCALE * scale)),
            (1024, int(KIB_RECORDS_AT_FULL_SCALE * scale)),
        ):
            topic = f"ab-{record_bytes}-{slug}-{run}"
            label = "100B" if record_bytes == 100 else "1KB"
            for kind in ("produce", "consume"):
                broker0, client0 = broker_minflt(broker.pid), client_minflt()
                fn = workloads.produce if kind == "produce" else workloads.consume
                result = fn(
                    broker.address,
                    broker.pid,
                    topic,
                    count,
                    record_bytes,
                    workload=f"{kind}_{label}",
                )
                per_m = 1e6 / max(1, result["records"])
                rows.append(
                    {
                        "mode": mode,
                        "run": run,
                        "workload": f"{kind}_{label}",
                        "records": result["records"],
                        "records_per_s": result["records_per_s"],
                        "broker_cpu_s_per_m": result["cpu_s_per_million"]["broker"],
                        "client_cpu_s_per_m": result["cpu_s_per_million"]["client"],
                        "broker_faults_per_m": round((broker_minflt(broker.pid) - broker0) * per_m),
                        "client_faults_per_m": round((client_minflt() - client0) * per_m),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
            workloads.delete_topic(broker.address, topic)
        peak = hwm_mb(broker.pid)
        for row in rows:
            row["broker_peak_rss_mb"] = peak
    finally:
        broker.stop()
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    keys = (
        "records_per_s",
        "broker_cpu_s_per_m",
        "client_cpu_s_per_m",
        "broker_faults_per_m",
        "client_faults_per_m",
        "broker_peak_rss_mb",
    )
    out: dict[str, dict[str, dict[str, float]]] = {}
    for workload in dict.fromkeys(row["workload"] for row in rows):
        out[workload] = {}
        for mode in MODES:
            mine = [r for r in rows if r["workload"] == workload and r["mode"] == mode]
            out[workload][mode] = {k: statistics.median(r[k] for r in mine) for k in keys}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode (default 3)")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the bench's sizes")
    ap.add_argument("--client-tuning", default="off", help="mallopt for this process too")
    ap.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "malloc_ab.json")
    args = ap.parse_args(argv)
    # The SDK's consumers would tune this process themselves: only what is asked for here.
    _memory_reuse.leave_alone()
    print("client tuning:", apply_malloc_tuning(parse_malloc_tuning(args.client_tuning)))
    rows: list[dict[str, Any]] = []
    with tmpdir("tidelog-malloc-ab-") as root:
        for run in range(args.repeat):
            for mode in MODES if run % 2 == 0 else MODES[::-1]:
                rows += one_run(root, mode, run, args.scale)
    summary = summarize(rows)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"rows": rows, "medians": summary}, indent=1))
    print(
        f"{'workload':<14}{'mode':<9}{'rec/s':>10}{'cpu/M':>8}{'faults/M':>10}"
        f"{'client cpu/M':>13}{'client flt/M':>13}{'peak RSS':>10}"
    )
    for workload, modes in summary.items():
        for mode, m in modes.items():
            print(
                f"{workload:<14}{mode:<9}{m['records_per_s']:>10.0f}"
                f"{m['broker_cpu_s_per_m']:>8.3f}{m['broker_faults_per_m']:>10.0f}"
                f"{m['client_cpu_s_per_m']:>13.3f}{m['client_faults_per_m']:>13.0f}"
                f"{m['broker_peak_rss_mb']:>10.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
