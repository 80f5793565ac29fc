"""Where a producer's CPU goes per record: ``python -m bench.produce_profile``.

Starts a broker, then sends `--records` keyless records of `--record-bytes` with one blocking
Producer (acks=1, linger 5 ms, 256 KiB batches: produce_100B's settings) as fast as the calling
thread can, `--repeat` times. For each run it prints records/s and CPU per million records, split
by thread: the calling thread (``main``: send() and the accumulator), the producer's event loop
(``loop``: the sender, batch encoding, gRPC's writes and reads) and every other thread of the
process (``other``: gRPC's own threads), and the broker's (its process CPU clock). It also counts
the produce requests and records per request (the sender's metrics) and the client's context
switches per request.

``--rate R``: instead of flat out, R records/s for ``--seconds`` with linger 0 (the
end-to-end latency workload's producer), to price a produce request rather than a record:
CPU per request of each thread and of the broker. Not one record per request: the records
that arrive while the sender waits for its last write to complete (one write per stream at
a time, completed through gRPC's poller thread) go in the next request together; the
records per request it prints say how many (~3.4 at 10,000/s on a quiet 2-core machine).

``--headers N``: each record carries N headers (16-byte values): what records with headers
cost each thread and the broker (its check of every header block).

``--keys N``: each record has one of N distinct 8-byte keys (in turn), so it goes to its key's
murmur2 partition (``--partitions P`` of them; default 1), the way most Kafka users send.
``--tombstones K`` (with ``--keys``): every K-th record is a tombstone (its value None, a
compacted topic's delete; 1: every record).
``--keyless-every N`` (with ``--keys``): every N-th record has no key (it goes to the topic's
sticky partition, as a keyless send does), the others their keys in turn: a workload that mixes
keyed and keyless records in one topic, whose sticky partition's batch takes both kinds.
``--linger-ms``, ``--batch-size`` and ``--buffer-memory`` change the producer's (e.g. linger
60,000 and 32 MiB batches: no request runs while the records are sent, so the calling thread's
cost is send()'s alone). Every run also prints the calling thread's CPU during the sends
alone (``send us/rec``: time.thread_time, the flush not included) and the share of the run's
wall time the sends took (``wall``: the rest is the flush).

``--send-only``: send() alone, against an accumulator nobody drains (huge buffer_memory; no
broker I/O), to price the calling thread's per-record work by itself: the locked append, and
send()'s path through the lanes of tidelog._cproduce (when built).

A/B against another git ref: ``bench._checkout.export("main", Path(d))`` unpacks that ref's SDK
and services into ``d``, builds its own C modules there and returns the PYTHONPATH that runs
them; run this module with that PYTHONPATH (the bench code stays this tree's; the broker it
starts inherits it) and without, alternately, and compare the medians of ``send us/rec``::

    PP=$(python -c 'from pathlib import Path; from bench import _checkout
    print(_checkout.export("main", Path("/tmp/ab")))')
    PYTHONPATH=$PP python -m bench.produce_profile --keys 1000 --partitions 4 --headers 1 \
        --linger-ms 60000 --batch-size 33554432 --buffer-memory 1073741824
    python -m bench.produce_profile --keys 1000 --partitions 4 --headers 1 ...

Not part of `make bench`.
"""

from __future__ import annotations

import argparse
import functools
import os
import threading
import time
from pathlib import Path

from tidelog import Producer

from bench import workloads
from bench._fixed_rate import PACER_SLEEP_S, FixedRatePacer
from bench._processes import tidelog_broker


def _process_cpu_ns(pid: int) -> int:
    """CPU time of another process, in ns (Linux's clockid for a process is (~pid << 3) | 2)."""
    return time.clock_gettime_ns(((~pid) << 3) | 2)


def _thread_cpu_s() -> dict[str, float]:
    """CPU seconds of each thread of this process so far, by thread name (from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[f"{name}/{task.name}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _switches() -> int:
    total = 0
    for status in Path("/proc/self/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.endswith("ctxt_switches:") or "ctxt_switches:" in line:
                total += int(line.split()[1])
    return total


def _classify(name: str, main_tid: int, loops: set[int | None]) -> str:
    tid = int(name.rsplit("/", 1)[1])
    if tid == main_tid:
        return "main"
    return "loop" if tid in loops else "other"


def run(
    address: str,
    broker_pid: int,
    topic: str,
    records: int,
    record_bytes: int,
    rate: int | None = None,
    headers: int = 0,
    keys: int = 0,
    linger_ms: int | None = None,
    producer_options: dict[str, int] | None = None,
    tombstones: int = 0,
    keyless_every: int = 0,
) -> None:
    """One run: `records` sends as fast as they go (linger 5 ms) or, with `rate`, at that
    many per second (linger 0); each record with `headers` headers (16-byte values) and,
    with `keys`, one of that many 8-byte keys in turn; with `tombstones` K, every K-th of
    those a tombstone (no value); with `keyless_every` N, every N-th record no key."""
    value = os.urandom(record_bytes)
    record_headers = [(f"header-{i}", os.urandom(16)) for i in range(headers)] or None
    key_list = [b"%08d" % i for i in range(keys)]
    main_tid = threading.get_native_id()
    if linger_ms is None:
        linger_ms = 5 if rate is None else 0
    with Producer(
        bootstrap_servers=address, acks=1, linger_ms=linger_ms, **(producer_options or {})
    ) as producer:
        producer.send(topic, value)
        producer.flush(timeout=30)  # the topic's metadata and connection, without the linger
        metrics0 = producer.metrics()["producer-metrics"]
        cpu0 = _thread_cpu_s()
        switches0 = _switches()
        broker0 = _process_cpu_ns(broker_pid)
        t0 = time.perf_counter()
        send = producer.send
        if record_headers is not None:
            send = functools.partial(send, headers=record_headers)
        send_cpu0 = time.thread_time()
        if rate is None and key_list and (tombstones or keyless_every):
            # Keys in turn, every tombstones-th value None, every keyless_every-th key None:
            # precomputed, as below.
            in_turn: list[bytes | None] = list(
                (key_list * (records // len(key_list) + 1))[:records]
            )
            if keyless_every:
                in_turn[keyless_every - 1 :: keyless_every] = [None] * (records // keyless_every)
            values = [
                None if tombstones and i % tombstones == tombstones - 1 else value
                for i in range(records)
            ]
            for key, record_value in zip(in_turn, values, strict=True):
                send(topic, record_value, key)
        elif rate is None and key_list:
            # Keys in turn: precomputed, so the loop costs what send() costs.
            for key in (key_list * (records // len(key_list) + 1))[:records]:
                send(topic, value, key)
        elif rate is None:
            for _ in range(records):
                send(topic, value)
        else:
            pacer = FixedRatePacer(rate, records)
            while not pacer.finished:
                for _ in pacer.due():
                    send(topic, value)
                time.sleep(PACER_SLEEP_S)
        send_cpu = time.thread_time() - send_cpu0
        send_s = time.perf_counter() - t0
        producer.flush(timeout=600)
        seconds = time.perf_counter() - t0
        broker_s = (_process_cpu_ns(broker_pid) - broker0) / 1e9
        cpu1 = _thread_cpu_s()
        loops = {t.native_id for t in threading.enumerate() if t.name.startswith("tidelog-")}
        switches = _switches() - switches0
        metrics1 = producer.metrics()["producer-metrics"]
    by_kind: dict[str, float] = {"main": 0.0, "loop": 0.0, "other": 0.0}
    for name, s in cpu1.items():
        by_kind[_classify(name, main_tid, loops)] += s - cpu0.get(name, 0.0)
    requests = metrics1["request-total"] - metrics0["request-total"]
    if rate is not None:
        per_request = 1e6 / max(requests, 1)
        print(
            f"{rate:,} rec/s, {records / max(requests, 1):.2f} rec/request; CPU us per request: "
            f"main {by_kind['main'] * per_request:.1f} loop {by_kind['loop'] * per_request:.1f} "
            f"other {by_kind['other'] * per_request:.1f} broker {broker_s * per_request:.1f} "
            f"({switches / max(requests, 1):.1f} client switches/request)",
            flush=True,
        )
        return
    per_m = 1e6 / records
    print(
        f"{records / seconds:>11,.0f} rec/s  send us/rec {send_cpu / records * 1e6:.3f} "
        f"(wall {send_s / seconds:.0%})  CPU s/M: main {by_kind['main'] * per_m:.3f} "
        f"loop {by_kind['loop'] * per_m:.3f} other {by_kind['other'] * per_m:.3f} "
        f"broker {broker_s * per_m:.3f}  requests {requests:,.0f} "
        f"({records / max(requests, 1):,.0f} rec/request, "
        f"{switches / max(requests, 1):.1f} switches/request)",
        flush=True,
    )


def send_only(records: int, record_bytes: int) -> None:
    """send() into an accumulator that is never drained: the calling thread's work alone."""
    from tidelog._accumulator import RecordAccumulator

    value = os.urandom(record_bytes)
    acc = RecordAccumulator(
        batch_size=256 * 1024, linger_ms=5, buffer_memory=1 << 40, wake=lambda: None
    )
    append = acc.append
    t0 = time.thread_time()
    size = 8 + record_bytes
    now_ns = time.time_ns
    for _ in range(records):
        append("t", -1, 1, None, value, None, now_ns() // 1_000_000, size, 60.0)
    print(f"accumulator.append alone: {(time.thread_time() - t0) / records * 1e9:.0f} ns/record")
    # What Producer.send does for such a record when tidelog._cproduce is built: the
    # topic's lane first (one C call), the locked append when there is none or it refuses
    # (the batch's first record, after each seal).
    acc = RecordAccumulator(
        batch_size=256 * 1024,
        linger_ms=5,
        buffer_memory=1 << 40,
        wake=lambda: None,
        lane_max_record=1 << 20,
    )
    append = acc.append
    lanes = acc.lanes
    t0 = time.thread_time()
    for _ in range(records):
        lane = lanes.get("t")
        if lane is None or lane.append(value) is None:
            append("t", -1, 1, None, value, None, now_ns() // 1_000_000, size, 60.0)
    print(f"send() through the lanes: {(time.thread_time() - t0) / records * 1e9:.0f} ns/record")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--send-only", action="store_true")
    parser.add_argument("--rate", type=int, help="records/s, linger 0 (default: flat out)")
    parser.add_argument("--seconds", type=float, default=10.0, help="with --rate")
    parser.add_argument("--headers", type=int, default=0, help="headers per record")
    parser.add_argument("--keys", type=int, default=0, help="distinct 8-byte keys (0: none)")
    parser.add_argument(
        "--tombstones", type=int, default=0, help="every K-th keyed record a tombstone (1: all)"
    )
    parser.add_argument(
        "--keyless-every",
        type=int,
        default=0,
        help="with --keys: every N-th record keyless (the others keyed; 1: none keyed)",
    )
    parser.add_argument("--partitions", type=int, default=1, help="the topic's partitions")
    parser.add_argument("--linger-ms", type=int, help="default 5 (0 with --rate)")
    parser.add_argument("--batch-size", type=int, help="bytes (default the producer's)")
    parser.add_argument("--buffer-memory", type=int, help="bytes (default the producer's)")
    args = parser.parse_args(argv)
    if args.tombstones and (args.keys <= 0 or args.rate is not None or args.tombstones < 0):
        parser.error("--tombstones K needs --keys N and no --rate (a tombstone has a key)")
    if args.keyless_every and (args.keys <= 0 or args.rate is not None or args.keyless_every < 0):
        parser.error("--keyless-every N needs --keys N and no --rate")
    records = args.records if args.rate is None else int(args.rate * args.seconds)
    if args.send_only:
        send_only(args.records, args.record_bytes)
        return
    with tidelog_broker() as broker:
        for r in range(args.repeat):
            topic = f"produce-profile-{r}"
            workloads.create_topic(broker.address, topic, args.partitions)
            options = {
                name: getattr(args, name)
                for name in ("batch_size", "buffer_memory")
                if getattr(args, name) is not None
            }
            run(
                broker.address,
                broker.pid,
                topic,
                records,
                args.record_bytes,
                args.rate,
                args.headers,
                args.keys,
                args.linger_ms,
                options,
                args.tombstones,
                args.keyless_every,
            )
            workloads.delete_topic(broker.address, topic)


if __name__ == "__main__":
    main()
