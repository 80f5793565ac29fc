"""The gateway's cost: the Python SDK through the gateway against direct to
the brokers, in the same run (``python -m bench.gateway_bench``, part of
``make bench``).

Starts etcd, a coordinator, one broker (cluster mode) and a gateway in front
of them (tests/support), then runs the harness's own workloads
(bench/workloads.py) twice each, once given the broker's address and once
the gateway's (the SDK, unchanged, then sends everything through the
gateway), alternating which goes first over ``--repeat`` rounds:

- produce of 100-byte records (one Producer, acks=1, linger 5 ms);
- consume of that log from offset 0 (one Consumer catching up);
- end-to-end latency at 10,000 records/s (producer and tail consumer in one
  process): the latency the gateway adds is its p50/p99 minus the direct ones.

Then, on the same gateway:

- the record-level API (`tidelog.v1.Records`) from the Go client
  (`tidelog-go-example bench`, built by examples/go/build.sh; skipped with
  the reason where Go is missing): produce and consume of 100-byte records,
  records/s (goal: 300k each);
- the RSS of a fresh gateway with 100 open, idle `Records.Consume` streams,
  each granted 100 records over a three-partition backlog and never read.

Prints medians, the ratio gateway/direct (issue 10's goal: at least 0.8x)
and the added latency (goal: p99 at most +1 ms), and writes
``<output>/gateway.json``. A missed goal prints BELOW; it never fails the
run. The "server" CPU column is the broker's (direct) or the gateway's
(through it) per million records.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import workloads  # noqa: E402
from bench._processes import tidelog_cluster, tmpdir  # noqa: E402
from bench.go_example import go_example  # noqa: E402
from tests.support.cluster import ClusterProcesses  # noqa: E402
from tests.support.gateway import GatewayProcess, start_gateway  # noqa: E402

RECORD_BYTES = 100
THROUGHPUT_GOAL = 0.8
ADDED_P99_GOAL_MS = 1.0
GO_RECORDS_GOAL = 300_000
IDLE_STREAMS = 100
IDLE_CREDIT_RECORDS = 100
MIB = 1024 * 1024


@contextlib.contextmanager
def cluster_and_gateway() -> Iterator[tuple[ClusterProcesses, GatewayProcess]]:
    with tidelog_cluster(brokers=1) as cluster, tmpdir("tidelog-bench-gateway-") as logs:
        gateway = start_gateway(cluster.etcd.endpoint, logs, prefix=cluster.prefix)
        try:
            yield cluster, gateway
        finally:
            gateway.stop()


def median_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def run(
    count: int, repeat: int, e2e_seconds: float, output: Path, go: bool = True
) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    with cluster_and_gateway() as (cluster, gateway):
        broker = cluster.brokers[0]
        paths = {
            "direct": (cluster.bootstrap, broker.pid),
            "gateway": (gateway.address, gateway.pid),
        }
        print(f"broker pid {broker.pid} at {cluster.bootstrap}; gateway pid {gateway.pid} at "
              f"{gateway.address}", flush=True)  # fmt: skip
        for r in range(repeat):
            order = ["direct", "gateway"] if r % 2 == 0 else ["gateway", "direct"]
            for path in order:
                address, pid = paths[path]
                topic = f"gateway-bench-{path}-{r}"
                workloads.create_topic(cluster.bootstrap, topic)
                for name, step in _steps(address, pid, topic, count, e2e_seconds):
                    row = step()
                    row["system"] = f"tidelog-{path}"
                    results.append(row)
                    print(
                        f"  {name:<18}{path:<9}{row['records_per_s']:>12,.0f} rec/s"
                        f"   p50 {row['p50_ms'] or 0:.2f} ms   p99 {row['p99_ms'] or 0:.2f} ms",
                        flush=True,
                    )
        go_api = go_records_api(gateway, count) if go else {"status": "NOT RUN"}
        # A gateway of its own, so that its RSS is not what the workloads
        # above left on the heap.
        with tmpdir("tidelog-bench-idle-") as idle_logs:
            fresh = start_gateway(cluster.etcd.endpoint, idle_logs, prefix=cluster.prefix)
            try:
                idle = idle_consume_rss(cluster.bootstrap, fresh)
            finally:
                fresh.stop()
    summary: dict[str, Any] = {}
    print(f"\n{'workload':<18}{'direct':>14}{'gateway':>14}{'ratio':>8}  goal")
    for name in ("produce_100B", "consume_100B"):
        direct = median_of(_rows(results, name, "direct"), "records_per_s")
        through = median_of(_rows(results, name, "gateway"), "records_per_s")
        ratio = through / direct if direct and through else None
        status = "PASS" if ratio is not None and ratio >= THROUGHPUT_GOAL else "BELOW"
        summary[name] = {"direct": direct, "gateway": through, "ratio": ratio, "status": status}
        print(
            f"{name:<18}{direct or 0:>14,.0f}{through or 0:>14,.0f}{ratio or 0:>8.2f}  "
            f">= {THROUGHPUT_GOAL}x {status}"
        )
    e2e: dict[str, Any] = {}
    for q in ("p50_ms", "p99_ms"):
        direct = median_of(_rows(results, "e2e_latency_10k", "direct"), q)
        through = median_of(_rows(results, "e2e_latency_10k", "gateway"), q)
        added = through - direct if direct is not None and through is not None else None
        e2e[q] = {"direct": direct, "gateway": through, "added": added}
        print(
            f"e2e 10k/s {q[:3]:<8}{direct or 0:>11.2f} ms{through or 0:>11.2f} ms"
            f"{added or 0:>+8.2f}  (ms added)"
        )
    added_p99 = e2e["p99_ms"]["added"]
    e2e["status"] = "PASS" if added_p99 is not None and added_p99 <= ADDED_P99_GOAL_MS else "BELOW"
    print(f"latency added at 10k records/s, p99: goal <= +{ADDED_P99_GOAL_MS} ms {e2e['status']}")
    summary["e2e_latency_10k"] = e2e
    summary["go_records_api"] = go_api
    summary["idle_consume_streams"] = idle
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "options": {"count": count, "repeat": repeat, "e2e_seconds": e2e_seconds},
        "summary": summary,
        "results": results,
    }
    output.mkdir(parents=True, exist_ok=True)
    (output / "gateway.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {output / 'gateway.json'}")
    return doc


def go_records_api(gateway: GatewayProcess, count: int) -> dict[str, Any]:
    """The Go client's record-level produce and consume throughput, and the
    gateway's CPU time per record produced (user + system, from a run that
    only produces: on a loaded machine the steadier figure)."""
    import psutil

    built = go_example()
    if not isinstance(built, Path):
        print(f"Go record-level API: not run ({built})")
        return {"status": "NOT RUN", "reason": built}
    binary = str(built)

    def go_bench(*extra: str) -> dict[str, Any] | str:
        run_ = subprocess.run(
            [binary, "bench", "-gateway", gateway.address, "-topic", f"go-bench-{time.time_ns()}",
             "-records", str(count), "-size", str(RECORD_BYTES), *extra],
            capture_output=True, text=True, check=False, timeout=900,
        )  # fmt: skip
        if run_.returncode != 0:
            return run_.stderr.strip()[-500:]
        out: dict[str, Any] = json.loads(run_.stdout.strip().splitlines()[-1])
        return out

    process = psutil.Process(gateway.pid)
    before = process.cpu_times()
    produced = go_bench("-produce-only")
    after = process.cpu_times()
    result = go_bench()
    for outcome in (produced, result):
        if isinstance(outcome, str):
            print(f"Go record-level API: failed: {outcome}")
            return {"status": "FAILED", "reason": outcome}
    assert isinstance(result, dict)
    cpu_s = after.user + after.system - before.user - before.system
    result["produce_gateway_cpu_us_per_record"] = cpu_s / count * 1e6
    for key in ("produce_records_per_s", "consume_records_per_s"):
        result[key.replace("records_per_s", "status")] = (
            "PASS" if result[key] >= GO_RECORDS_GOAL else "BELOW"
        )
    print(
        f"Go client, Records API, {RECORD_BYTES} B: produce {result['produce_records_per_s']:,.0f}"
        f" rec/s {result['produce_status']}, consume {result['consume_records_per_s']:,.0f} rec/s "
        f"{result['consume_status']} (goal >= {GO_RECORDS_GOAL:,} each); gateway CPU "
        f"{result['produce_gateway_cpu_us_per_record']:.2f} us per record produced"
    )
    return result


def idle_consume_rss(bootstrap: str, gateway: GatewayProcess) -> dict[str, Any]:
    """The RSS of `gateway` (fresh) with IDLE_STREAMS idle Records.Consume
    streams over a backlog written direct to the brokers (`bootstrap`)."""
    import grpc.aio
    import psutil
    from tidelog import AdminClient, NewTopic, Producer
    from tidelog.v1 import log_pb2, records_pb2, records_pb2_grpc

    topic = f"gateway-idle-{time.time_ns()}"
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 3)])
    # A backlog of 16 KiB batches, 1 MiB per partition.
    with Producer(bootstrap_servers=bootstrap, batch_size=16 * 1024) as producer:
        for i in range(30_000):
            producer.send(topic, b"v" * RECORD_BYTES, partition=i % 3)
    process = psutil.Process(gateway.pid)

    async def hold() -> tuple[int, int]:
        channel = grpc.aio.insecure_channel(gateway.address)
        request = records_pb2.ConsumeRequest(
            positions=[
                records_pb2.ConsumePosition(topic=topic, partition=p, spec=log_pb2.EARLIEST)
                for p in range(3)
            ],
            credit_records=IDLE_CREDIT_RECORDS,
        )
        before = process.memory_info().rss
        calls = []
        try:
            for _ in range(IDLE_STREAMS):
                call = records_pb2_grpc.RecordsStub(channel).Consume(timeout=120)
                await call.write(request)  # and never read
                calls.append(call)
            peak = 0
            for _ in range(50):
                peak = max(peak, process.memory_info().rss)
                await asyncio.sleep(0.1)
            return before, peak
        finally:
            for call in calls:
                call.cancel()
            await channel.close(None)

    before, peak = asyncio.run(hold())
    print(
        f"gateway RSS with {IDLE_STREAMS} idle Records.Consume streams ({IDLE_CREDIT_RECORDS} "
        f"records of credit each): {peak / MIB:.0f} MiB (a fresh gateway: {before / MIB:.0f} MiB "
        "before, "
        f"{(peak - before) / IDLE_STREAMS / 1024:.0f} KiB a stream)"
    )
    return {
        "streams": IDLE_STREAMS,
        "credit_records": IDLE_CREDIT_RECORDS,
        "rss_before_mib": before / MIB,
        "rss_peak_mib": peak / MIB,
        "per_stream_kib": (peak - before) / IDLE_STREAMS / 1024,
    }


def _steps(
    address: str, pid: int, topic: str, count: int, e2e_seconds: float
) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    """One round's workloads against `address` (`pid`: the server measured)."""
    return [
        (
            "produce_100B",
            lambda: workloads.produce(
                address, pid, topic, count, RECORD_BYTES, workload="produce_100B"
            ),
        ),
        (
            # produce() wrote a warm-up record before the measured ones.
            "consume_100B",
            lambda: workloads.consume(
                address, pid, topic, count + 1, RECORD_BYTES, workload="consume_100B"
            ),
        ),
        (
            "e2e_latency_10k",
            lambda: workloads.end_to_end_latency(
                address,
                pid,
                f"{topic}-e2e",
                rate=10_000,
                seconds=e2e_seconds,
                record_bytes=RECORD_BYTES,
                workload="e2e_latency_10k",
                warmup_s=min(2.0, e2e_seconds / 2),
            ),
        ),
    ]


def _rows(results: list[dict[str, Any]], workload: str, path: str) -> list[dict[str, Any]]:
    return [r for r in results if r["workload"] == workload and r["system"] == f"tidelog-{path}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records per run")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, alternating the order")
    parser.add_argument("--e2e-seconds", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.repeat, args.e2e_seconds = 20_000, 1, 1.0
    # --quick is a smoke test: no Go build (the first one takes minutes).
    run(args.records, args.repeat, args.e2e_seconds, args.output, go=not args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
