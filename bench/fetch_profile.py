"""Where a consumer's CPU goes per fetch: ``python -m bench.fetch_profile``.

Starts a broker, writes `--records` records of `--record-bytes` to one partition, then reads
them back from offset 0 with one Consumer per run (`--fetch-bytes` per fetch, as the paper's
test: 200 KB), in these modes, alternating for `--repeat` rounds:

- ``fetch``: the fetch machinery alone: the gRPC stream, `_fetch_wire`, the fetcher, the
  hand-off to the calling thread and `absorb`, with the records' decode stubbed out;
- ``record``: poll(), ConsumerRecords;
- ``arrow``: poll_arrow(), one RecordBatch per fetch.

For each run it prints client CPU per fetch, split by thread: the calling thread (``main``),
the consumer's event loop (``loop``) and every other thread of the process (``other``: gRPC's
own threads); the broker's CPU per fetch (its process CPU clock, to the ns; the system part
from /proc, in 10 ms ticks) and its context switches per fetch (all its threads); the client's
minor page faults and context switches per fetch, the time spent in `_fetch_wire.parse` and
`Fetcher.on_response` (the loop thread), and in ``arrow`` mode in `columnar.decode_fetch` and
the CRC32C checks within it (the calling thread). Not part of `make bench`.

``--session-only``: the broker's own part of an answer alone, in this process, without gRPC:
FetchSession's collect (the log read path) and the join of the answer's bytes, over a log of
batches of `--batch-records` records (1,250: a batch bigger than a 200 KB fetch, as the paper's
log is written; 150 at 100 B: many batches per fetch, so every read ends inside one). It applies
the broker's allocator settings first (malloc_tuning), as the broker does.

To see what the SDK's process-wide settings buy: `--no-memory-reuse` (ConsumerConfig's
freed_memory_kept_bytes=0), and GRPC_EXPERIMENTS="" in the environment (gRPC's default transport;
tidelog._grpc_setup).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The columnar path's imports, and ~60 ms of OpenBLAS threads spinning after numpy's import,
# before any clock starts.
import numpy  # noqa: F401
import psutil
import tidelog._arrow_poll  # noqa: F401
from tidelog import Consumer, TopicPartition, _arrow_poll, _fetch_wire, _fetcher, columnar

from bench import workloads
from bench._processes import tidelog_broker

_thread_ns = time.thread_time_ns


def _process_cpu_ns(pid: int) -> int:
    """CPU time of another process, in ns (its CPU clock: Linux's clockid for
    a process is (~pid << 3) | 2): finer than the 10 ms ticks of /proc."""
    return time.clock_gettime_ns(((~pid) << 3) | 2)


def _switches(pid: int) -> tuple[int, int]:
    """(voluntary, forced) context switches of every thread of `pid` so far."""
    voluntary = forced = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue  # a thread that ended
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                voluntary += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                forced += int(line.split()[1])
    return voluntary, forced


class _Counters:
    """Responses and partitions answered, the loop thread's time in two functions and the
    calling thread's in the columnar decode."""

    def __init__(self) -> None:
        self.messages = self.fetches = self.parse_ns = self.on_response_ns = 0
        self.decode_ns = self.crc_ns = 0
        self._parse = _fetch_wire.parse
        self._on_response = _fetcher.Fetcher.on_response
        self._decode_fetch = _arrow_poll.decode_fetch
        self._validate_batch = columnar.validate_batch

    def install(self) -> None:
        counters = self

        def parse(raw: bytes) -> Any:
            t = _thread_ns()
            try:
                return counters._parse(raw)
            finally:
                counters.parse_ns += _thread_ns() - t

        def on_response(fetcher: Any, session: Any, response: Any) -> None:
            counters.messages += 1
            counters.fetches += len(response.partitions)
            t = _thread_ns()
            counters._on_response(fetcher, session, response)
            counters.on_response_ns += _thread_ns() - t

        def decode_fetch(*args: Any, **kwargs: Any) -> Any:
            t = _thread_ns()
            try:
                return counters._decode_fetch(*args, **kwargs)
            finally:
                counters.decode_ns += _thread_ns() - t

        def validate_batch(*args: Any, **kwargs: Any) -> Any:
            t = _thread_ns()
            try:
                return counters._validate_batch(*args, **kwargs)
            finally:
                counters.crc_ns += _thread_ns() - t

        _fetch_wire.parse = parse  # type: ignore[assignment]
        _fetcher.Fetcher.on_response = on_response  # type: ignore[method-assign]
        _arrow_poll.decode_fetch = decode_fetch  # type: ignore[assignment]
        columnar.validate_batch = validate_batch  # type: ignore[assignment]

    def reset(self) -> None:
        self.messages = self.fetches = self.parse_ns = self.on_response_ns = 0
        self.decode_ns = self.crc_ns = 0


async def _thread_time() -> float:
    return time.thread_time()


def run(address: str, broker_pid: int, topic: str, count: int, mode: str, fetch_bytes: int,
        counters: _Counters, memory_reuse: bool,
        channel_options: tuple[tuple[str, int | str], ...] = ()) -> str:  # fmt: skip
    counters.reset()
    tp = TopicPartition(topic, 0)
    options: dict[str, Any] = {
        "max_partition_fetch_bytes": fetch_bytes,
        "fetch_max_bytes": fetch_bytes,
    }
    if not memory_reuse:
        options["freed_memory_kept_bytes"] = 0
    if channel_options:
        options["grpc_channel_options"] = channel_options
    consumer = Consumer(bootstrap_servers=address, max_poll_records=1_000_000, **options)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        loop_thread = consumer._loop_thread
        subs = consumer._subs
        if mode == "fetch":
            subs._decode = lambda *_args: ([], None)  # type: ignore[method-assign]
        broker = psutil.Process(broker_pid)
        broker0_system = broker.cpu_times().system
        broker_ns0, broker_switches0 = _process_cpu_ns(broker_pid), _switches(broker_pid)
        loop0 = loop_thread.run(_thread_time())
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        cpu0, main0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
        got = 0
        if mode == "record":
            while got < count:
                polled = consumer.poll(timeout_ms=1000, max_records=count - got)
                got += sum(map(len, polled.values()))
        elif mode == "arrow":
            while got < count:
                for batches in consumer.poll_arrow(timeout_ms=1000).values():
                    got += sum(batch.num_rows for batch in batches)
        else:
            state = subs._states[tp]
            while (state.fetched_to or 0) < count:
                consumer._data.clear()
                subs.absorb()
                if (state.fetched_to or 0) < count:
                    consumer._data.wait(1.0)
            got = state.fetched_to or 0
        wall = time.perf_counter() - wall0
        cpu, main = time.process_time() - cpu0, time.thread_time() - main0
        usage = resource.getrusage(resource.RUSAGE_SELF)
        loop = loop_thread.run(_thread_time()) - loop0
        broker_system = broker.cpu_times().system - broker0_system
        broker_ns = _process_cpu_ns(broker_pid) - broker_ns0
        broker_switches = _switches(broker_pid)
    finally:
        consumer.close()
    n = max(counters.fetches, 1)

    def us(seconds: float) -> str:
        return f"{seconds / n * 1e6:.0f}"

    return (
        f"{mode:6} {got / wall:>11,.0f} rec/s  client {cpu / got * 1e6:.3f} s/M rec  per fetch "
        f"({n} fetches in {counters.messages} messages): client {us(cpu)} us = main {us(main)} "
        f"+ loop {us(loop)} + other {us(cpu - main - loop)}; broker {broker_ns / n / 1e3:.1f} us "
        f"(system {us(broker_system)}, switches "
        f"{(broker_switches[0] - broker_switches0[0]) / n:.1f} voluntary "
        f"{(broker_switches[1] - broker_switches0[1]) / n:.1f} forced); "
        f"parse {counters.parse_ns / n / 1e3:.1f} us, on_response "
        f"{counters.on_response_ns / n / 1e3:.1f} us; decode {counters.decode_ns / n / 1e3:.1f} us "
        f"(CRC {counters.crc_ns / n / 1e3:.1f}); "
        f"faults {(usage.ru_minflt - usage0.ru_minflt) / n:.0f}, "
        f"switches {(usage.ru_nvcsw - usage0.ru_nvcsw) / n:.1f} voluntary "
        f"{(usage.ru_nivcsw - usage0.ru_nivcsw) / n:.1f} forced; "
        f"load {os.getloadavg()[0]:.2f}"
    )


def session_only(records: int, record_bytes: int, fetch_bytes: int, batch_records: int) -> str:
    """CPU per answer of FetchSession's collect + advance + join, reading a
    fresh log from offset 0 to its end three times (see the module doc)."""
    # Imported here: only this mode runs broker code in the bench's process.
    from tidelog.records import encode_batch
    from tidelog.v1 import log_pb2
    from tidelog_broker.config import BrokerConfig
    from tidelog_broker.fetch_session import FetchSession
    from tidelog_broker.malloc_tuning import apply_malloc_tuning, parse_malloc_tuning
    from tidelog_broker.partition_manager import PartitionManager

    apply_malloc_tuning(parse_malloc_tuning("default"))
    batch = encode_batch([os.urandom(record_bytes)] * batch_records)
    with tempfile.TemporaryDirectory(prefix="tidelog-fetch-session-") as data_dir:
        manager = PartitionManager(BrokerConfig(data_dir=Path(data_dir), auto_create_topics=True))
        manager.open()
        try:
            for _ in range(max(records // batch_records, 1)):
                manager.append("session", 0, batch)
            session = FetchSession(manager)
            session.apply(log_pb2.FetchRequest(max_bytes=fetch_bytes))
            position = log_pb2.FetchPosition(topic="session", partition=0, fetch_offset=0)
            # Credit for the whole log each round (spent by the answers), within
            # the session's limit on outstanding credit (1 GiB).
            credit = min(manager.partition_log("session", 0).log_bytes + fetch_bytes, 256 << 20)
            answers = 0
            cpu0 = time.process_time()
            for _ in range(3):
                session.apply(log_pb2.FetchRequest(positions=[position], credit_bytes=credit))
                while (collected := session._collect()).size:
                    session._advance(collected)
                    b"".join(collected.pieces)
                    answers += 1
            cpu = time.process_time() - cpu0
        finally:
            manager.close()
    return (
        f"session-only: {answers} answers of batches of {batch_records} x {record_bytes} B, "
        f"{fetch_bytes} B fetches: {cpu / answers * 1e6:.1f} us CPU per answer"
    )


def _channel_option(text: str) -> tuple[str, int | str]:
    key, _, value = text.partition("=")
    return key, int(value) if value.lstrip("-").isdigit() else value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--record-bytes", type=int, default=200)
    ap.add_argument("--fetch-bytes", type=int, default=204_800)
    ap.add_argument("--modes", default="fetch,record,arrow")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--no-memory-reuse", action="store_true", help="consumers with freed_memory_kept_bytes=0"
    )
    ap.add_argument(
        "--channel-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a gRPC channel option for the consumers (an int VALUE is passed as an int); "
        "repeatable. With --alternate, the runs alternate with and without them",
    )
    ap.add_argument(
        "--alternate", action="store_true", help="each mode with and without --channel-option"
    )
    ap.add_argument("--session-only", action="store_true", help="see the module doc")
    ap.add_argument("--batch-records", type=int, default=1250, help="with --session-only")
    args = ap.parse_args()
    if args.session_only:
        for _ in range(args.repeat):
            line = session_only(
                args.records, args.record_bytes, args.fetch_bytes, args.batch_records
            )
            print(line, flush=True)
        return
    counters = _Counters()
    counters.install()
    with tidelog_broker() as broker:
        topic = "fetch-profile"
        workloads.create_topic(broker.address, topic)
        workloads.produce(
            broker.address, broker.pid, topic, args.records, args.record_bytes, workload="fill"
        )
        chosen = tuple(_channel_option(text) for text in args.channel_option)
        variants = [(), chosen] if args.alternate else [chosen]
        for _ in range(args.repeat):
            for mode in args.modes.split(","):
                for channel_options in variants:
                    line = run(
                        broker.address, broker.pid, topic, args.records, mode, args.fetch_bytes,
                        counters, not args.no_memory_reuse, channel_options,
                    )  # fmt: skip
                    label = " ".join(f"{k}={v}" for k, v in channel_options)
                    print(line + (f"; options {label}" if label else ""), flush=True)


if __name__ == "__main__":
    if str(Path(__file__).resolve().parents[1]) not in sys.path:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
