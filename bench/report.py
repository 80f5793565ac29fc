"""Aggregation of repeated runs, the printed table, latest.json, docs/benchmarks.md and .png."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

Result = dict[str, Any]

_METRICS = ("records_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms")
SYSTEM_ORDER = {"tidelog": 0, "kafka": 1, "grpc-ceiling": 2, "machine": 3}

#: Issue 2's targets: (workload, metric, at least / at most, value, label).
TARGETS: list[tuple[str, str, str, float, str]] = [
    ("produce_100B", "records_per_s", ">=", 500_000, "produce >= 500k records/s (100 B)"),
    ("consume_100B_5M", "records_per_s", ">=", 1_000_000, "consume >= 1M records/s (100 B)"),
    ("consume_1KB_2GB", "rss_mb", "<", 300, "broker < 300 MB RSS after a 2 GB log"),
]

#: Figures published elsewhere, on other hardware: context only, never compared as ratios.
HISTORICAL = [
    ("Kafka paper (NetDB 2011), producer, batch of 1, 200 B", "50,000 msg/s"),
    ("Kafka paper (NetDB 2011), producer, batch of 50, 200 B", "400,000 msg/s"),
    ("Kafka paper (NetDB 2011), consumer, 200 B", "22,000 msg/s"),
    (
        "Kreps 2014, '2 million writes/s on three cheap machines': single producer, 100 B",
        "821,557 records/s",
    ),
    ("Kreps 2014: single consumer, 100 B", "940,521 records/s"),
]


def machine_info() -> dict[str, Any]:
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "platform": platform.platform(),
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def aggregate(runs: Sequence[Result]) -> list[Result]:
    """One result per (workload, system): medians of the runs, with min and max."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in runs:
        groups.setdefault((r["workload"], r["system"]), []).append(r)
    out: list[Result] = []
    for (_workload, _system), rs in groups.items():
        first = rs[0]
        agg: Result = {k: v for k, v in first.items() if k != "detail"}
        lo: dict[str, float] = {}
        hi: dict[str, float] = {}
        for metric in _METRICS:
            vals = [float(r[metric]) for r in rs if r.get(metric) is not None]
            med = _median(vals)
            agg[metric] = None if med is None else round(med, 3)
            if vals:
                lo[metric], hi[metric] = min(vals), max(vals)
        rss = [float(r["rss_mb"]) for r in rs if r.get("rss_mb") is not None]
        agg["rss_mb"] = max(rss) if rss else None
        cpu: dict[str, float | None] = {}
        for side in ("broker", "client"):
            vals = [
                float(r["cpu_s_per_million"][side])
                for r in rs
                if r.get("cpu_s_per_million", {}).get(side) is not None
            ]
            cpu[side] = None if not vals else round(statistics.median(vals), 3)
        agg["cpu_s_per_million"] = cpu
        agg["runs"] = len(rs)
        agg["min"] = lo
        agg["max"] = hi
        agg["detail"] = first.get("detail", {})
        if len(rs) > 1:
            agg["per_run"] = [{m: r.get(m) for m in (*_METRICS, "rss_mb")} for r in rs]
        out.append(agg)
    out.sort(key=lambda r: (_workload_rank(r["workload"], runs), SYSTEM_ORDER.get(r["system"], 9)))
    return out


def _workload_rank(workload: str, runs: Sequence[Result]) -> int:
    for i, r in enumerate(runs):
        if r["workload"] == workload:
            return i
    return len(runs)


def check_targets(results: Sequence[Result]) -> list[dict[str, Any]]:
    checks = []
    for workload, metric, op, value, label in TARGETS:
        row = next(
            (r for r in results if r["workload"] == workload and r["system"] == "tidelog"), None
        )
        if row is None or row.get(metric) is None:
            continue
        got = float(row[metric])
        ok = got >= value if op == ">=" else got < value
        checks.append(
            {
                "target": label,
                "metric": metric,
                "measured": got,
                "status": "PASS" if ok else "BELOW",
            }
        )
    return checks


def ratios(results: Sequence[Result], other: str) -> list[dict[str, Any]]:
    """Tidelog / `other` per workload (throughput: higher is better; latency: lower)."""
    out = []
    by = {(r["workload"], r["system"]): r for r in results}
    for r in results:
        if r["system"] != "tidelog":
            continue
        # The two-process latency run is compared with the system's one run, and the
        # columnar consume (`_arrow`) with the same consume workload's run.
        base = r["workload"].removesuffix("_2proc").removesuffix("_arrow")
        o = by.get((r["workload"], other)) or by.get((base, other))
        if o is None:
            continue
        entry: dict[str, Any] = {"workload": r["workload"], "vs": other}
        if _is_latency(r["workload"]):
            for m in ("p50_ms", "p99_ms", "p999_ms"):
                if r.get(m) and o.get(m):
                    entry[m] = round(float(r[m]) / float(o[m]), 2)
        elif r.get("records_per_s") and o.get("records_per_s"):
            entry["records_per_s"] = round(float(r["records_per_s"]) / float(o["records_per_s"]), 2)
        if len(entry) > 2:
            out.append(entry)
    return out


def _is_latency(workload: str) -> bool:
    return workload.startswith(("e2e", "fetch_latency", "wakeup"))


# ---------------------------------------------------------------------------- printing


def _f(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _range(r: Result, metric: str, fmt: str) -> str:
    lo, hi = r.get("min", {}).get(metric), r.get("max", {}).get(metric)
    if r.get("runs", 1) <= 1 or lo is None:
        return ""
    return f"{format(lo, fmt)}-{format(hi, fmt)}"


def table_lines(results: Sequence[Result]) -> list[str]:
    head = (
        f"{'workload':<28}{'system':<13}{'records/s':>12}{'MB/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'p99.9 ms':>9}{'RSS MiB':>9}{'cpu/M brk':>10}{'cpu/M cli':>10}{'runs':>5}  range"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        cpu = r.get("cpu_s_per_million") or {}
        rng = (
            _range(r, "p99_ms", ".2f")
            if _is_latency(r["workload"])
            else _range(r, "records_per_s", ",.0f")
        )
        note = r.get("detail", {}).get("status", "")
        lines.append(
            f"{r['workload']:<28}{r['system']:<13}{_f(r.get('records_per_s'), ',.0f'):>12}"
            f"{_f(r.get('mb_per_s'), '.1f'):>9}{_f(r.get('p50_ms'), '.2f'):>9}"
            f"{_f(r.get('p99_ms'), '.2f'):>9}{_f(r.get('p999_ms'), '.2f'):>9}"
            f"{_f(r.get('rss_mb'), '.0f'):>9}{_f(cpu.get('broker'), '.2f'):>10}"
            f"{_f(cpu.get('client'), '.2f'):>10}{r.get('runs', 1):>5}  {rng}{note}"
        )
    return lines


def print_report(doc: dict[str, Any]) -> None:
    print()
    print("\n".join(table_lines(doc["results"])))
    if doc.get("ratios"):
        print("\nTidelog / baseline (throughput: >1 is faster; latency: <1 is lower):")
        for e in doc["ratios"]:
            vals = ", ".join(f"{k} {v}" for k, v in e.items() if k not in ("workload", "vs"))
            print(f"  {e['workload']:<26} vs {e['vs']:<13} {vals}")
    if doc.get("checks"):
        print("\nTargets (issue 2):")
        for c in doc["checks"]:
            print(f"  {c['status']:<6} {c['target']}: measured {c['measured']:,.1f}")
    if doc.get("broker_memory"):
        mem = doc["broker_memory"]
        print(
            f"\nTidelog broker memory: RSS at start {mem.get('rss_start_mb')} MiB, at end "
            f"{mem.get('rss_end_mb')} MiB, peak (VmHWM) {mem.get('peak_mb')} MiB"
        )
    if doc.get("micro"):
        print("\nRecord body codec (bench/codec_bench.py, ns per 100-byte record):")
        for row in doc["micro"]:
            print(
                f"  {row['layout']:<28} encode {row['encode_ns']:>7.0f}  decode "
                f"{row['decode_ns']:>7.0f}  bytes/rec {row['bytes_per_record']:.1f}"
            )
    for note in doc.get("notes", []):
        print(f"note: {note}")


def build_doc(
    runs: Sequence[Result],
    *,
    options: dict[str, Any],
    micro: list[dict[str, Any]] | None,
    broker_memory: dict[str, Any] | None,
    notes: list[str],
    elapsed_s: float,
) -> dict[str, Any]:
    results = aggregate(runs)
    return {
        "machine": machine_info(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "options": options,
        "elapsed_s": round(elapsed_s, 1),
        "results": results,
        "ratios": ratios(results, "kafka") + ratios(results, "grpc-ceiling"),
        "checks": check_targets(results),
        "broker_memory": broker_memory,
        "micro": micro or [],
        "notes": notes,
    }


def write_json(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------------------- chart + markdown


def write_chart(doc: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    results = doc["results"]
    colors = {"tidelog": "#1f77b4", "kafka": "#d62728", "grpc-ceiling": "#9e9e9e"}
    thr = [r for r in results if not _is_latency(r["workload"]) and r.get("records_per_s")]
    lat = [r for r in results if _is_latency(r["workload"]) and r.get("p99_ms")]
    workloads_t = list(dict.fromkeys(r["workload"] for r in thr))
    workloads_l = list(dict.fromkeys(r["workload"] for r in lat))
    systems = sorted({r["system"] for r in results}, key=lambda s: SYSTEM_ORDER.get(s, 9))
    fig, axes = plt.subplots(
        2, 1, figsize=(12, 9), gridspec_kw={"height_ratios": [1.2, 1]}, squeeze=False
    )
    ax = axes[0][0]
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        xs, ys, err_lo, err_hi = [], [], [], []
        for j, w in enumerate(workloads_t):
            r = next((x for x in thr if x["workload"] == w and x["system"] == system), None)
            if r is None:
                continue
            y = float(r["records_per_s"])
            xs.append(j + (i - (len(systems) - 1) / 2) * width)
            ys.append(y)
            err_lo.append(max(0.0, y - r.get("min", {}).get("records_per_s", y)))
            err_hi.append(max(0.0, r.get("max", {}).get("records_per_s", y) - y))
        if xs:
            bars = ax.bar(
                xs, ys, width, label=system, color=colors.get(system), yerr=[err_lo, err_hi]
            )
            ax.bar_label(bars, labels=[_short(y) for y in ys], fontsize=7, padding=2)
    ax.set_xticks(range(len(workloads_t)))
    ax.set_xticklabels(workloads_t, rotation=20, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("records/s (log scale; bars = median, whiskers = min-max)")
    ax.set_title("Throughput, one client, one partition, same machine, same run")
    ax.legend()
    ax.grid(axis="y", alpha=0.3, which="both")
    ax = axes[1][0]
    lat_systems = [s for s in systems if any(r["system"] == s for r in lat)]
    width = 0.8 / max(1, 2 * len(lat_systems))
    k = 0
    for system in lat_systems:
        for metric, alpha in (("p50_ms", 0.55), ("p99_ms", 1.0)):
            xs, ys = [], []
            for j, w in enumerate(workloads_l):
                r = next((x for x in lat if x["workload"] == w and x["system"] == system), None)
                if r is None or r.get(metric) is None:
                    continue
                xs.append(j + (k - (2 * len(lat_systems) - 1) / 2) * width)
                ys.append(float(r[metric]))
            if xs:
                bars = ax.bar(
                    xs,
                    ys,
                    width,
                    label=f"{system} {metric[:-3]}",
                    color=colors.get(system),
                    alpha=alpha,
                )
                ax.bar_label(bars, labels=[f"{y:.1f}" for y in ys], fontsize=6, padding=1)
            k += 1
    ax.set_xticks(range(len(workloads_l)))
    ax.set_xticklabels(workloads_l, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("milliseconds (p50 light, p99 dark)")
    ax.set_title("Latency: end to end at 10,000 records/s, and one fetch as the log grows")
    if k:
        ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _short(value: float) -> str:
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.0f}k"


def _md_table(results: Sequence[Result]) -> list[str]:
    lines = [
        "| workload | system | records/s | MB/s | p50 ms | p99 ms | p99.9 ms | broker RSS MiB "
        "| CPU s/M broker | CPU s/M client | runs (min-max) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        cpu = r.get("cpu_s_per_million") or {}
        status = r.get("detail", {}).get("status")
        if status:
            lines.append(f"| {r['workload']} | {r['system']} | {status} | | | | | | | | |")
            continue
        metric, fmt = ("p99_ms", ".2f") if _is_latency(r["workload"]) else ("records_per_s", ",.0f")
        rng = _range(r, metric, fmt)
        lines.append(
            f"| {r['workload']} | {r['system']} | {_f(r.get('records_per_s'), ',.0f')} "
            f"| {_f(r.get('mb_per_s'), '.1f')} | {_f(r.get('p50_ms'), '.2f')} "
            f"| {_f(r.get('p99_ms'), '.2f')} | {_f(r.get('p999_ms'), '.2f')} "
            f"| {_f(r.get('rss_mb'), '.0f')} | {_f(cpu.get('broker'), '.2f')} "
            f"| {_f(cpu.get('client'), '.2f')} | {r.get('runs', 1)}"
            + (f" ({rng} {'ms' if metric == 'p99_ms' else 'rec/s'})" if rng else "")
            + " |"
        )
    return lines


def write_markdown(
    doc: dict[str, Any], path: Path, chart: str | None, descriptions: dict[str, str], extra: str
) -> None:
    m = doc["machine"]
    opts = doc["options"]
    cmd = "python -m bench" + "".join(
        f" --{k.replace('_', '-')}" + ("" if v is True else f" {v}")
        for k, v in opts.items()
        if v and k not in ("output",)
    )
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python -m bench --with-kafka` (bench/report.py); edits are "
        "overwritten. -->",
        "",
        f"Run on {doc['date']}: {m['cpu_count']} x {m['cpu_model']}, {m['memory_gb']} GB RAM, "
        f"Linux {m['kernel']}, Python {m['python']}. Command: `{cmd}` "
        f"({doc['elapsed_s']:.0f} s). Every system ran in the same invocation, one after the "
        "other, on this machine, over loopback, one partition, data in the page cache. The "
        "machine is a shared 2-core VM: absolute figures move from run to run, the ratios "
        "within one run much less.",
        "",
    ]
    if chart:
        lines += [f"![Tidelog vs Apache Kafka on the same machine]({chart})", ""]
    lines += ["## Results (median of the runs)", "", *_md_table(doc["results"]), ""]
    if doc.get("ratios"):
        lines += [
            "## Tidelog / baseline",
            "",
            "Throughput ratios above 1 mean Tidelog is faster; latency ratios below 1 mean "
            "Tidelog is lower. `grpc-ceiling` is a bare grpc.aio server moving the same bytes "
            "in messages of the same size: the transport's limit on this machine.",
            "",
            "| workload | vs | records/s | p50 | p99 | p99.9 |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
        ]
        for e in doc["ratios"]:
            lines.append(
                f"| {e['workload']} | {e['vs']} | {_f(e.get('records_per_s'), '.2f')} "
                f"| {_f(e.get('p50_ms'), '.2f')} | {_f(e.get('p99_ms'), '.2f')} "
                f"| {_f(e.get('p999_ms'), '.2f')} |"
            )
        lines.append("")
    if doc.get("checks"):
        lines += ["## Targets (issue 2)", ""]
        for c in doc["checks"]:
            lines.append(f"- **{c['status']}** {c['target']}: measured {c['measured']:,.1f}")
        lines.append("")
    if doc.get("micro"):
        lines += [
            "## Record body codec (micro-benchmark, ns per 100-byte record)",
            "",
            "| layout | encode ns | decode ns | bytes/record |",
            "| --- | ---: | ---: | ---: |",
        ]
        for row in doc["micro"]:
            lines.append(
                f"| {row['layout']} | {row['encode_ns']:.0f} | {row['decode_ns']:.0f} "
                f"| {row['bytes_per_record']:.1f} |"
            )
        lines.append("")
    lines += ["## Workloads", ""]
    lines += [f"- `{name}`: {text}" for name, text in descriptions.items()]
    lines += [
        "",
        "Columns: `MB/s` counts record values only (decimal MB). `CPU s/M` is CPU seconds per "
        "million records: the broker process's (psutil / `/proc/<pid>/stat` deltas) and the "
        "client's (for Tidelog this Python process with the SDK's threads; for Kafka the tool's "
        "JVM, including its start-up and JIT). `broker RSS` is the broker's peak resident set "
        "since it started (VmHWM), after the workload.",
        "",
    ]
    if extra:
        lines += [extra, ""]
    lines += [
        "## Reproduce",
        "",
        "```",
        "make bench          # Tidelog alone (+ the gRPC ceiling), a few minutes",
        "make bench-kafka    # the full comparison: python -m bench --with-kafka (repeat 3)",
        "python -m bench --with-kafka --repeat 1 --big --replication   # + 5 GB log, 3 brokers",
        "python -m bench --quick --output /tmp/b   # smoke test, seconds",
        "python -m bench.e2e_ab --base main   # e2e latency: main vs this tree, alternated",
        "```",
        "",
        "Kafka 4.x comes from Maven Central into `~/.cache/tidelog/kafka-<version>` on first "
        "use (bench/kafka_baseline.py; Java 17 and Maven needed). `bench/results/latest.json` "
        "holds every figure, including per-run values and each tool's own output.",
        "",
        "## Historical reference figures (other hardware, other years: not comparable)",
        "",
        "Published on different machines (and, for the paper, a different Kafka); shown for "
        "orientation only, never as ratios.",
        "",
        "| source | figure |",
        "| --- | ---: |",
        *[f"| {what} | {fig} |" for what, fig in HISTORICAL],
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
