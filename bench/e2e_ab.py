"""End-to-end latency before and after a change, in the same run
(``python -m bench.e2e_ab --base main``).

The latency workloads of ``python -m bench`` (e2e_latency_10k*: a producer at a fixed rate,
linger 0, acks=1, a consumer reading the tail) move by 20-50% between runs on a shared 2-core
machine, more than most changes do, so "before" and "after" must be measured in one run,
alternated. This tool:

- exports git ref `--base` (its SDK and services, with the SDK's C extensions built: see
  bench._checkout) and starts two brokers, one running `--base`'s code and one running this
  work tree's;
- runs each chosen layout (`--layouts`) in `--pairs` rounds; a round runs both sides, the
  order alternating round by round, each run in a fresh process whose PYTHONPATH selects its
  side (so the producer, the consumer and, in ``2proc``, the consumer's own process all run
  that side's SDK) against that side's broker;
- prints every run, then per layout and side the medians of p50 / p99 / p99.9, the spread of
  the p99, the broker's and the producer process's CPU per million records, and the number of
  rounds in which this work tree's p99 was the lower one. Every run is written to `--output`.

Layouts, as in ``python -m bench``: ``1proc`` = e2e_latency_10k (Producer and Consumer in one
process), ``2proc`` = e2e_latency_10k_2proc (the consumer in a process of its own), ``async`` =
e2e_latency_10k_async (AsyncProducer and AsyncConsumer on one event loop).

Each child reports which SDK and compiled modules it imported; a run that did not use its
side's code stops the tool with an error rather than compare a side with itself.

How large a move is noise: the same code on both sides (``--base HEAD``, 4 rounds, a quiet
2-core machine) gave this / base ratios of 0.92-1.01x for the p99 and 0.87-1.05x for the
p99.9 across the three layouts. At 4 rounds a move under ~10% is not a finding; more rounds
narrow it.

Not part of ``make bench``: it needs a quiet machine and takes about 15 s per run at the
defaults (two brokers, 3 layouts x 4 rounds x 2 sides: ~6 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _checkout, workloads  # noqa: E402
from bench._processes import tidelog_broker, tmpdir  # noqa: E402

#: Layout name -> the `python -m bench` workload it is.
LAYOUTS = {
    "1proc": "e2e_latency_10k",
    "2proc": "e2e_latency_10k_2proc",
    "async": "e2e_latency_10k_async",
}

#: Label of this work tree's side.
THIS = "this"

#: Seconds a child run may take beyond its own measured and warm-up time.
CHILD_SLACK_S = 120.0


def _child(argv: list[str]) -> None:
    """One run, in this process: print its Result as JSON, with the code it imported."""
    layout, address, pid, topic, rate, seconds, warmup_s, record_bytes = argv
    common: dict[str, Any] = {
        "rate": int(rate),
        "seconds": float(seconds),
        "record_bytes": int(record_bytes),
        "workload": LAYOUTS[layout],
        "warmup_s": float(warmup_s),
    }
    if layout == "async":
        result = workloads.end_to_end_latency_async(address, int(pid), topic, **common)
    else:
        processes = 2 if layout == "2proc" else 1
        result = workloads.end_to_end_latency(
            address, int(pid), topic, processes=processes, **common
        )
    import tidelog

    result["code"] = {
        "sdk": str(Path(tidelog.__file__).parent),
        "compiled": list(_checkout.compiled_modules().values()),
    }
    print(json.dumps(result))


def _check_code(label: str, code: dict[str, Any], export_root: Path | None) -> None:
    """Raise unless a run of side `label` imported that side's SDK and compiled modules (the
    export under `export_root`, or this work tree for None)."""
    root = ROOT if export_root is None else export_root
    wrong = [p for p in [code["sdk"], *code["compiled"]] if not Path(p).is_relative_to(root)]
    if wrong:
        raise RuntimeError(f"the {label} run imported code of the other side: {wrong}")


def _check_broker(label: str, pid: int, pythonpath: str | None) -> None:
    """Raise unless broker `pid` was started with side `label`'s PYTHONPATH."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    found = next((e[11:].decode() for e in environ if e.startswith(b"PYTHONPATH=")), None)
    if found != pythonpath:
        raise RuntimeError(f"the {label} broker runs with PYTHONPATH {found!r}")


def _run(
    layout: str, label: str, env: dict[str, str], broker: Any, topic: str, args: Any
) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "bench.e2e_ab", "--child", layout, broker.address,
        str(broker.pid), topic, str(args.rate), str(args.seconds), str(args.warmup_s),
        str(args.record_bytes),
    ]  # fmt: skip
    out = subprocess.run(
        argv,
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=args.seconds + args.warmup_s + CHILD_SLACK_S,
    )
    if out.returncode != 0:
        raise RuntimeError(f"the {label} {layout} run failed: {out.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def summarize(runs: dict[str, dict[str, list[dict[str, Any]]]], base: str) -> list[str]:
    """Lines of the summary: per layout and side the medians, then this side against base.
    `runs[layout][side]` lists that side's results in round order."""
    lines = []
    for layout, sides in runs.items():
        lines.append(f"{layout} ({LAYOUTS[layout]}):")
        medians: dict[str, dict[str, float]] = {}
        for side, results in sides.items():
            m = {
                key: statistics.median(r[key] for r in results)
                for key in ("p50_ms", "p99_ms", "p999_ms")
            }
            m["broker_cpu"] = statistics.median(r["cpu_s_per_million"]["broker"] for r in results)
            m["client_cpu"] = statistics.median(r["cpu_s_per_million"]["client"] for r in results)
            medians[side] = m
            p99s = [r["p99_ms"] for r in results]
            lines.append(
                f"  {side:<12} p50 {m['p50_ms']:6.2f}  p99 {m['p99_ms']:6.2f}"
                f" ({min(p99s):.2f}-{max(p99s):.2f})  p99.9 {m['p999_ms']:6.2f} ms"
                f"  CPU s/M broker {m['broker_cpu']:.1f} producer {m['client_cpu']:.1f}"
            )
        if base in medians and THIS in medians:
            before, after = medians[base], medians[THIS]
            lower = sum(
                a["p99_ms"] < b["p99_ms"] for a, b in zip(sides[THIS], sides[base], strict=False)
            )
            ratios = ", ".join(
                f"{name} {after[key] / before[key]:.2f}x"
                for name, key in (("p50", "p50_ms"), ("p99", "p99_ms"), ("p99.9", "p999_ms"))
                if before[key]
            )
            lines.append(
                f"  {THIS} / {base}: {ratios}; {THIS}'s p99 lower in {lower} of "
                f"{min(len(sides[THIS]), len(sides[base]))} rounds"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(
        prog="python -m bench.e2e_ab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--base", default="main", help="git ref of the 'before' side")
    ap.add_argument("--layouts", default="2proc,1proc,async", help="of " + ",".join(LAYOUTS))
    ap.add_argument("--pairs", type=int, default=4, help="rounds (each runs both sides)")
    ap.add_argument("--rate", type=int, default=10_000, help="records/s")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per run")
    ap.add_argument("--warmup-s", type=float, default=2.0, help="uncounted seconds first")
    ap.add_argument("--record-bytes", type=int, default=100)
    ap.add_argument("--output", type=Path, help="JSON of every run (default: a temp file)")
    args = ap.parse_args(argv)
    layouts = [name for name in args.layouts.split(",") if name]
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown or not layouts:
        ap.error(f"--layouts: unknown {unknown}; choose from {', '.join(LAYOUTS)}")
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")

    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        layout: {args.base: [], THIS: []} for layout in layouts
    }
    with tmpdir("tidelog-e2e-ab-") as export_dir:
        base_path = _checkout.export(args.base, export_dir)
        with contextlib.ExitStack() as stack:
            sides: dict[str, tuple[dict[str, str], Any, Path | None]] = {}
            for label, pythonpath in ((args.base, base_path), (THIS, None)):
                env = _checkout.environment(pythonpath)
                with _checkout.children_run(pythonpath):
                    broker = stack.enter_context(tidelog_broker())
                _check_broker(label, broker.pid, pythonpath)
                sides[label] = (env, broker, export_dir if pythonpath else None)
            order = [args.base, THIS]
            for r in range(args.pairs):
                for layout in layouts:
                    for label in order if r % 2 == 0 else order[::-1]:
                        env, broker, export_root = sides[label]
                        topic = f"e2e-ab-{layout}-{r}-{'base' if label != THIS else THIS}"
                        result = _run(layout, label, env, broker, topic, args)
                        _check_code(label, result["code"], export_root)
                        runs[layout][label].append(result)
                        print(
                            f"round {r + 1} {layout:<6} {label:<12}"
                            f" p50 {result['p50_ms']:6.2f}  p99 {result['p99_ms']:6.2f}"
                            f"  p99.9 {result['p999_ms']:6.2f} ms",
                            flush=True,
                        )
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"\nmedians of {args.pairs} rounds (load average at the end: {load}):")
    for line in summarize(runs, args.base):
        print(line)
    output = args.output
    if output is None:
        with tempfile.NamedTemporaryFile(
            "w", prefix="e2e-ab-", suffix=".json", delete=False
        ) as handle:
            output = Path(handle.name)
    output.write_text(json.dumps({"base": args.base, "runs": runs}, indent=1))
    print(f"every run: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
