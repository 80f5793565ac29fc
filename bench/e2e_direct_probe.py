"""What a consumer that reads its socket in poll() would give: ``python -m bench.e2e_direct_probe``.

Runs the two-process end-to-end latency workload (``e2e_latency_10k_2proc``: 10,000 records/s,
linger 0, acks=1, the consumer in a process of its own), alternating two consumer processes
round by round:

- ``consumer``: bench/e2e_consumer.py, the Consumer as it is (its answers cross gRPC's
  completion-queue poller thread and the SDK's loop thread before poll() takes them);
- ``direct``: one Fetch call made through gRPC's blocking API as a response stream of one
  request (the whole run's credit granted up front, the request side then closed; the broker
  streams until the credit is spent), with gRPC's single-threaded response stream
  (``grpc.experimental.SingleThreadedUnaryStream``): the thread that iterates the call polls
  its completion queue itself, so an answer wakes the application's thread and no other, as
  Kafka's consumer reads its socket in poll(). Records are decoded as the Consumer decodes them.

A measurement of what the consumer's thread hops cost end to end, not a consumer: no credit
grants, one partition, no groups.

Measured on 2026-11-28 (2-core machine, 4 rounds of 8 s, medians; the same day Kafka's two-JVM
run gave p99 2.25 ms): ``consumer`` p50 1.63, p99 5.18, p99.9 6.83 ms; ``direct`` p50 1.63,
p99 4.64, p99.9 6.35 ms. The consumer process's two extra hops cost ~10% of the p99; a consumer
that read its socket in poll() would still be ~2x Kafka's p99 on that day, whose tail comes from
the producer and broker processes sharing two busy cores (bench/e2e_trace.py).
"""

from __future__ import annotations

# First: it chooses gRPC's transport before grpc is imported.
import tidelog._grpc_setup  # noqa: F401

# isort: split
import argparse
import os
import statistics
import sys
import threading
import time
from array import array
from pathlib import Path
from typing import Any

import grpc
from tidelog import _fetch_wire, records
from tidelog.types import ConsumerRecord
from tidelog.v1 import log_pb2, log_pb2_grpc

from bench import workloads
from bench._fixed_rate import STAMP
from bench._processes import tidelog_broker

#: Credit for the whole run (the broker's limit is 1 GiB outstanding).
_CREDIT = 512 << 20


def child(argv: list[str]) -> int:
    """The ``direct`` consumer process: the arguments of bench/e2e_consumer.py."""
    address, topic, total_s, warmup_s, output = argv
    total, warmup = int(total_s), int(warmup_s)
    channel = grpc.insecure_channel(
        address, options=[("grpc.experimental.SingleThreadedUnaryStream", 1)]
    )
    end = (
        log_pb2_grpc.LogStub(channel)
        .ListOffsets(
            log_pb2.ListOffsetsRequest(
                partitions=[log_pb2.ListOffsetsPartition(topic=topic, partition=0, timestamp_ms=-1)]
            )
        )
        .partitions[0]
        .offset
    )
    fetch = channel.unary_stream(
        "/tidelog.v1.Log/Fetch",
        request_serializer=log_pb2.FetchRequest.SerializeToString,
        response_deserializer=_fetch_wire.parse,
    )
    call = fetch(
        log_pb2.FetchRequest(
            positions=[
                log_pb2.FetchPosition(
                    topic=topic, partition=0, fetch_offset=end, partition_max_bytes=1 << 20
                )
            ],
            credit_bytes=_CREDIT,
            max_bytes=1 << 20,
            min_bytes=1,
            max_wait_ms=100,
        )
    )
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        stop.set()
        call.cancel()

    threading.Thread(target=watch_stdin, daemon=True).start()
    print("ready", flush=True)
    latencies = array("d")
    seen = 0
    ns = time.perf_counter_ns
    unpack = STAMP.unpack_from
    try:
        for response in call:
            now = ns()
            for data in response.partitions:
                buf, start, stop_at = data.records_span()
                view = memoryview(buf)[start:stop_at]
                for pos, header in records.iter_batches(view):
                    for record in records.decode_records_at(
                        view, pos, header, ConsumerRecord, topic, 0, 0
                    ):
                        sent, seq = unpack(record.value or b"")
                        if seq >= total:
                            continue
                        if seq >= warmup:
                            latencies.append((now - sent) / 1e6)
                        seen += 1
            if seen >= total or stop.is_set():
                break
    except grpc.RpcError:
        if not stop.is_set():
            raise
    call.cancel()
    channel.close()
    with Path(output).open("wb") as f:
        latencies.tofile(f)
    print(f"received {seen}", flush=True)
    return 0


def _run(address: str, pid: int, mode: str, name: str, seconds: float) -> dict[str, Any]:
    command = ("bench.e2e_direct_probe", "--child") if mode == "direct" else ("bench.e2e_consumer",)
    return workloads.end_to_end_latency(
        address, pid, name, rate=10_000, seconds=seconds, record_bytes=100,
        workload="e2e", processes=2, consumer_command=command,
    )  # fmt: skip


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"consumer": [], "direct": []}
    with tidelog_broker() as broker:
        for round_ in range(args.rounds):
            modes = ("consumer", "direct") if round_ % 2 == 0 else ("direct", "consumer")
            for mode in modes:
                r = _run(broker.address, broker.pid, mode, f"direct-{mode}-{round_}", args.seconds)
                results[mode].append(r)
                print(
                    f"round {round_} {mode:8} p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} "
                    f"p99.9 {r['p999_ms']:.2f} ms received {r['records']}",
                    flush=True,
                )
    print(f"medians of {args.rounds} rounds (load average {os.getloadavg()[0]:.2f}):")
    for mode, runs in results.items():
        print(
            f"  {mode:8} p50 {statistics.median(r['p50_ms'] for r in runs):.2f} "
            f"p99 {statistics.median(r['p99_ms'] for r in runs):.2f} "
            f"p99.9 {statistics.median(r['p999_ms'] for r in runs):.2f} ms"
        )


if __name__ == "__main__":
    main()
