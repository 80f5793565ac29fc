"""Tidelog's benchmark harness: ``python -m bench`` (``make bench``, ``make bench-kafka``).

Plain (``make bench``, Tidelog alone, a few minutes): produce throughput for 100 B and 1 KB
records (one synchronous Producer, acks=1); a consumer catching up 5 million 100 B records and
the 2 GB log of 1 KB records (the broker's RSS after it is checked against 300 MB), and the
paper's consumer test (10 million 200 B records, 200 KB fetches); end-to-end
latency at 10,000 records/s; the record codec micro-benchmark. Next to produce and consume runs
the gRPC ceiling (bench/grpc_ceiling.py): the bare transport moving the same bytes in messages
of the same size.

Each consume workload also runs through the columnar API (``<name>_arrow``: ``poll_arrow``,
Arrow record batches; ``--no-arrow`` skips it), compared with the same Kafka consumer run.

``--with-kafka`` (``make bench-kafka``, issue 6) adds Apache Kafka on the same machine in the
same invocation (bench/kafka_baseline.py), the paper's producer tests (batches of 1 and 50),
replication (``--replication``: a 3-broker Kafka; Tidelog has none yet) and fetch latency as
the log grows (``--big``: 100 MB, 1 GB, 5 GB). Runs repeat (``--repeat``, default 3 with
Kafka), alternating which system goes first; the report gives medians and min-max.

Writes ``<output>/latest.json`` (default bench/results) and, with ``--with-kafka`` (or
``--docs``) and not ``--quick``, regenerates docs/benchmarks.md and docs/benchmarks.png.
A missed target prints BELOW; it never fails the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidelog import AdminClient, NewTopic

from bench import kafka_baseline as kb
from bench import kafka_fetch, machine_probe, report, workloads
from bench._fixed_rate import E2E_RECORD_BYTES
from bench._processes import BrokerProcess, hwm_mb, rss_mb, tidelog_broker, tidelog_cluster
from bench.grpc_ceiling import ceiling_server

ROOT = Path(__file__).resolve().parents[1]
KIB = 1024
MIB = 1024 * 1024
PRODUCE_MESSAGE_BYTES = 256 * KIB  # the Producer's default batch_size: one batch per message
CONSUME_MESSAGE_BYTES = 1 * MIB  # the Consumer's default max_partition_fetch_bytes
PAPER_FETCH_BYTES = 204_800  # "about 200 KB per fetch"
# The same batching as Tidelog's default.
KAFKA_BATCH: dict[str, Any] = {"batch_size": 262_144, "linger_ms": 5}
#: The e2e *_si05 variants' sys.setswitchinterval (the interpreter's default is 5 ms).
SWITCH_INTERVAL_S = 0.0005

DESCRIPTIONS = {
    "produce_100B": "one producer, acks=1, 100-byte values, no key, batches of 256 KiB, "
    "linger 5 ms (Kafka: batch.size=262144, linger.ms=5, ProducerPerformance). p50/p99 are "
    "send-to-acknowledgement latencies (Tidelog: one record in a thousand probed).",
    "consume_100B_5M": "one consumer catching up the log produce_100B wrote, from offset 0, "
    "1 MiB per partition fetch (Kafka: ConsumerPerformance, same fetch sizes).",
    "produce_1KB": "as produce_100B with 1 KiB values; it writes the ~2 GB log of the RSS check.",
    "consume_1KB_2GB": "reading that ~2 GB log back; the broker's peak RSS afterwards is the "
    "issue-2 memory check.",
    "e2e_latency_10k": "a producer sends 100-byte records at a fixed 10,000 records/s "
    "(linger 0, acks=1) while a consumer reads the tail; latency = consumer receive time - "
    "send time, both in one process (Kafka: FixedRateLatency, one JVM). First 2 s not counted.",
    "e2e_latency_10k_2proc": "as e2e_latency_10k with the consumer in a process of its own "
    "(bench/e2e_consumer.py): producer and consumer no longer share one GIL (Kafka: "
    "FixedRateLatency's consumer and producer in two JVMs).",
    "e2e_latency_10k_async": "as e2e_latency_10k with the asyncio API: AsyncProducer and "
    "AsyncConsumer on one event loop, no thread hand-off (Kafka: the one-JVM run, repeated).",
    "e2e_latency_10k_si05": "as e2e_latency_10k with sys.setswitchinterval(0.0005) in the "
    "benchmark's process (the interpreter's default is 5 ms; the SDK never changes it): a thread "
    "woken by I/O waits at most 0.5 ms for the GIL (Kafka: the one-JVM run, repeated).",
    "e2e_latency_10k_2proc_si05": "as e2e_latency_10k_2proc with the 0.5 ms switch interval in "
    "both processes (Kafka: the two-JVM run, repeated).",
    "python_speed": "not Tidelog: iterations/s of a fixed pure-Python loop shaped like the "
    "clients' per-record work (bench/machine_probe.py), best of three seconds. Machines of this "
    "kind differ: one ran the same code ~1.7x slower per operation, and its e2e rows, near the "
    "two cores' limit at 10,000 records/s, ~3x slower at p50. Read a run against it.",
    "wakeup_10k": "not Tidelog: this machine's one-way wake-up of a process blocked on a pipe, "
    "paced at 10,000/s as the latency runs are (bench/machine_probe.py; a thread woken through a "
    "queue.SimpleQueue under detail). Every end-to-end record crosses several such wake-ups.",
    "paper_produce_batch1": "the Kafka paper's producer test: 200-byte messages, one "
    "producer, acks=1, batch.size holding one message, linger 0.",
    "paper_produce_batch50": "the same with batches of 50 messages, linger 10 ms.",
    "paper_consume_10M": "the paper's consumer test: one consumer reading 10 million 200-byte "
    "messages with 200 KB per fetch (max_partition_fetch_bytes = fetch_max_bytes = 204800, "
    "and one answer per gRPC message, as Kafka's fetch.max.bytes bounds a whole response).",
    "*_arrow": "the consume workload above it through the columnar API (Consumer.poll_arrow: "
    "one Arrow RecordBatch per fetch answer), same log, same fetch sizes; rows are counted "
    "from the batches, and the offsets (dense from 0) and a CRC32C over every value byte are "
    "checked, so that nothing is skipped. Ratios are against the same Kafka consumer run.",
    "replication_1KB_acks_all": "1 KiB records, acks=all, replication factor 3 and "
    "min.insync.replicas=2 on three local brokers of each system (opt-in: --replication).",
    "fetch_latency_*": "one fetch of one stored batch (raw Fetch: Tidelog's gRPC stream with one "
    "byte of credit per seek; Kafka's Fetch v4 with partition_max_bytes=1) at the tail and at a "
    "random old offset, as the log of 1 KiB records grows (opt-in: --big for 100 MB/1 GB/5 GB).",
}


#: What the profiles (perf, cProfile, thread CPU clocks; on this machine) say bounds Tidelog.
BOUNDS = """## What bounds Tidelog (profiles)

One client, one partition, broker and client sharing the machine's 2 cores: every microsecond
the broker spends per fetch answer is taken from the client. Per-answer and per-thread figures:
`python -m bench.fetch_profile` (consume) and `python -m bench.e2e_trace` (latency).

- **Produce, 100 B**: the client, on one GIL. `Producer.send` of a keyless bytes record is one
  C call into the topic's lane (`tidelog._cproduce`: no lock, the clock read in C), ~0.17 CPU s
  per million records in the caller's thread; so is a record with a bytes key (its partition's
  lane, the key's murmur2 in the same call: ~0.3 CPU s per million against ~1.2 through the
  accumulator's lock, `python -m bench.produce_profile --keys 1000`), a tombstone (~0.4 against
  ~1.6, `--tombstones 1`), a record with headers (~0.6-0.75 against ~2.3-3.0 with one to
  three, `--headers N`) and the records of a topic mixing keyed and keyless ones, whose sticky
  batch's lane takes both (~0.33 against ~0.96 when keyless records took the lock there,
  `--keys 1000 --partitions 4 --keyless-every 2`); the loop thread encodes
  each batch body in one C pass and writes each request's bytes by hand (`_produce_wire`),
  ~0.09 s; the broker ~0.12 s (`python -m bench.produce_profile`). Unthrottled, the producer
  fills buffer_memory, so the p50 here is time queued in the buffer. Kafka's own figure moves
  between runs (0.6-1.3M records/s on this machine).
- **Consume per record (`poll()`)**: the records' life. A C loop (`tidelog._crecords`) builds
  the ConsumerRecord tuples from checked columns (~70 ns each at 100 B) and freeing them costs
  about as much; the SDK keeps freed memory for reuse (`freed_memory_kept_bytes`: without it a
  third of the CPU went to page faults). CRC32C is a few percent. The rest is the fetch
  machinery per answer (below).
- **Consume through the columnar API** (`*_arrow`, `Consumer.poll_arrow`): the decode is no
  longer the limit (one C call checks an answer's batches and writes its Arrow buffers, one
  more hands them to pyarrow). Per 200 KB paper answer the client spends ~200 us: ~70 us on
  the calling thread (CRC32C ~17, the column pass ~9, the RecordBatch ~18, the wait for the
  answer ~20) and ~110-150 us in gRPC's receive (the loop thread's read of each message, its
  copy into a bytes object, callbacks; gRPC's own threads). The broker spends ~150 us per
  answer, ~60% of it in the kernel (loopback TCP send, the page-cache copy, wake-ups of
  grpc.aio's poller thread, twice per answer); its own code (fetch session, one pread per
  answer) is ~26 us. The cost is per message more than per byte (~130 us per message plus
  ~45 us per 272 KB, `python -m bench.fetch_transport_probe`; gRPC's blocking API is no
  cheaper): a consumer with small fetch sizes gets several answers per message
  (`fetch_answers_per_message`, up to 1 MiB), but the paper test keeps one 200 KB answer per
  message, as Kafka's fetch.max.bytes bounds a whole response.
- **1 KiB records**: bytes bound both sides (one copy into the answer on the broker, one out
  of it per value on the client); with glibc's default allocator settings both took hundreds
  of page faults per thousand records, and now set their thresholds at start (the broker's
  `--malloc-tuning`, docs/operations.md; the SDK's, docs/python-sdk.md).
- **End-to-end latency, requests per record**: at linger 0 the producer sent a request
  whenever its loop was free, up to `max_in_flight_requests` (5) at once: at 10,000 records/s
  ~2,300 requests/s of ~4.3 records each. It now keeps at most one partial batch of a
  partition in flight (`linger_while_in_flight`, Nagle's algorithm for batches; full batches
  still pipeline): ~2,000 requests/s of ~5 records, the broker's CPU per record ~5% lower, and
  the p99 0.48x in two processes (4.88 -> 2.34 ms), 0.74x in one (3.71 -> 2.73), 0.82x with
  asyncio (2.23 -> 1.83); p99.9 0.64x, 0.82x, 0.87x (`python -m bench.e2e_ab --base 5be224d`,
  4 alternated rounds per layout, lower in 4 of 4 each). The p50 did not move with the
  blocking clients and rose with asyncio (0.68 -> 0.83 ms): a record sent while its
  partition's request is out waits for the answer. Why the tail moved so much more than the
  CPU did is not traced; requests no longer queue behind each other on the broker's one
  Produce stream, each appended and answered in turn. Produce throughput, whose batches are
  full, did not move beyond the noise (paper_produce_batch50 with the option on and off in one
  process, 8 alternated rounds: 794k against 820k records/s, 0.97x, within the run-to-run
  spread of 717k-909k).
- **End-to-end latency** (per hop: each record timed at send, the sender's drain, the gRPC
  write, the broker's Produce handler taking the request, its append, its fetch answer, the
  consumer loop's arrival and poll()). An append resolves the long-poll in the same call, but
  the broker's receive is where the tail starts: the poller thread reads a request within
  ~0.1 ms, and in episodes of 10-230 ms the loop thread takes it 1-3 ms later (5-10% of the
  records at 2,000/s, with one core mostly idle). In those episodes the loop thread runs
  behind, preempted by client threads the kernel places on its core (it wakes them there:
  each gRPC write of the broker wakes its own poller thread and a client's), per perf's
  scheduler and syscall tracepoints. At 10,000/s with the consumer in its own process, both
  cores are ~94% busy (vmstat; Kafka's run as well) and that hop's p50 is ~1 ms. The asyncio
  clients on one loop pass each record through no other thread and have the lowest p99. The
  blocking clients of one process share one loop thread (`shared_loop_thread`; with a loop
  each, every gRPC completion woke both loops), so a record crosses three Python threads (the
  application's, the loop thread, the one in poll()), each woken and each waiting for the GIL.
  Two processes: the same threads per record plus grpc.aio's poller hop in each process, and
  three processes to be scheduled on 2 cores; Kafka's consumer reads its socket in poll()
  itself. A consumer that does so too (one Fetch call through gRPC's blocking API, its stream
  read by the polling thread itself: `python -m bench.e2e_direct_probe`, alternated with the
  Consumer) lowered the two-process p99 by ~10% (5.18 -> 4.64 ms, 4 rounds, on a day Kafka's
  was 2.25): the consumer's hops are a small part of the tail. At one record per request the
  producer's loop thread spends ~40 us of CPU per request, ~40% of it in gRPC's wake-up of its
  completion-queue poller (an eventfd write for every write and read it starts) and ~15% in
  the TCP send; the broker ~50 us, a third of it in context switches (the services run gRPC's
  long-standing transport, which saves one thread hop per message read: docs/operations.md).
  Scheduling gRPC's poller threads differently made it worse (4 alternated runs each, two
  processes): SCHED_BATCH, which never preempts on wake-up, took the p99 from ~7 to ~46 ms; a
  higher priority (nice -10) to ~11 ms, likely as a poller that preempts its loop thread then
  waits for the GIL that thread holds (not traced). Neither did a shorter GIL switch
  interval in the broker (0.5 ms: p99 0.98-1.06x, 5 alternated rounds per layout) nor a
  short scheduler slice (Linux's EEVDF `sched_setattr` runtime 0.1 ms against the 1.4 ms
  default) for the broker's threads (p99 1.07x and 1.03x) or the clients' loop threads
  (1.09x and 1.00x). The blocking clients' loop runs uvloop
  when installed (the SDK's `uvloop` extra, which `make install` installs; docs/python-sdk.md):
  p99 0.85-0.94x that with asyncio's loop in two processes, 0.92-0.95x in one (`python -m
  bench.e2e_ab`, 11 alternated rounds each, lower in 9); uvloop in the broker moved nothing
  (0.97-1.02x). p99.9 is below Kafka's in every layout.
- **Single-fetch latency** (`fetch_latency_*`): one gRPC stream round trip with Python on
  both ends, ~0.4-0.6 ms against Kafka's ~0.1-0.2 ms at p50.
"""


@dataclass
class Sizes:
    produce_100: int = 5_000_000
    produce_1k: int = 2_000_000
    e2e_rate: int = 10_000
    e2e_seconds: float = 10.0
    e2e_warmup_s: float = 2.0
    batch1: int = 20_000
    batch50: int = 500_000
    paper_consume: int = 10_000_000
    replication: int = 300_000
    fetch_mb: tuple[int, ...] = (100, 1000, 5000)
    fetch_samples: int = 300

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            produce_100=100_000,
            produce_1k=20_000,
            e2e_seconds=1.0,
            e2e_warmup_s=0.5,
            batch1=1_000,
            batch50=20_000,
            paper_consume=100_000,
            replication=20_000,
            fetch_mb=(10, 50, 100),
            fetch_samples=50,
        )


@dataclass
class Ctx:
    args: argparse.Namespace
    sizes: Sizes
    broker: BrokerProcess
    ceiling: tuple[str, int] | None
    kafka: kb.KafkaCluster | None
    install: kb.KafkaInstall | None
    runs: list[dict[str, Any]] = field(default_factory=list)
    #: (system, source workload) -> (topic, records): logs later workloads read.
    logs: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def systems(self, r: int) -> list[str]:
        order = ["tidelog", "kafka"] if self.kafka is not None else ["tidelog"]
        return order if r % 2 == 0 else order[::-1]

    def add(self, result: dict[str, Any]) -> None:
        self.runs.append(result)
        rps = result.get("records_per_s")
        p99 = result.get("p99_ms")
        print(
            f"  {result['workload']:<28}{result['system']:<13}"
            + (f"{rps:>14,.0f} rec/s" if rps is not None else "")
            + (f"   p99 {p99:.2f} ms" if p99 is not None else ""),
            flush=True,
        )

    def kafka_topic(self, name: str, rf: int = 1, cluster: kb.KafkaCluster | None = None) -> str:
        cluster = cluster or self.kafka
        assert cluster is not None
        kb.create_topic(cluster.bootstrap, name, 1, rf, install=self.install)
        return name


# ---------------------------------------------------------------------------- workloads


def _tidelog_produce(
    ctx: Ctx, topic: str, count: int, record_bytes: int, workload: str, **kw: Any
) -> dict[str, Any]:
    workloads.create_topic(ctx.broker.address, topic)
    return workloads.produce(
        ctx.broker.address, ctx.broker.pid, topic, count, record_bytes, workload=workload, **kw
    )


def _kafka_produce(
    ctx: Ctx, topic: str, count: int, record_bytes: int, workload: str, **kw: Any
) -> dict[str, Any]:
    assert ctx.kafka is not None
    ctx.kafka_topic(topic)
    options = kw or KAFKA_BATCH
    return kb.producer_perf(
        ctx.kafka.bootstrap,
        topic,
        count,
        record_bytes,
        acks="1",
        install=ctx.install,
        workload=workload,
        **options,
    )


def run_produce(ctx: Ctx, name: str, record_bytes: int, count: int) -> None:
    for r in range(ctx.args.repeat):
        for system in ctx.systems(r):
            topic = f"{name}-{r}"
            if system == "tidelog":
                ctx.add(_tidelog_produce(ctx, topic, count, record_bytes, name))
                if ctx.ceiling is not None:
                    total = count * (record_bytes + workloads.RECORD_OVERHEAD)
                    ctx.add(
                        workloads.ceiling(
                            *ctx.ceiling,
                            "upload",
                            PRODUCE_MESSAGE_BYTES,
                            total,
                            record_bytes,
                            name,
                        )
                    )
            else:
                ctx.add(_kafka_produce(ctx, topic, count, record_bytes, name))
            ctx.logs.setdefault((system, name), (topic, count))


def _ensure_log(
    ctx: Ctx, system: str, source: str, record_bytes: int, count: int
) -> tuple[str, int]:
    """The log a consume workload reads: the one its produce workload wrote, else write it."""
    if (system, source) in ctx.logs:
        return ctx.logs[(system, source)]
    topic = f"{source}-data"
    t0 = time.perf_counter()
    if system == "tidelog":
        _tidelog_produce(ctx, topic, count, record_bytes, source)
    else:
        _kafka_produce(ctx, topic, count, record_bytes, source)
    print(
        f"  ({system}: wrote {count:,} x {record_bytes} B to {topic} in "
        f"{time.perf_counter() - t0:.1f} s)",
        flush=True,
    )
    ctx.logs[(system, source)] = (topic, count)
    return topic, count


def run_consume(
    ctx: Ctx, name: str, source: str, record_bytes: int, count: int, fetch_bytes: int | None
) -> None:
    for system in ctx.systems(0):
        _ensure_log(ctx, system, source, record_bytes, count)
    for r in range(ctx.args.repeat):
        for system in ctx.systems(r):
            topic, available = ctx.logs[(system, source)]
            n = min(count, available)
            if system == "tidelog":
                # The per-record API, then the columnar one (poll_arrow) on the same log
                # with the same fetch sizes; which goes first alternates too.
                apis = [(workloads.consume, name), (workloads.consume_arrow, f"{name}_arrow")]
                if ctx.args.no_arrow:
                    apis = apis[:1]
                for consume, workload in apis if r % 2 == 0 else apis[::-1]:
                    ctx.add(
                        consume(
                            ctx.broker.address,
                            ctx.broker.pid,
                            topic,
                            n,
                            record_bytes,
                            workload=workload,
                            fetch_bytes=fetch_bytes,
                        )
                    )
                if ctx.ceiling is not None:
                    total = n * (record_bytes + workloads.RECORD_OVERHEAD)
                    message = fetch_bytes or CONSUME_MESSAGE_BYTES
                    ctx.add(
                        workloads.ceiling(
                            *ctx.ceiling, "download", message, total, record_bytes, name
                        )
                    )
            else:
                assert ctx.kafka is not None
                ctx.add(
                    kb.consumer_perf(
                        ctx.kafka.bootstrap,
                        topic,
                        n,
                        fetch_max_bytes=fetch_bytes or CONSUME_MESSAGE_BYTES,
                        record_size=record_bytes,
                        install=ctx.install,
                        workload=name,
                    )
                )


def run_e2e(ctx: Ctx, name: str) -> None:
    """Three Tidelog variants (one process, two processes, the asyncio API) and Kafka in one
    JVM and in two, alternating which system goes first."""
    s = ctx.sizes
    for r in range(ctx.args.repeat):
        # The machine's own speed and wake-up latency, the yardsticks of this repeat's rows.
        ctx.add(machine_probe.python_speed())
        ctx.add(machine_probe.measure(s.e2e_rate))
        for system in ctx.systems(r):
            topic = f"{name}-{r}"
            if system == "tidelog":
                common: dict[str, Any] = {
                    "rate": s.e2e_rate,
                    "seconds": s.e2e_seconds,
                    "record_bytes": E2E_RECORD_BYTES,
                    "warmup_s": s.e2e_warmup_s,
                }
                address, pid = ctx.broker.address, ctx.broker.pid
                # The consumer in a process of its own (a GIL per process), then in this one.
                ctx.add(
                    workloads.end_to_end_latency(
                        address,
                        pid,
                        f"{topic}-2proc",
                        workload=f"{name}_2proc",
                        processes=2,
                        **common,
                    )
                )
                ctx.add(workloads.end_to_end_latency(address, pid, topic, workload=name, **common))
                # The same two with the interpreter's switch interval at 0.5 ms (set by this
                # program, as an application would; the SDK never changes it).
                with workloads.switch_interval(SWITCH_INTERVAL_S):
                    for processes, suffix in ((2, "_2proc"), (1, "")):
                        result = workloads.end_to_end_latency(
                            address,
                            pid,
                            f"{topic}{suffix}-si05",
                            workload=f"{name}{suffix}_si05",
                            processes=processes,
                            **common,
                        )
                        result["detail"]["switch_interval_s"] = SWITCH_INTERVAL_S
                        ctx.add(result)
                ctx.add(
                    workloads.end_to_end_latency_async(
                        address, pid, f"{topic}-async", workload=f"{name}_async", **common
                    )
                )
            else:
                assert ctx.kafka is not None
                for processes, workload in ((1, name), (2, f"{name}_2proc")):
                    kafka_topic = ctx.kafka_topic(f"{topic}-{processes}jvm")
                    result = kb.end_to_end_latency(
                        ctx.kafka.bootstrap,
                        kafka_topic,
                        int(s.e2e_rate * s.e2e_seconds),
                        E2E_RECORD_BYTES,
                        rate_per_s=s.e2e_rate,
                        warmup_records=int(s.e2e_rate * s.e2e_warmup_s),
                        install=ctx.install,
                        workload=workload,
                        processes=processes,
                    )
                    ctx.add(result)
                    # Kafka's Java client has no asyncio API and the JVM no GIL: those
                    # variants are compared with the same run.
                    for variant in ("_async", "_si05") if processes == 1 else ("_si05",):
                        workload_name = f"{workload}{variant}"
                        ctx.add({**result, "workload": workload_name})


def run_paper_produce(ctx: Ctx, batch: int) -> None:
    name = f"paper_produce_batch{batch}"
    count = ctx.sizes.batch1 if batch == 1 else ctx.sizes.batch50
    linger = 0 if batch == 1 else 10
    for r in range(ctx.args.repeat):
        for system in ctx.systems(r):
            topic = f"{name}-{r}"
            if system == "tidelog":
                ctx.add(
                    _tidelog_produce(
                        ctx,
                        topic,
                        count,
                        200,
                        name,
                        batch_size=workloads.batch_size_for(batch, 200),
                        linger_ms=linger,
                    )
                )
            else:
                ctx.add(_kafka_produce(ctx, topic, count, 200, name, batch_records=batch))


def run_replication(ctx: Ctx) -> None:
    """1 KiB records, acks=all, replication factor 3 (min.insync.replicas=2) on
    three local brokers of each system. Opt-in: both start whole clusters."""
    name = "replication_1KB_acks_all"
    if not ctx.args.replication:
        ctx.notes.append(f"{name}: skipped (opt-in: --replication)")
        return
    for r in range(ctx.args.repeat):
        for system in ctx.systems(r):
            if system == "tidelog":
                ctx.add(_tidelog_replicated_produce(ctx, name, r))
            else:
                ctx.add(_kafka_replicated_produce(ctx, name, r))


def _tidelog_replicated_produce(ctx: Ctx, name: str, run: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    with tidelog_cluster(brokers=3) as cluster:
        print(f"  (3-broker Tidelog up in {time.perf_counter() - t0:.0f} s)", flush=True)
        topic = f"{name}-{run}"
        with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(topic, 1, 3, topic_configs={"min.insync.replicas": "2"})])
            leader = admin.describe_topics([topic])[0].partitions[0].leader
        return workloads.produce(
            cluster.bootstrap,
            next(b.pid for b in cluster.brokers if b.broker_id == leader),
            topic,
            ctx.sizes.replication,
            1024,
            workload=name,
            acks="all",
        )


def _kafka_replicated_produce(ctx: Ctx, name: str, run: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    with kb.KafkaCluster(ctx.install, broker_count=3) as cluster:
        print(f"  (3-broker Kafka up in {time.perf_counter() - t0:.0f} s)", flush=True)
        topic = f"{name}-{run}"
        kb.create_topic(
            cluster.bootstrap, topic, 1, 3, {"min.insync.replicas": "2"}, install=ctx.install
        )
        return kb.producer_perf(
            cluster.bootstrap,
            topic,
            ctx.sizes.replication,
            1024,
            acks="all",
            install=ctx.install,
            workload=name,
            **KAFKA_BATCH,
        )


def run_fetch_latency(ctx: Ctx) -> None:
    record_bytes = 1024
    written = {"tidelog": 0, "kafka": 0}
    topic = "fetch-latency"
    workloads.create_topic(ctx.broker.address, topic)
    if ctx.kafka is not None:
        ctx.kafka_topic(topic)
    rng = random.Random(20110612)
    for mb in ctx.sizes.fetch_mb:
        target = mb * 1_000_000 // record_bytes
        label = f"{mb}MB" if mb < 1000 else f"{mb // 1000}GB"
        for system in ctx.systems(0):
            more = target - written[system]
            t0 = time.perf_counter()
            if system == "tidelog":
                workloads.produce(
                    ctx.broker.address,
                    ctx.broker.pid,
                    topic,
                    more,
                    record_bytes,
                    workload="grow",
                )
                written[system] += more + 1  # + the producer's warm-up record
            else:
                assert ctx.kafka is not None
                kb.producer_perf(
                    ctx.kafka.bootstrap,
                    topic,
                    more,
                    record_bytes,
                    install=ctx.install,
                    **KAFKA_BATCH,
                )
                written[system] += more
            print(
                f"  ({system}: log grown to {label} in {time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
        for r in range(ctx.args.repeat):
            for system in ctx.systems(r):
                for where in ("tail", "random"):
                    name = f"fetch_latency_{where}_{label}"
                    kw: dict[str, Any] = dict(
                        samples=ctx.sizes.fetch_samples,
                        where=where,
                        workload=name,
                        record_bytes=record_bytes,
                        rng=rng,
                    )
                    if system == "tidelog":
                        ctx.add(
                            workloads.fetch_latency(
                                ctx.broker.address, ctx.broker.pid, topic, written[system], **kw
                            )
                        )
                    else:
                        assert ctx.kafka is not None
                        ctx.add(
                            kafka_fetch.fetch_latency(
                                ctx.kafka.bootstrap, ctx.kafka.pids, topic, written[system], **kw
                            )
                        )


def plan(ctx: Ctx) -> list[tuple[str, Callable[[], None]]]:
    s = ctx.sizes
    steps: list[tuple[str, Callable[[], None]]] = [
        ("produce_100B", lambda: run_produce(ctx, "produce_100B", 100, s.produce_100)),
        (
            "consume_100B_5M",
            lambda: run_consume(ctx, "consume_100B_5M", "produce_100B", 100, s.produce_100, None),
        ),
        ("produce_1KB", lambda: run_produce(ctx, "produce_1KB", 1024, s.produce_1k)),
        (
            "consume_1KB_2GB",
            lambda: run_consume(ctx, "consume_1KB_2GB", "produce_1KB", 1024, s.produce_1k, None),
        ),
        # The paper's consumer test (and its columnar variant) runs alone too: the third of
        # the consume workloads the per-record and columnar APIs are measured on.
        (
            "paper_consume_10M",
            lambda: run_consume(
                ctx, "paper_consume_10M", "produce_200B", 200, s.paper_consume, PAPER_FETCH_BYTES
            ),
        ),
        ("e2e_latency_10k", lambda: run_e2e(ctx, "e2e_latency_10k")),
    ]
    paper: list[tuple[str, Callable[[], None]]] = [
        ("paper_produce_batch1", lambda: run_paper_produce(ctx, 1)),
        ("paper_produce_batch50", lambda: run_paper_produce(ctx, 50)),
        ("replication_1KB_acks_all", lambda: run_replication(ctx)),
    ]
    fetch = [("fetch_latency", lambda: run_fetch_latency(ctx))]
    only = [o for o in (ctx.args.only or "").split(",") if o]
    if only:
        every = steps + paper + fetch
        return [(n, f) for n, f in every if any(n.startswith(o) for o in only)]
    if ctx.args.with_kafka:
        steps += paper
        if ctx.args.big or ctx.args.quick:
            steps += fetch
        else:
            ctx.notes.append("fetch_latency_*: skipped (opt-in: --big, 100 MB to 5 GB)")
    elif ctx.args.big:
        steps += fetch
    return steps


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--with-kafka", action="store_true", help="also run Apache Kafka (issue 6)")
    ap.add_argument("--repeat", type=int, help="runs per workload (default 1; 3 with Kafka)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    ap.add_argument("--only", help="comma-separated workload names or prefixes")
    ap.add_argument("--big", action="store_true", help="fetch latency up to a 5 GB log")
    ap.add_argument("--replication", action="store_true", help="Kafka with 3 brokers, acks=all")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the gRPC ceiling baseline")
    ap.add_argument("--no-codec", action="store_true", help="skip the codec micro-benchmark")
    ap.add_argument(
        "--no-arrow",
        action="store_true",
        help="consume workloads: skip the columnar (poll_arrow) variant",
    )
    ap.add_argument(
        "--broker-malloc-tuning",
        default="default",
        metavar="SPEC",
        help="the broker's --malloc-tuning ('off' for glibc's own settings; default %(default)s)",
    )
    ap.add_argument(
        "--output",
        type=Path,
        default=ROOT / "bench" / "results",
        help="directory for latest.json (default bench/results)",
    )
    ap.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="only regenerate docs/benchmarks.md and .png from a latest.json",
    )
    docs = ap.add_mutually_exclusive_group()
    docs.add_argument(
        "--docs",
        action="store_true",
        default=None,
        help="regenerate docs/benchmarks.md and .png (default: with --with-kafka)",
    )
    docs.add_argument("--no-docs", dest="docs", action="store_false")
    args = ap.parse_args(argv)
    if args.repeat is None:
        args.repeat = 3 if args.with_kafka else 1
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    if args.docs is None:
        args.docs = args.with_kafka and not args.quick
    return args


@contextlib.contextmanager
def _kafka(
    args: argparse.Namespace, notes: list[str]
) -> Iterator[tuple[kb.KafkaCluster | None, kb.KafkaInstall | None]]:
    if not args.with_kafka:
        yield None, None
        return
    try:
        install = kb.ensure_kafka()
        t0 = time.perf_counter()
        cluster = kb.KafkaCluster(install, broker_count=1)
        cluster.start()
    except kb.KafkaUnavailable as exc:
        why = f"Kafka baseline skipped: {exc.reason}"
        print(why, file=sys.stderr)
        notes.append(why)
        yield None, None
        return
    try:
        print(
            f"kafka {install.version} up in {time.perf_counter() - t0:.1f} s "
            f"(pid {cluster.pid}, {cluster.bootstrap})",
            flush=True,
        )
        yield cluster, install
    finally:
        cluster.stop()


def _write_docs(doc: dict[str, Any]) -> None:
    png = ROOT / "docs" / "benchmarks.png"
    chart = "benchmarks.png" if report.write_chart(doc, png) else None
    report.write_markdown(doc, ROOT / "docs" / "benchmarks.md", chart, DESCRIPTIONS, BOUNDS)
    print(f"wrote {ROOT / 'docs' / 'benchmarks.md'}" + (f" and {png}" if chart else ""))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        doc = json.loads(args.render.read_text())
        report.print_report(doc)
        _write_docs(doc)
        return 0
    sizes = Sizes.quick() if args.quick else Sizes()
    t_start = time.perf_counter()
    notes: list[str] = []
    micro = None
    memory: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(tidelog_broker("--malloc-tuning", args.broker_malloc_tuning))
        memory["rss_start_mb"] = rss_mb(broker.pid)
        print(f"tidelog broker pid {broker.pid} at {broker.address}", flush=True)
        ceiling = None if args.no_ceiling else stack.enter_context(ceiling_server())
        kafka, install = stack.enter_context(_kafka(args, notes))
        ctx = Ctx(args, sizes, broker, ceiling, kafka, install, notes=notes)
        for name, step in plan(ctx):
            t0 = time.perf_counter()
            print(f"[{name}]", flush=True)
            try:
                step()
            except Exception as exc:  # one workload failing must not lose the others
                why = f"{name}: failed: {type(exc).__name__}: {exc}"
                traceback.print_exc()
                notes.append(why.splitlines()[0])
            print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
        memory["rss_end_mb"] = rss_mb(broker.pid)
        memory["peak_mb"] = hwm_mb(broker.pid)
    if not args.no_codec and not args.only:
        from bench import codec_bench

        micro = codec_bench.run()
    options = {k: v for k, v in vars(args).items() if k not in ("docs", "no_ceiling", "no_codec")}
    options["output"] = str(args.output)
    doc = report.build_doc(
        ctx.runs,
        options=options,
        micro=micro,
        broker_memory=memory,
        notes=notes,
        elapsed_s=time.perf_counter() - t_start,
    )
    report.print_report(doc)
    out = args.output / "latest.json"
    report.write_json(doc, out)
    print(f"\nwrote {out}")
    if args.docs:
        _write_docs(doc)
    print(f"total {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
