"""Tidelog workloads, driven through the public SDK against one broker process.

Every function returns one result dict in the schema of bench/kafka_baseline.py (``workload,
system, records_per_s, mb_per_s, p50_ms, p99_ms, p999_ms, rss_mb, cpu_s_per_million{broker,
client}, records, record_bytes, detail``). ``mb_per_s`` counts record values only (decimal
MB), as Kafka's figures here do. The client runs in this process (the SDK's background threads
included), so its CPU is this process's CPU over the workload; the broker's is its PID's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import crc32c
import grpc
from tidelog import (
    AdminClient,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    NewTopic,
    Producer,
    TopicPartition,
)
from tidelog._accumulator import BATCH_OVERHEAD, RECORD_OVERHEAD
from tidelog.v1 import log_pb2, log_pb2_grpc

from bench import grpc_ceiling
from bench._fixed_rate import (
    PACER_SLEEP_S,
    STAMP,
    WARMUP_SEQUENCE,
    FixedRatePacer,
    padding,
    stamped,
)
from bench._processes import Meter

Result = dict[str, Any]

#: One produce in this many carries an acknowledgement-latency probe (a callback).
_PROBE_EVERY = 1000

#: How long one poll of the catch-up reads waits for records (the log is already written).
_POLL_TIMEOUT_MS = 1000

#: How long the latency workloads wait, after the last send, for the reader to have every
#: record; one that has not is reported in detail (received below the records sent).
_TAIL_WAIT_S = 20.0


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of an already sorted list."""
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def make_result(
    workload: str,
    system: str,
    records: int,
    record_bytes: int,
    seconds: float,
    meter: dict[str, float | None],
    latencies_ms: Sequence[float] | None = None,
    detail: dict[str, Any] | None = None,
) -> Result:
    lat = sorted(latencies_ms or ())
    rps = records / seconds if seconds > 0 else 0.0
    per_m = 1e6 / records if records else 0.0
    server_cpu = meter.get("server_cpu_s")
    return {
        "workload": workload,
        "system": system,
        "records_per_s": round(rps, 1),
        "mb_per_s": round(rps * record_bytes / 1e6, 2),
        "p50_ms": _ms(percentile(lat, 50)),
        "p99_ms": _ms(percentile(lat, 99)),
        "p999_ms": _ms(percentile(lat, 99.9)),
        "rss_mb": meter.get("rss_mb"),
        "cpu_s_per_million": {
            "broker": None if server_cpu is None else round(server_cpu * per_m, 3),
            "client": round((meter.get("client_cpu_s") or 0.0) * per_m, 3),
        },
        "records": records,
        "record_bytes": record_bytes,
        "detail": {"wall_s": round(seconds, 3), **(detail or {})},
    }


def create_topic(address: str, topic: str, partitions: int = 1) -> None:
    with AdminClient(bootstrap_servers=address) as admin:
        admin.create_topics([NewTopic(topic, partitions)])


def delete_topic(address: str, topic: str) -> None:
    with AdminClient(bootstrap_servers=address) as admin:
        admin.delete_topics([topic])


def batch_size_for(records: int, record_bytes: int) -> int:
    """A producer batch_size that seals a batch after exactly `records` records."""
    return BATCH_OVERHEAD + records * (RECORD_OVERHEAD + record_bytes)


# ---------------------------------------------------------------------------- produce


def produce(
    address: str,
    broker_pid: int,
    topic: str,
    count: int,
    record_bytes: int,
    *,
    workload: str,
    acks: int | str = 1,
    linger_ms: int = 5,
    batch_size: int | None = None,
) -> Result:
    """One synchronous Producer sends `count` keyless records as fast as it can, then flushes.

    p50/p99 are acknowledgement latencies (send() to the future's callback) of one record in
    every thousand, as Kafka's ProducerPerformance reports send-to-callback latencies.
    """
    value = os.urandom(record_bytes)
    options: dict[str, Any] = {"acks": acks, "linger_ms": linger_ms}
    if batch_size is not None:
        options["batch_size"] = batch_size
    latencies: list[float] = []
    perf = time.perf_counter

    def probe(sent: float) -> Any:
        return lambda _md: latencies.append((perf() - sent) * 1000)

    with Producer(bootstrap_servers=address, **options) as producer:
        producer.send(topic, value).get(30)  # metadata, connection, first batch
        meter = Meter(broker_pid)
        t0 = perf()
        send = producer.send
        rounds, rest = divmod(count, _PROBE_EVERY)
        inner = range(_PROBE_EVERY - 1)
        for _ in range(rounds):
            send(topic, value).add_callback(probe(perf()))
            for _ in inner:
                send(topic, value)
        for _ in range(rest):
            send(topic, value)
        producer.flush(timeout=900)
        seconds = perf() - t0
        m = meter.done()
    return make_result(
        workload,
        "tidelog",
        count,
        record_bytes,
        seconds,
        m,
        latencies,
        {"producer": {**options, "batch_size": batch_size or 256 * 1024}, "topic": topic},
    )


# ---------------------------------------------------------------------------- consume


def _fetch_options(fetch_bytes: int | None) -> dict[str, Any]:
    """The Consumer options that set both fetch sizes to `fetch_bytes` (None: the defaults).

    A fixed fetch size (the paper's 200 KB) also keeps one answer per gRPC
    message: Kafka's fetch.max.bytes bounds a whole response, and the
    paper's test prices a fetch of that size, so several answers in one
    message (the Consumer's default when catching up) would compare a
    larger unit with Kafka's."""
    if fetch_bytes is None:
        return {}
    return {
        "max_partition_fetch_bytes": fetch_bytes,
        "fetch_max_bytes": fetch_bytes,
        "fetch_answers_per_message": 1,
    }


#: One poll's worth of reading: (consumer, records still wanted) -> records counted.
ReadPoll = Callable[[Consumer, int], int]


def _timed_read_from_start(
    address: str,
    broker_pid: int,
    topic: str,
    count: int,
    options: dict[str, Any],
    read: ReadPoll,
    timeout_s: float,
) -> tuple[int, float, dict[str, float | None]]:
    """A Consumer with `options` reads partition 0 from offset 0, one `read` per poll, until
    `count` records or `timeout_s`: (records, seconds, the Meter's figures). Only the loop is
    timed and metered: connecting and positioning come before."""
    tp = TopicPartition(topic, 0)
    consumer = Consumer(bootstrap_servers=address, **options)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        meter = Meter(broker_pid)
        t0 = time.perf_counter()
        deadline = t0 + timeout_s
        got = 0
        while got < count and time.perf_counter() < deadline:
            got += read(consumer, count - got)
        seconds = time.perf_counter() - t0
        figures = meter.done()
    finally:
        consumer.close()
    return got, seconds, figures


def _consume_result(
    workload: str,
    count: int,
    got: int,
    record_bytes: int,
    seconds: float,
    figures: dict[str, float | None],
    detail: dict[str, Any],
) -> Result:
    if got < count:
        detail["short_by"] = count - got
    return make_result(workload, "tidelog", got, record_bytes, seconds, figures, None, detail)


def _count_polled(consumer: Consumer, wanted: int) -> int:
    return sum(map(len, consumer.poll(timeout_ms=_POLL_TIMEOUT_MS, max_records=wanted).values()))


def consume(
    address: str,
    broker_pid: int,
    topic: str,
    count: int,
    record_bytes: int,
    *,
    workload: str,
    fetch_bytes: int | None = None,
    timeout_s: float = 600.0,
    consumer_options: dict[str, Any] | None = None,
) -> Result:
    """One Consumer reads `count` records from the start of partition 0 (catching up).

    The loop only counts the records poll() returns (decoded into ConsumerRecords by the SDK).
    `consumer_options` are more Consumer settings (an A/B's variant).
    """
    options: dict[str, Any] = {
        "max_poll_records": 1_000_000,
        **_fetch_options(fetch_bytes),
        **(consumer_options or {}),
    }
    got, seconds, figures = _timed_read_from_start(
        address, broker_pid, topic, count, options, _count_polled, timeout_s
    )
    detail: dict[str, Any] = {"consumer": options, "topic": topic}
    return _consume_result(workload, count, got, record_bytes, seconds, figures, detail)


def _value_span(batch: Any) -> memoryview:
    """The bytes of a RecordBatch's value column (its rows only, a slice honoured)."""
    values = batch.column(1)
    _validity, offsets, data = values.buffers()
    ends = memoryview(offsets).cast("i")
    first, last = values.offset, values.offset + len(values)
    return memoryview(data)[ends[first] : ends[last]]


#: How many value bytes `_repeated_crc32c` hands to crc32c at a time.
_CRC_BLOCK_BYTES = 1 << 20


def _repeated_crc32c(value: bytes, times: int) -> int:
    """crc32c of `value` repeated `times` times, without building it whole."""
    block = value * max(1, _CRC_BLOCK_BYTES // max(1, len(value)))
    per_block = max(1, len(block) // max(1, len(value)))
    crc = 0
    for _ in range(times // per_block):
        crc = crc32c.crc32c(block, crc)
    return crc32c.crc32c(value * (times % per_block), crc)


class _ArrowReadCheck:
    """consume_arrow's reader and the check of what it read: `read` (a ReadPoll) counts the
    rows of one poll_arrow, cuts the last batch at what is wanted and checks that offsets
    continue densely from 0 while chaining a CRC32C over the value bytes; `verify` compares
    that CRC, after the clock, with the one the log must give."""

    def __init__(self, workload: str) -> None:
        self.workload = workload
        self.rows = 0
        self.crc = 0
        self.value_bytes = 0
        self.first_value: bytes | None = None

    def read(self, consumer: Consumer, wanted: int) -> int:
        before = self.rows
        for batches in consumer.poll_arrow(timeout_ms=_POLL_TIMEOUT_MS).values():
            for batch in batches:
                rows = min(batch.num_rows, before + wanted - self.rows)
                if rows <= 0:
                    continue
                if rows < batch.num_rows:
                    batch = batch.slice(0, rows)
                self._check_offsets(batch.column(4).to_numpy())
                span = _value_span(batch)
                self.crc = crc32c.crc32c(span, self.crc)
                self.value_bytes += len(span)
                if self.first_value is None:
                    self.first_value = batch.column(1)[0].as_py()
                self.rows += rows
        return self.rows - before

    def _check_offsets(self, offsets: Any) -> None:
        if int(offsets[0]) != self.rows or not (offsets[1:] - offsets[:-1] == 1).all():
            raise RuntimeError(
                f"{self.workload}: offsets {int(offsets[0])}..{int(offsets[-1])} "
                f"after {self.rows} records: not dense from 0"
            )

    def verify(self) -> None:
        """Raises RuntimeError unless the rows read hold the first value, `rows` times."""
        if self.rows and (
            self.first_value is None
            or self.value_bytes != self.rows * len(self.first_value)
            or self.crc != _repeated_crc32c(self.first_value, self.rows)
        ):
            raise RuntimeError(
                f"{self.workload}: the values read do not match the log's ({self.rows} rows)"
            )

    def detail(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "value_bytes": self.value_bytes,
            "value_crc32c": f"{self.crc:08x}",
        }


def consume_arrow(
    address: str,
    broker_pid: int,
    topic: str,
    count: int,
    record_bytes: int,
    *,
    workload: str,
    fetch_bytes: int | None = None,
    timeout_s: float = 600.0,
) -> Result:
    """consume() through the columnar API: Consumer.poll_arrow, one pyarrow RecordBatch per
    fetch answer, with the same fetch sizes.

    Rows are counted from the batches (the last one cut at `count`), and the read is checked
    so that a fast figure cannot come from skipped data: each batch's offsets must continue
    the previous one's densely from 0 (a producer's log has no gaps), and a CRC32C is chained
    over every counted value byte. The logs the bench reads carry one value in every record
    (produce() sends the same bytes), so after the clock stops the chained CRC must equal
    that of the first value repeated `count` times; a missing, cut or altered value changes
    it. Raises RuntimeError when a check fails.
    """
    # The columnar API's own dependencies (the `arrow` extra; numpy for the offsets check),
    # imported before the clock starts as the per-record path's modules are.
    import numpy  # noqa: F401
    import tidelog._arrow_poll  # noqa: F401

    options = _fetch_options(fetch_bytes)
    check = _ArrowReadCheck(workload)
    got, seconds, figures = _timed_read_from_start(
        address, broker_pid, topic, count, options, check.read, timeout_s
    )
    check.verify()
    detail: dict[str, Any] = {
        "consumer": {**options, "api": "poll_arrow"},
        "topic": topic,
        "checked": check.detail(),
    }
    return _consume_result(workload, count, got, record_bytes, seconds, figures, detail)


# ---------------------------------------------------------------------------- latency

#: The interpreter switch interval the e2e consumer process (bench/e2e_consumer.py) sets.
SWITCH_INTERVAL_ENV = "TIDELOG_BENCH_SWITCH_INTERVAL_S"


@contextlib.contextmanager
def switch_interval(seconds: float | None) -> Iterator[None]:
    """Run with `sys.setswitchinterval(seconds)` in this process and in the e2e consumer
    processes started meanwhile; restored after. The SDK never changes it: this is what an
    application that wants it does (the e2e_latency_10k*_si05 variants)."""
    if seconds is None:
        yield
        return
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    os.environ[SWITCH_INTERVAL_ENV] = repr(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)
        os.environ.pop(SWITCH_INTERVAL_ENV, None)


class _TailReader:
    """The latency workload's consumer: a thread running `consume_tail`, or
    bench/e2e_consumer.py in a process of its own."""

    def __init__(
        self,
        address: str,
        topic: str,
        total: int,
        warmup: int,
        consume_tail: Any,
        processes: int,
        consumer_command: tuple[str, ...],
    ) -> None:
        self.total = total
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[str] | None = None
        fd, output = tempfile.mkstemp(prefix="tidelog-e2e-", suffix=".bin")
        os.close(fd)  # the consumer process writes it by name
        self._output = Path(output)
        if processes == 1:
            self._thread = threading.Thread(
                target=consume_tail, name="bench-e2e-consumer", daemon=True
            )
        else:
            self._args = [
                sys.executable, "-m", *consumer_command,
                address, topic, str(total), str(warmup), str(self._output),
            ]  # fmt: skip

    def start(self) -> None:
        if self._thread is not None:
            self._thread.start()
            return
        self._proc = subprocess.Popen(
            self._args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(Path(__file__).resolve().parents[1]),
        )
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "ready":
            self._proc.kill()
            self._proc.wait()
            raise RuntimeError("the latency consumer process did not start")

    def finished(self, received: int) -> bool:
        if self._thread is not None:
            return received >= self.total or not self._thread.is_alive()
        assert self._proc is not None
        return self._proc.poll() is not None

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            assert self._proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout)

    def stop(self, latencies: list[float]) -> list[float]:
        """Wait for the reader to end; the latencies it measured."""
        try:
            if self._thread is not None:
                self._thread.join(timeout=5)
                return latencies
            assert self._proc is not None and self._proc.stdin is not None
            self._proc.stdin.close()  # stop now if the trailers did not get through
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            measured = array("d")
            data = self._output.read_bytes()
            measured.frombytes(data[: len(data) // 8 * 8])
            return measured.tolist()
        finally:
            self._output.unlink(missing_ok=True)


def end_to_end_latency(
    address: str,
    broker_pid: int,
    topic: str,
    *,
    rate: int,
    seconds: float,
    record_bytes: int,
    workload: str,
    warmup_s: float = 2.0,
    processes: int = 1,
    consumer_command: tuple[str, ...] = ("bench.e2e_consumer",),
) -> Result:
    """Produce at a fixed rate (linger_ms=0, acks=1) while a consumer reads the tail: a
    thread of this process (`processes=1`), or a process of its own (`processes=2`,
    bench/e2e_consumer.py), so that producer and consumer do not share one GIL.
    `consumer_command`: the module (and its first arguments) that process runs with
    `python -m`, taking bench/e2e_consumer.py's arguments.

    Latency = the time the consumer's poll() returned the record minus the time it was given
    to send(), both from the same monotonic clock (CLOCK_MONOTONIC: one clock for every
    process). Records of the first `warmup_s` are not counted (as in Kafka's
    FixedRateLatency); the coordinated-omission corrected figures (from each record's
    scheduled send time) are under detail.
    """
    warmup = int(rate * warmup_s)
    total = warmup + int(rate * seconds)
    trailers = 0
    pad = padding(record_bytes)
    create_topic(address, topic)
    tp = TopicPartition(topic, 0)
    latencies: list[float] = []
    received = [0]
    ready = threading.Event()
    stop = threading.Event()
    ns = time.perf_counter_ns

    def consume_tail() -> None:
        with Consumer(bootstrap_servers=address, fetch_max_wait_ms=100) as consumer:
            consumer.assign([tp])
            consumer.seek_to_end(tp)
            consumer.position(tp)
            ready.set()
            unpack = STAMP.unpack_from
            while received[0] < total and not stop.is_set():
                polled = consumer.poll(timeout_ms=100)
                now = ns()
                for records in polled.values():
                    for record in records:
                        sent, seq = unpack(record.value or b"")
                        if seq >= total:
                            continue  # the warm-up record and the trailers
                        if seq >= warmup:
                            latencies.append((now - sent) / 1e6)
                        received[0] += 1

    reader = _TailReader(address, topic, total, warmup, consume_tail, processes, consumer_command)
    reader.start()
    if processes == 1 and not ready.wait(30):
        stop.set()
        raise RuntimeError("the latency consumer did not start within 30 s")
    schedule_lag: list[float] = []
    with Producer(bootstrap_servers=address, acks=1, linger_ms=0) as producer:
        producer.send(topic, stamped(WARMUP_SEQUENCE, pad)).get(30)
        send = producer.send
        meter = Meter(broker_pid)
        pacer = FixedRatePacer(rate, total)
        while not pacer.finished:
            for i in pacer.due():
                now = ns()
                send(topic, STAMP.pack(now, i) + pad)
                if i >= warmup:
                    schedule_lag.append(pacer.lag_ms(i, now))
            time.sleep(PACER_SLEEP_S)
        producer.flush(timeout=60)
        sent_s = pacer.elapsed_s()
        # Trailers (not measured) until the reader has every measured record: a fetch that
        # missed the wake-up of the last append would otherwise hold it until the next one.
        trailers = 0
        deadline = time.monotonic() + _TAIL_WAIT_S
        while not reader.finished(received[0]) and time.monotonic() < deadline:
            reader.join(timeout=0.05)
            if not reader.finished(received[0]):
                send(topic, stamped(total + trailers, pad))
                trailers += 1
        stop.set()
    lat = reader.stop(latencies)
    m = meter.done()
    detail = {
        "received": len(lat) + warmup if processes > 1 else received[0],
        "trailer_records": trailers,
        "processes": processes,
        "api": "Producer + Consumer (sync)",
    }
    if processes > 1:
        detail["client_cpu_note"] = "the producer process only; the consumer's is not counted"
    return _latency_result(
        workload, rate, total, warmup, record_bytes, sent_s, m, lat, schedule_lag, detail
    )


def _latency_result(
    workload: str,
    rate: int,
    total: int,
    warmup: int,
    record_bytes: int,
    sent_s: float,
    meter: dict[str, float | None],
    lat: list[float],
    schedule_lag: list[float],
    extra: dict[str, Any],
) -> Result:
    lag = sorted(schedule_lag)
    # Coordinated-omission corrected: a record sent late by the pacer waited that long too.
    corrected = sorted(a + b for a, b in zip(sorted(lat), lag, strict=False)) if lag else []
    detail = {
        "rate_target": rate,
        "achieved_send_rate": round(total / sent_s, 1),
        "warmup_records": warmup,
        **extra,
        "measured": len(lat),
        "mean_ms": round(statistics.fmean(lat), 3) if lat else None,
        "max_ms": round(max(lat), 3) if lat else None,
        "send_schedule_lag_p99_ms": _ms(percentile(lag, 99)),
        "p99_ms_upper_bound_with_lag": _ms(percentile(corrected, 99)),
        "producer": {"acks": 1, "linger_ms": 0},
    }
    # CPU per million over every record sent and consumed (warm-up included), as Kafka's.
    result = make_result(workload, "tidelog", total, record_bytes, sent_s, meter, lat, detail)
    result["records"] = len(lat)
    achieved = round(total / sent_s, 1)
    result["records_per_s"] = achieved
    result["mb_per_s"] = round(achieved * record_bytes / 1e6, 3)
    return result


def end_to_end_latency_async(
    address: str,
    broker_pid: int,
    topic: str,
    *,
    rate: int,
    seconds: float,
    record_bytes: int,
    workload: str,
    warmup_s: float = 2.0,
) -> Result:
    """`end_to_end_latency` with the asyncio API: an AsyncProducer and an AsyncConsumer on
    one event loop, the pacer a coroutine of the same loop, so no record crosses a thread."""
    return asyncio.run(
        _end_to_end_latency_async(
            address, broker_pid, topic, rate, seconds, record_bytes, workload, warmup_s
        )
    )


async def _end_to_end_latency_async(
    address: str,
    broker_pid: int,
    topic: str,
    rate: int,
    seconds: float,
    record_bytes: int,
    workload: str,
    warmup_s: float,
) -> Result:
    warmup = int(rate * warmup_s)
    total = warmup + int(rate * seconds)
    pad = padding(record_bytes)
    create_topic(address, topic)
    tp = TopicPartition(topic, 0)
    latencies: list[float] = []
    schedule_lag: list[float] = []
    received = 0
    ns = time.perf_counter_ns
    async with (
        AsyncConsumer(bootstrap_servers=address, fetch_max_wait_ms=100) as consumer,
        AsyncProducer(bootstrap_servers=address, acks=1, linger_ms=0) as producer,
    ):
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)

        async def consume_tail() -> None:
            nonlocal received
            unpack = STAMP.unpack_from
            while received < total:
                polled = await consumer.getmany(timeout_ms=100)
                now = ns()
                for records in polled.values():
                    for record in records:
                        sent, seq = unpack(record.value or b"")
                        if seq >= total:
                            continue  # the warm-up record
                        if seq >= warmup:
                            latencies.append((now - sent) / 1e6)
                        received += 1

        reader = asyncio.ensure_future(consume_tail())
        await (await producer.send(topic, stamped(WARMUP_SEQUENCE, pad)))
        send = producer.send
        meter = Meter(broker_pid)
        pacer = FixedRatePacer(rate, total)
        while not pacer.finished:
            for i in pacer.due():
                now = ns()
                await send(topic, STAMP.pack(now, i) + pad)
                if i >= warmup:
                    schedule_lag.append(pacer.lag_ms(i, now))
            await asyncio.sleep(PACER_SLEEP_S)
        await producer.flush()
        sent_s = pacer.elapsed_s()
        # No trailers needed: the long-poll answers every append. A reader still short after
        # the wait is cancelled; what it missed shows in detail["received"].
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reader, _TAIL_WAIT_S)
        m = meter.done()
    detail = {
        "received": received,
        "processes": 1,
        "api": "AsyncProducer + AsyncConsumer on one event loop",
    }
    return _latency_result(
        workload, rate, total, warmup, record_bytes, sent_s, m, latencies, schedule_lag, detail
    )


# ---------------------------------------------------------------------------- fetch latency


def fetch_latency(
    address: str,
    broker_pid: int,
    topic: str,
    end_offset: int,
    *,
    samples: int,
    where: str,
    workload: str,
    record_bytes: int,
    rng: random.Random,
) -> Result:
    """Latency of one fetch at the tail (the last record) or at a random old offset.

    A raw Fetch stream (no SDK decoding): each sample moves the position (a seek) and grants
    one byte of credit, so the broker answers with exactly one stored batch; the latency is
    the time from sending the request to receiving that response.
    """
    requests: list[log_pb2.FetchRequest | None] = []
    cond = threading.Condition()

    def request_iter() -> Any:
        while True:
            with cond:
                while not requests:
                    cond.wait()
                req = requests.pop(0)
            if req is None:
                return
            yield req

    latencies: list[float] = []
    with grpc.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    ) as channel:
        stub = log_pb2_grpc.LogStub(channel)
        responses = stub.Fetch(request_iter(), timeout=600)
        meter = Meter(broker_pid)
        # The session's credit balance: a response of one whole batch overdraws it, so each
        # request grants what brings it back to exactly one byte.
        balance = 0
        returned = 0
        try:
            for i in range(samples + 5):
                if where == "tail":
                    offset = max(0, end_offset - 1)
                else:
                    offset = rng.randrange(0, max(1, end_offset - 1000))
                req = log_pb2.FetchRequest(
                    positions=[
                        log_pb2.FetchPosition(topic=topic, partition=0, fetch_offset=offset)
                    ],
                    credit_bytes=1 - balance,
                    max_bytes=1024 * 1024,
                    min_bytes=1,
                    max_wait_ms=500,
                )
                balance = 1
                # Bounded: a sample without an answer in 10 s cancels the stream.
                watchdog = threading.Timer(10.0, responses.cancel)
                watchdog.start()
                t0 = time.perf_counter()
                with cond:
                    requests.append(req)
                    cond.notify()
                try:
                    while True:
                        resp = next(responses)  # type: ignore[call-overload]
                        part = resp.partitions[0]
                        if part.HasField("error") and part.error.code:
                            raise RuntimeError(f"fetch error at {offset}: {part.error}")
                        balance -= len(part.records)
                        if part.fetch_offset == offset:
                            break
                except grpc.RpcError as exc:
                    raise RuntimeError(f"no fetch answer at offset {offset} in 10 s") from exc
                finally:
                    watchdog.cancel()
                if i >= 5:  # the first few warm the stream
                    latencies.append((time.perf_counter() - t0) * 1000)
                    returned += len(part.records)
        finally:
            with cond:
                requests.append(None)
                cond.notify()
            responses.cancel()
        m = meter.done()
    return make_result(
        workload,
        "tidelog",
        len(latencies),
        record_bytes,
        sum(latencies) / 1000,
        m,
        latencies,
        {
            "where": where,
            "end_offset": end_offset,
            "samples": len(latencies),
            "mean_bytes_returned": round(returned / max(1, len(latencies))),
            "request": "Fetch stream, a seek + credit for one batch per sample",
        },
    )


# ---------------------------------------------------------------------------- gRPC ceiling


def ceiling(
    address: str,
    pid: int,
    direction: str,
    message_bytes: int,
    total_bytes: int,
    record_bytes: int,
    workload: str,
) -> Result:
    """The raw grpc.aio transport moving the same bytes in messages of the same size."""
    got = grpc_ceiling.measure(address, pid, direction, message_bytes, total_bytes)
    bytes_per_s = float(got["bytes_per_s"] or 0.0)
    records = int(float(got["bytes"] or 0) / (record_bytes + RECORD_OVERHEAD))
    seconds = float(got["wall_s"] or 1e-9)
    result = make_result(
        workload,
        "grpc-ceiling",
        records,
        record_bytes,
        seconds,
        got,
        None,
        {
            "direction": direction,
            "message_bytes": message_bytes,
            "wire_mb_per_s": round(bytes_per_s / 1e6, 1),
            "records_per_s_is": "wire bytes/s / (record_bytes + 8)",
        },
    )
    return result
