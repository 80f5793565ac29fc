"""Where an end-to-end record's time goes: per-hop latencies at 10,000 records/s.

``python -m bench.e2e_trace [--mode sync|sync2|async|all] [--seconds S] [--rate R]`` starts one
broker (with trace hooks, in a process of its own), produces at a fixed rate with linger 0
and acks=1 while a consumer reads the tail, and timestamps every record
at each hand-off, all from CLOCK_MONOTONIC (``time.perf_counter_ns``, one clock for every
process of the machine):

    send      the caller hands the record to send() (stamped in the value)
    drain     the sender (producer event loop) takes its batch from the accumulator
    write     the Produce stream's write of its request returned (gRPC has the bytes)
    receive   the broker's Produce handler took the request from its stream (before the append)
    append    the broker appended it (PartitionManager.append returned; the long-polls
              of the partition are woken in that call)
    respond   the broker's fetch session built the response holding it (just before yield)
    arrive    the consumer's fetcher got that response (Fetcher.on_response, consumer loop)
    poll      poll()/getmany() returned it to the application

Hops are the differences of consecutive stamps; their p50/p99/p99.9 and, for the records
slower than the end-to-end p99, the mean of each hop (what the tail is made of) are printed,
then what each thread of this process cost per record over the measured seconds: CPU and
context switches (voluntary: it blocked, e.g. waiting for the GIL or a wake-up; involuntary:
the OS preempted it), from /proc. Unlike the tails these barely move with the load other
programs put on the machine, so they show what a change to the hand-offs saved.
Records are matched across processes by offset: the topic is new, so the producer's n-th
record is offset n. Hooks are wrappers installed on the SDK's and the broker's classes by
this module only (nothing in the SDK or broker changes); they cost a few microseconds per
batch, so figures here run slightly above the plain workload's. The garbage collector is off
in the client processes while they run: the hooks' own event lists (hundreds of thousands of
tuples) would otherwise set off full collections of tens of milliseconds that the plain
workload does not have (measured there: two collections in 10 s, under 2 ms together).

``--mode sync``: Producer + Consumer (a thread), each with its background loop, as
``e2e_latency_10k``; ``sync2``: the Consumer in a process of its own, as
``e2e_latency_10k_2proc``. ``--mode async``: AsyncProducer + AsyncConsumer on one event loop.
``all`` (the default) runs the three, each against a fresh broker.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import bisect
import gc
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench._fixed_rate import (
    E2E_RECORD_BYTES,
    PACER_SLEEP_S,
    STAMP,
    WARMUP_SEQUENCE,
    FixedRatePacer,
    padding,
    stamped,
)

ROOT = Path(__file__).resolve().parents[1]
HOPS = ("send", "drain", "write", "receive", "append", "respond", "arrive", "poll")

_ns = time.perf_counter_ns

# --------------------------------------------------------------------------- broker side


def broker_main(out: str, argv: list[str]) -> int:
    """Run the broker with hooks on the Produce handler, on append and on fetch responses;
    write their events to `out` at exit."""
    from tidelog_broker import __main__ as broker
    from tidelog_broker.fetch_session import FetchSession
    from tidelog_broker.log_servicer import LogServicer
    from tidelog_broker.partition_manager import PartitionManager

    # (first offset, last offset, t) of each batch the handler took, and appended.
    received: list[tuple[int, int, int]] = []
    appended: list[tuple[int, int, int]] = []
    responded: list[tuple[int, int, int]] = []  # (fetch offset, next offset, t)
    append = PartitionManager.append
    advance = FetchSession._advance
    append_request = LogServicer._append_request

    # When the Produce handler took the request whose partitions are being appended: the
    # handler appends them (PartitionManager.append) before it takes the next request, so
    # each append is paired with the latest value.
    handler_took = [0]

    def traced_append_request(self: Any, request: Any, payloads: Any) -> Any:
        handler_took[0] = _ns()
        return append_request(self, request, payloads)

    def traced_append(self: Any, topic: str, partition: int, data: bytes, acks: int = 1) -> Any:
        result = append(self, topic, partition, data, acks)
        appended.append((result.base_offset, result.last_offset, _ns()))
        received.append((result.base_offset, result.last_offset, handler_took[0]))
        return result

    def traced_advance(self: Any, collected: Any) -> None:
        t = _ns()
        for key, next_offset in collected.next_offsets.items():
            responded.append((self._positions[key].offset, next_offset, t))
        advance(self, collected)

    PartitionManager.append = traced_append  # type: ignore[method-assign]
    LogServicer._append_request = traced_append_request  # type: ignore[method-assign]
    FetchSession._advance = traced_advance  # type: ignore[method-assign]

    def dump() -> None:
        Path(out).write_text(
            json.dumps({"receive": received, "append": appended, "respond": responded})
        )

    atexit.register(dump)
    return int(broker.main(argv) or 0)


class _Broker:
    def __init__(self) -> None:
        sys.path.insert(0, str(ROOT))
        from bench._processes import service_environment
        from tests.support.processes import free_port, wait_serving

        self.dir = tempfile.mkdtemp(prefix="tidelog-trace-")
        self.trace = Path(self.dir) / "broker-trace.json"
        port, internal = free_port(), free_port()
        self.address = f"127.0.0.1:{port}"
        args = [
            sys.executable, "-m", "bench.e2e_trace", "--broker-trace", str(self.trace), "--",
            "--listen", self.address, "--data-dir", f"{self.dir}/data", "--broker-id", "0",
            "--internal-port", str(internal), "--auto-create-topics",
        ]  # fmt: skip
        self.log = open(Path(self.dir) / "broker.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            args, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT, env=service_environment()
        )
        try:
            wait_serving(self.address, 60, self.proc)
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            self.log.close()
            raise
        # What the broker's gRPC read when it was imported (once), from the serving process.
        environ = (Path("/proc") / str(self.proc.pid) / "environ").read_bytes().split(b"\0")
        self.grpc_experiments = next(
            (e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"GRPC_EXPERIMENTS=")),
            "",
        )

    def stop(self) -> dict[str, list[list[int]]]:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()
        data: dict[str, list[list[int]]] = json.loads(self.trace.read_text())
        shutil.rmtree(self.dir, ignore_errors=True)
        return data


# --------------------------------------------------------------------------- client side


class _ClientTrace:
    """Hooks on the SDK's sender and fetcher (installed once per process)."""

    def __init__(self) -> None:
        from tidelog import _fetcher, _sender
        from tidelog._accumulator import RecordAccumulator

        self.drained: list[tuple[int, int, int]] = []  # (first offset, last offset, t)
        self.written: list[tuple[int, int, int]] = []
        self.arrived: list[tuple[int, int, int]] = []  # (fetch offset, next offset, t)
        self._next = 0  # the offset of the next record drained (the topic is new)
        self._first: dict[int, tuple[int, int]] = {}  # id(batch) -> its offsets
        drain = RecordAccumulator.drain
        send = _sender.ProduceStream.send
        on_response = _fetcher.Fetcher.on_response
        trace = self

        def traced_drain(self: Any, *args: Any, **kw: Any) -> Any:
            ready, expired, deadline = drain(self, *args, **kw)
            if ready:
                t = _ns()
                for batch in ready:
                    first = trace._next
                    trace._next += batch.record_count()
                    trace._first[id(batch)] = (first, trace._next - 1)
                    trace.drained.append((first, trace._next - 1, t))
            return ready, expired, deadline

        async def traced_send(self: Any, request: Any, entry: Any) -> None:
            await send(self, request, entry)
            t = _ns()
            for group in entry.batches.values():
                for batch in group:
                    first, last = trace._first[id(batch)]
                    trace.written.append((first, last, t))

        def traced_on_response(self: Any, session: Any, response: Any) -> None:
            t = _ns()
            for data in response.partitions:
                trace.arrived.append((data.fetch_offset, data.next_offset - 1, t))
            on_response(self, session, response)

        RecordAccumulator.drain = traced_drain  # type: ignore[method-assign]
        _sender.ProduceStream.send = traced_send  # type: ignore[method-assign]
        _fetcher.Fetcher.on_response = traced_on_response  # type: ignore[method-assign]

    def reset(self) -> None:
        """Forget every event: the next run's topic starts at offset 0 again."""
        self.drained.clear()
        self.written.clear()
        self.arrived.clear()
        self._first.clear()
        self._next = 0


def _lookup(events: Sequence[Sequence[int]]) -> Callable[[int], int | None]:
    """offset -> the time of the earliest event whose [first, last] range holds it."""
    earliest: dict[int, tuple[int, int]] = {}
    for first, last, t in events:
        if first not in earliest or t < earliest[first][1]:
            earliest[first] = (last, t)
    firsts = sorted(earliest)

    def at(offset: int) -> int | None:
        i = bisect.bisect_right(firsts, offset) - 1
        if i < 0:
            return None
        last, t = earliest[firsts[i]]
        return t if offset <= last else None

    return at


# --------------------------------------------------------------------------- workloads


def _consume(
    address: str, topic: str, rate: int, total: int, ready: Callable[[], None]
) -> list[tuple[int, int, int]]:
    """A Consumer at the tail of partition 0 until it has the `total` + 1 records:
    (offset, send t, poll t) of each."""
    from tidelog import Consumer, TopicPartition

    tp = TopicPartition(topic, 0)
    polled: list[tuple[int, int, int]] = []
    with Consumer(bootstrap_servers=address, fetch_max_wait_ms=100) as consumer:
        consumer.assign([tp])
        consumer.seek_to_end(tp)
        consumer.position(tp)
        ready()
        deadline = time.monotonic() + total / rate + 30
        while len(polled) < total + 1 and time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=100)
            now = _ns()
            for records in got.values():
                for r in records:
                    polled.append((r.offset, STAMP.unpack_from(r.value or b"")[0], now))
    return polled


def consumer_child(argv: list[str]) -> int:
    """``--consumer-child ADDRESS TOPIC RATE TOTAL OUT``: `_consume` in a process of its own;
    prints ready, writes what it polled and its fetcher's arrivals to OUT."""
    address, topic, rate, total, out = argv
    gc.disable()  # see the module doc
    client = _ClientTrace()
    polled = _consume(address, topic, int(rate), int(total), lambda: print("ready", flush=True))
    Path(out).write_text(json.dumps({"polled": polled, "arrived": client.arrived}))
    return 0


def _sync_run(
    address: str, topic: str, rate: int, total: int, client: _ClientTrace, processes: int = 1
) -> list[tuple[int, int, int]]:
    """Producer + Consumer, as bench.workloads.end_to_end_latency: the consumer in a
    thread (`processes=1`) or in a process of its own (2)."""
    from tidelog import Producer

    polled: list[tuple[int, int, int]] = []
    ready = threading.Event()
    child = None
    if processes == 1:
        thread = threading.Thread(
            target=lambda: polled.extend(_consume(address, topic, rate, total, ready.set)),
            name="poll()",
            daemon=True,
        )
        thread.start()
        if not ready.wait(30):
            raise RuntimeError("the consumer thread did not start within 30 s")
    else:
        fd, name = tempfile.mkstemp(prefix="tidelog-trace-", suffix=".json")
        os.close(fd)  # the consumer process writes it by name
        out = Path(name)
        args = [sys.executable, "-m", "bench.e2e_trace", "--consumer-child", address, topic,
                str(rate), str(total), str(out)]  # fmt: skip
        child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            child.kill()
            child.wait()
            raise RuntimeError("the consumer process did not start")
    pad = padding(E2E_RECORD_BYTES)
    with Producer(bootstrap_servers=address, acks=1, linger_ms=0) as producer:
        producer.send(topic, stamped(WARMUP_SEQUENCE, pad)).get(30)
        pacer = FixedRatePacer(rate, total)
        while not pacer.finished:
            for i in pacer.due():
                producer.send(topic, stamped(i, pad))
            time.sleep(PACER_SLEEP_S)
        producer.flush(60)
    if child is None:
        thread.join(60)
        return polled
    try:
        child.wait(total / rate + 60)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        out.unlink()
        raise
    data = json.loads(out.read_text())
    out.unlink()
    client.arrived[:] = [tuple(a) for a in data["arrived"]]
    return [(p[0], p[1], p[2]) for p in data["polled"]]


async def _async_run(address: str, topic: str, rate: int, total: int) -> list[tuple[int, int, int]]:
    """AsyncProducer + AsyncConsumer on one event loop: no thread hand-off at all."""
    from tidelog import AsyncConsumer, AsyncProducer, TopicPartition

    tp = TopicPartition(topic, 0)
    polled: list[tuple[int, int, int]] = []
    pad = padding(E2E_RECORD_BYTES)
    async with (
        AsyncConsumer(bootstrap_servers=address, fetch_max_wait_ms=100) as consumer,
        AsyncProducer(bootstrap_servers=address, acks=1, linger_ms=0) as producer,
    ):
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)

        async def consume() -> None:
            deadline = time.monotonic() + total / rate + 30
            while len(polled) < total + 1 and time.monotonic() < deadline:
                got = await consumer.getmany(timeout_ms=100)
                now = _ns()
                for records in got.values():
                    for r in records:
                        polled.append((r.offset, STAMP.unpack_from(r.value or b"")[0], now))

        reader = asyncio.ensure_future(consume())
        await (await producer.send(topic, stamped(WARMUP_SEQUENCE, pad)))
        pacer = FixedRatePacer(rate, total)
        while not pacer.finished:
            for i in pacer.due():
                await producer.send(topic, stamped(i, pad))
            await asyncio.sleep(PACER_SLEEP_S)
        await producer.flush()
        await asyncio.wait_for(reader, total / rate + 60)
    return polled


# --------------------------------------------------------------------------- thread costs


def _thread_stats() -> dict[int, tuple[str, float, int, int]]:
    """Each thread of this process: (name, CPU s, voluntary, involuntary context switches)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float, int, int]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = (task / "status").read_text().splitlines()
            comm = (task / "comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        switches = {
            k: int(v) for k, v in (line.split(":") for line in status if "ctxt_switches" in line)
        }
        tid = int(task.name)
        out[tid] = (
            names.get(tid, comm),
            (int(stat[11]) + int(stat[12])) / tick,
            switches["voluntary_ctxt_switches"],
            switches["nonvoluntary_ctxt_switches"],
        )
    return out


class _ThreadSampler:
    """Per-thread CPU and context switches of this process between `start_s` and
    `start_s + window_s` from now, per record at `rate` (the measured part of a run)."""

    def __init__(self, start_s: float, window_s: float, rate: int) -> None:
        self.rows: list[tuple[str, float, float, float]] = []
        self._rate = rate
        self._thread = threading.Thread(target=self._run, args=(start_s, window_s), daemon=True)
        self._thread.start()

    def _run(self, start_s: float, window_s: float) -> None:
        time.sleep(start_s)
        before, t0 = _thread_stats(), time.monotonic()
        time.sleep(window_s)
        after, records = _thread_stats(), self._rate * (time.monotonic() - t0)
        for tid, (name, cpu, vol, invol) in sorted(after.items()):
            if tid not in before or tid == threading.get_native_id():
                continue
            _, cpu0, vol0, invol0 = before[tid]
            if cpu > cpu0 or vol > vol0:
                row = ((cpu - cpu0) * 1e6 / records, (vol - vol0) / records,
                       (invol - invol0) / records)  # fmt: skip
                self.rows.append((name, *row))

    def result(self) -> list[tuple[str, float, float, float]]:
        self._thread.join()
        return self.rows


# --------------------------------------------------------------------------- analysis


def _pct(values: list[float], q: float) -> float:
    from bench.workloads import percentile

    got = percentile(sorted(values), q)
    return round(got, 3) if got is not None else float("nan")


def analyse(
    polled: list[tuple[int, int, int]],
    client: _ClientTrace,
    broker: dict[str, list[list[int]]],
    warmup: int,
) -> dict[str, Any]:
    at = {
        "drain": _lookup(client.drained),
        "write": _lookup(client.written),
        "receive": _lookup(broker["receive"]),
        "append": _lookup(broker["append"]),
        "respond": _lookup(broker["respond"]),
        "arrive": _lookup(client.arrived),
    }
    rows: list[list[float]] = []
    for offset, sent, got in polled:
        if offset <= warmup:  # offset 0 is the warm-up record
            continue
        stamps = [sent]
        for name in HOPS[1:-1]:
            t = at[name](offset)
            if t is None:
                break
            stamps.append(t)
        else:
            stamps.append(got)
            rows.append([(b - a) / 1e6 for a, b in itertools.pairwise(stamps)])
    totals = [sum(r) for r in rows]
    names = [f"{a}->{b}" for a, b in itertools.pairwise(HOPS)]
    out: dict[str, Any] = {"records": len(rows)}
    cut = _pct(totals, 99)
    tail = [r for r, total in zip(rows, totals, strict=True) if total >= cut]
    for i, name in enumerate(names):
        col = [r[i] for r in rows]
        out[name] = {
            "p50": _pct(col, 50),
            "p99": _pct(col, 99),
            "p999": _pct(col, 99.9),
            "mean_in_tail": round(sum(r[i] for r in tail) / max(1, len(tail)), 3),
        }
    out["end_to_end"] = {
        "p50": _pct(totals, 50),
        "p99": cut,
        "p999": _pct(totals, 99.9),
        "mean_in_tail": round(sum(t for t in totals if t >= cut) / max(1, len(tail)), 3),
    }
    return out


def _gc_pauses() -> list[float]:
    """Durations (ms) of this process's garbage collections from now on."""
    pauses: list[float] = []
    started = [0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = _ns()
        else:
            pauses.append((_ns() - started[0]) / 1e6)

    gc.callbacks.append(callback)
    return pauses


def _print(mode: str, result: dict[str, Any]) -> None:
    print(f"\n{mode}: {result['records']} records traced")
    print(f"  {'hop':<18}{'p50':>9}{'p99':>9}{'p99.9':>9}{'mean in e2e tail':>18}")
    for name, row in result.items():
        if name in ("records", "threads", "broker_grpc_experiments") or name.startswith("gc_"):
            continue
        print(
            f"  {name:<18}{row['p50']:>9.3f}{row['p99']:>9.3f}{row['p999']:>9.3f}"
            f"{row['mean_in_tail']:>18.3f}"
        )
    print(f"  garbage collections over 1 ms: {result['gc_pauses_ms_over_1']}")
    rows = result.get("threads") or []
    if rows:
        head = f"  {'thread (this process)':<34}{'CPU us/rec':>11}{'vol cs/rec':>11}"
        print(f"{head}{'invol/rec':>10}")
        total = ("all", *(sum(row[i] for row in rows) for i in (1, 2, 3)))
        for name, cpu, vol, invol in [*rows, total]:
            print(f"  {name[:33]:<34}{cpu:>11.1f}{vol:>11.2f}{invol:>10.2f}")


def main(argv: list[str] | None = None) -> int:
    from bench.workloads import create_topic

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--broker-trace"]:
        return broker_main(argv[1], argv[3:])
    if argv[:1] == ["--consumer-child"]:
        return consumer_child(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m bench.e2e_trace", description=__doc__)
    ap.add_argument("--mode", choices=("sync", "sync2", "async", "all"), default="all")
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--switch-interval",
        type=float,
        help="sys.setswitchinterval for this process (seconds; the interpreter's default 0.005)",
    )
    args = ap.parse_args(argv)
    gc.disable()  # see the module doc
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    pauses = _gc_pauses()
    warmup = int(args.rate * args.warmup_s)
    total = warmup + int(args.rate * args.seconds)
    modes = ["sync", "sync2", "async"] if args.mode == "all" else [args.mode]
    results: dict[str, Any] = {}
    client = _ClientTrace()
    for mode in modes:
        client.reset()
        broker = _Broker()
        try:
            topic = f"trace-{mode}-{os.getpid()}"
            create_topic(broker.address, topic)
            # The clients start within a second or so; the window ends before the producer does.
            sampler = _ThreadSampler(args.warmup_s + 1, max(args.seconds - 2, 1), args.rate)
            if mode.startswith("sync"):
                processes = 2 if mode == "sync2" else 1
                polled = _sync_run(broker.address, topic, args.rate, total, client, processes)
            else:
                polled = asyncio.run(_async_run(broker.address, topic, args.rate, total))
        finally:
            events = broker.stop()
        results[mode] = analyse(polled, client, events, warmup)
        results[mode]["broker_grpc_experiments"] = broker.grpc_experiments
        results[mode]["threads"] = sampler.result()
        long = sorted(p for p in pauses if p >= 1.0)
        results[mode]["gc_pauses_ms_over_1"] = {
            "count": len(long),
            "max": round(long[-1], 2) if long else 0,
            "sum": round(sum(long), 1),
        }
        pauses.clear()
        _print(mode, results[mode])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
