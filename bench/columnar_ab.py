"""The columnar consume (Consumer.poll_arrow) before and after a change, in the same run
(``python -m bench.columnar_ab --base main``).

Starts one broker (tests/support) and writes the logs of the three consume workloads of
``python -m bench`` (5M x 100 B, 2M x 1 KiB, 10M x 200 B; ``--scale`` shrinks them). Then, per
workload, `bench.workloads.consume_arrow` (same fetch sizes as the bench: 1 MiB, 1 MiB,
200 KB) runs in a fresh process per run, alternately with the SDK of git ref `--base`
(exported by bench._checkout with its own C extensions, first on its PYTHONPATH) and with this
work tree's, one warm-up round and `--repeat` measured ones. Prints per side the medians of
records/s and of the client's CPU seconds per million records (user + system of that process):
on a loaded machine the figure to trust. Every run checks what it read (offsets dense from 0, a
CRC32C of every value: see consume_arrow).
"""

from __future__ import annotations

import argparse
import json
import os
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

#: (record bytes, records, fetch bytes or None for the consumer's default 1 MiB)
Spec = tuple[int, int, int | None]

WORKLOADS: dict[str, Spec] = {
    "consume_100B_5M_arrow": (100, 5_000_000, None),
    "consume_1KB_2GB_arrow": (1024, 2_000_000, None),
    "paper_consume_10M_arrow": (200, 10_000_000, 204_800),
}


def _child(args: list[str]) -> None:
    address, pid, topic, count, size, fetch, name = args
    result = workloads.consume_arrow(
        address,
        int(pid),
        topic,
        int(count),
        int(size),
        workload=name,
        fetch_bytes=int(fetch) or None,
    )
    import tidelog

    result["sdk"] = str(Path(tidelog.__file__).parent)
    print(json.dumps(result))


def _run(side: str | None, address: str, pid: int, topic: str, spec: Spec, name: str) -> Any:
    size, count, fetch = spec
    env = dict(os.environ)
    env["PYTHONPATH"] = "" if side is None else side
    out = subprocess.run(
        [sys.executable, "-m", "bench.columnar_ab", "--child",
         address, str(pid), topic, str(count), str(size), str(fetch or 0), name],
        cwd=str(ROOT), env=env, check=True, capture_output=True, text=True, timeout=900,
    ).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.columnar_ab", description=__doc__)
    ap.add_argument("--base", default="main", help="git ref of the 'before' SDK")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the log sizes")
    ap.add_argument("--only", default="", help="comma-separated workload names or prefixes")
    args = ap.parse_args(argv)
    chosen = {
        n: (size, max(1000, int(count * args.scale)), fetch)
        for n, (size, count, fetch) in WORKLOADS.items()
        if not args.only or any(n.startswith(o) for o in args.only.split(","))
    }
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tmpdir("tidelog-columnar-ab-") as export, tidelog_broker() as broker:
        base = _checkout.export(args.base, export)
        sides: dict[str, str | None] = {args.base: base, "this": None}
        for name, spec in chosen.items():
            size, count, _fetch = spec
            topic = f"{name}-log"
            workloads.create_topic(broker.address, topic)
            workloads.produce(broker.address, broker.pid, topic, count, size, workload="write")
            print(f"[{name}] {count:,} x {size} B written", flush=True)
            order = list(sides)
            for r in range(args.repeat + 1):
                for label in order if r % 2 == 0 else order[::-1]:
                    result = _run(sides[label], broker.address, broker.pid, topic, spec, name)
                    cpu = result["cpu_s_per_million"]["client"]
                    print(
                        f"  {'warm-up' if r == 0 else f'run {r}':<8}{label:<10}"
                        f"{result['records_per_s']:>14,.0f} rec/s  client CPU {cpu:.3f} s/M"
                        f"  ({result['sdk']})",
                        flush=True,
                    )
                    if r:
                        rows.setdefault((name, label), []).append(result)
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"\nmedians of {args.repeat} (load average at the end: {' '.join(load)}):")
    for (name, label), results in rows.items():
        rps = statistics.median(r["records_per_s"] for r in results)
        cpu = statistics.median(r["cpu_s_per_million"]["client"] for r in results)
        print(f"  {name:<26}{label:<10}{rps:>14,.0f} rec/s  client CPU {cpu:.3f} s/M")
    with tempfile.NamedTemporaryFile(
        "w", prefix="columnar-ab-", suffix=".json", delete=False
    ) as out:
        json.dump({f"{n}/{s}": v for (n, s), v in rows.items()}, out, indent=1)
    print(f"every run: {out.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
