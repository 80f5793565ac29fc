"""Records.Produce before and after a change, in the same run
(``python -m bench.gateway_records_ab --base main``).

Starts etcd, a coordinator and one broker (tests/support), and two gateways
in front of them: one running the SDK and gateway code of git ref `--base`
(exported by bench._checkout, its own C extensions built, and put first on
its PYTHONPATH), one running this work tree's. Then the Go client's record-level produce
(`tidelog-go-example bench -produce-only`, examples/go/build.sh) runs
against each in turn, alternating which goes first, one warm-up round and
`--repeat` measured ones, and prints per gateway the medians of:

- records/s seen by the Go client (100-byte records, 1000 a request);
- the gateway's CPU time (user + system, psutil) per record produced: on a
  loaded machine the figure to trust;
- the broker's CPU time per record.

`--keyed` gives every record a key (murmur2 partitioning in the gateway).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
from tidelog import AdminClient, NewTopic  # noqa: E402

from bench import _checkout  # noqa: E402
from bench._processes import tidelog_cluster, tmpdir  # noqa: E402
from bench.go_example import go_example  # noqa: E402
from tests.support.gateway import GatewayProcess, start_gateway  # noqa: E402


#: Where each distribution's package lives, relative to the repository.
def start(etcd: str, prefix: str, logs: Path, pythonpath: str | None) -> GatewayProcess:
    with _checkout.children_run(pythonpath):
        return start_gateway(etcd, logs, prefix=prefix)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="git ref measured against the work tree")
    parser.add_argument("--records", type=int, default=300_000, help="records per run")
    parser.add_argument("--repeat", type=int, default=5, help="measured rounds")
    parser.add_argument("--keyed", action="store_true", help="a key on every record")
    args = parser.parse_args(argv)
    built = go_example()
    if not isinstance(built, Path):
        print(f"the Go example did not build: {built}")
        return 1
    binary = str(built)
    rows: dict[str, list[dict[str, float]]] = {args.base: [], "work tree": []}
    with (
        tempfile.TemporaryDirectory(prefix="tidelog-ab-base-") as base_dir,
        tidelog_cluster(brokers=1) as cluster,
        tmpdir("tidelog-ab-") as logs,
    ):
        paths = {args.base: _checkout.export(args.base, Path(base_dir)), "work tree": None}
        gateways = {
            name: start(cluster.etcd.endpoint, cluster.prefix, Path(logs) / str(i), path)
            for i, (name, path) in enumerate(paths.items())
        }
        broker = psutil.Process(cluster.brokers[0].pid)
        try:
            for r in range(args.repeat + 1):
                order = list(gateways) if r % 2 == 0 else list(gateways)[::-1]
                for name in order:
                    row = run_once(binary, cluster.bootstrap, gateways[name], broker, args)
                    label = " (warm-up)" if r == 0 else ""
                    print(
                        f"round {r} {name:<10} {row['records_per_s']:>10,.0f} rec/s  gateway "
                        f"{row['gateway_cpu_us']:5.2f} us CPU/record  broker "
                        f"{row['broker_cpu_us']:5.2f} us/record{label}",
                        flush=True,
                    )
                    if r:
                        rows[name].append(row)
        finally:
            for gateway in gateways.values():
                gateway.stop()
    print()
    for name, measured in rows.items():
        medians = {k: statistics.median(row[k] for row in measured) for k in measured[0]}
        print(
            f"{name:<10} median of {len(measured)}: {medians['records_per_s']:>10,.0f} rec/s  "
            f"gateway {medians['gateway_cpu_us']:.2f} us CPU/record  "
            f"broker {medians['broker_cpu_us']:.2f} us/record"
        )
    return 0


def run_once(
    binary: str,
    bootstrap: str,
    gateway: GatewayProcess,
    broker: psutil.Process,
    args: argparse.Namespace,
) -> dict[str, float]:
    topic = f"records-ab-{time.time_ns()}"
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 3)])
    process = psutil.Process(gateway.pid)
    before, broker_before = process.cpu_times(), broker.cpu_times()
    command = [binary, "bench", "-gateway", gateway.address, "-topic", topic,
               "-records", str(args.records), "-size", "100", "-produce-only"]  # fmt: skip
    if args.keyed:
        command.append("-keyed")
    run = subprocess.run(command, capture_output=True, text=True, check=True, timeout=900)
    after, broker_after = process.cpu_times(), broker.cpu_times()
    result = json.loads(run.stdout.strip().splitlines()[-1])

    def per_record(a: Any, b: Any) -> float:
        return (b.user + b.system - a.user - a.system) / args.records * 1e6

    return {
        "records_per_s": result["produce_records_per_s"],
        "gateway_cpu_us": per_record(before, after),
        "broker_cpu_us": per_record(broker_before, broker_after),
    }


if __name__ == "__main__":
    sys.exit(main())
