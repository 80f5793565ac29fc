"""Client CPU per fetch answer by receive path: ``python -m bench.fetch_transport_probe``.

Starts a broker, writes `--records` records of `--record-bytes` to one partition, then reads
them from offset 0 (`--fetch-bytes` answers, an 8 MiB credit window granted back per 2 MiB, as
the Consumer does) over each receive path, alternating for `--repeat` rounds:

- ``consumer``: the Consumer's fetch machinery, decode stubbed (bench.fetch_profile's ``fetch``);
- ``aio``: a bare grpc.aio Fetch stream on a loop thread, handed to the calling thread through a
  deque and an Event (the Consumer's hand-off, without the Fetcher);
- ``sync``: gRPC's blocking API, the stream read on a reader thread, the same hand-off;
- ``inline``: gRPC's blocking API, the stream read in the calling thread itself.

Prints, per answer: the client's CPU (process clock), the calling thread's, and the wall rate.
A measurement, not part of `make bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import resource
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# First: it chooses gRPC's transport before grpc is imported.
import tidelog._grpc_setup  # noqa: F401

# isort: split
import grpc
import grpc.aio
from tidelog import _fetch_wire
from tidelog.v1 import log_pb2

from bench import fetch_profile, workloads
from bench._processes import tidelog_broker

_WINDOW = 8 << 20
_GRANT = _WINDOW // 4
_METHOD = "/tidelog.v1.Log/Fetch"


def _first_request(topic: str, fetch_bytes: int) -> log_pb2.FetchRequest:
    return log_pb2.FetchRequest(
        positions=[
            log_pb2.FetchPosition(
                topic=topic, partition=0, fetch_offset=0, partition_max_bytes=fetch_bytes
            )
        ],
        credit_bytes=_WINDOW,
        max_bytes=fetch_bytes,
        min_bytes=1,
        max_wait_ms=500,
    )


def _options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", 64 << 20),
        ("grpc.max_send_message_length", 64 << 20),
    ]


class _Reader:
    """Counts answers and records on the calling side, and grants credit back."""

    def __init__(self, count: int, grant: Callable[[int], None]) -> None:
        self.count = count
        self.answers = 0
        self.next_offset = 0
        self._owed = 0
        self._grant = grant

    def take(self, response: _fetch_wire.FetchedResponse) -> None:
        for data in response.partitions:
            self.answers += 1
            self.next_offset = data.next_offset
            self._owed += data.records_size
        if self._owed >= _GRANT:
            self._grant(self._owed)
            self._owed = 0

    @property
    def done(self) -> bool:
        return self.next_offset >= self.count


def _requests(q: queue.Queue[log_pb2.FetchRequest | None]) -> Iterator[log_pb2.FetchRequest]:
    while True:
        request = q.get()
        if request is None:
            return
        yield request


def _sync_call(address: str, topic: str, fetch_bytes: int) -> tuple[Any, Any, Any]:
    channel = grpc.insecure_channel(address, options=_options())
    fetch = channel.stream_stream(
        _METHOD,
        request_serializer=log_pb2.FetchRequest.SerializeToString,
        response_deserializer=_fetch_wire.parse,
    )
    requests: queue.Queue[log_pb2.FetchRequest | None] = queue.Queue()
    requests.put(_first_request(topic, fetch_bytes))
    return channel, fetch(_requests(requests)), requests


def run_inline(address: str, topic: str, count: int, fetch_bytes: int) -> tuple[int, float]:
    channel, call, requests = _sync_call(address, topic, fetch_bytes)
    reader = _Reader(count, lambda n: requests.put(log_pb2.FetchRequest(credit_bytes=n)))
    try:
        t0 = time.thread_time()
        for response in call:
            reader.take(response)
            if reader.done:
                break
        main = time.thread_time() - t0
    finally:
        requests.put(None)
        call.cancel()
        channel.close()
    return reader.answers, main


def run_sync_thread(address: str, topic: str, count: int, fetch_bytes: int) -> tuple[int, float]:
    channel, call, requests = _sync_call(address, topic, fetch_bytes)
    inbox: deque[Any] = deque()
    ready = threading.Event()

    def read() -> None:
        try:
            for response in call:
                inbox.append(response)
                ready.set()
        except grpc.RpcError:
            pass

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    reader = _Reader(count, lambda n: requests.put(log_pb2.FetchRequest(credit_bytes=n)))
    try:
        t0 = time.thread_time()
        while not reader.done:
            ready.clear()
            while inbox:
                reader.take(inbox.popleft())
            if not reader.done:
                ready.wait(1.0)
        main = time.thread_time() - t0
    finally:
        requests.put(None)
        call.cancel()
        thread.join(5)
        channel.close()
    return reader.answers, main


def run_aio(address: str, topic: str, count: int, fetch_bytes: int) -> tuple[int, float]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    inbox: deque[Any] = deque()
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def start() -> None:
        channel = grpc.aio.insecure_channel(address, options=_options())
        requests: asyncio.Queue[log_pb2.FetchRequest | None] = asyncio.Queue()
        requests.put_nowait(_first_request(topic, fetch_bytes))

        async def request_iterator() -> Any:
            while (request := await requests.get()) is not None:
                yield request

        call = channel.stream_stream(
            _METHOD,
            request_serializer=log_pb2.FetchRequest.SerializeToString,
            response_deserializer=_fetch_wire.parse,
        )(request_iterator())

        async def read() -> None:
            try:
                async for response in call:
                    inbox.append(response)
                    ready.set()
            except grpc.aio.AioRpcError:
                pass

        state.update(
            channel=channel, requests=requests, call=call, task=asyncio.ensure_future(read())
        )

    asyncio.run_coroutine_threadsafe(start(), loop).result()
    requests = state["requests"]

    def grant(n: int) -> None:
        loop.call_soon_threadsafe(requests.put_nowait, log_pb2.FetchRequest(credit_bytes=n))

    reader = _Reader(count, grant)

    async def stop() -> None:
        requests.put_nowait(None)
        state["call"].cancel()
        await asyncio.gather(state["task"], return_exceptions=True)
        await state["channel"].close()

    async def loop_cpu() -> float:
        return time.thread_time()

    try:
        loop0 = asyncio.run_coroutine_threadsafe(loop_cpu(), loop).result()
        t0 = time.thread_time()
        while not reader.done:
            ready.clear()
            while inbox:
                reader.take(inbox.popleft())
            if not reader.done:
                ready.wait(1.0)
        main = time.thread_time() - t0
        loop_s = asyncio.run_coroutine_threadsafe(loop_cpu(), loop).result() - loop0
        print(f"         aio loop thread: {loop_s / max(reader.answers, 1) * 1e6:.0f} us/answer")
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    return reader.answers, main


def _threads() -> dict[str, float]:
    """CPU seconds of this process's threads so far, by name (/proc ticks)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc/self/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        key = f"{name}:{stat.parent.name}"
        out[key] = (int(fields[11]) + int(fields[12])) / tick
    return out


def measure(mode: str, address: str, broker_pid: int, topic: str, count: int, fetch_bytes: int,
            counters: fetch_profile._Counters) -> str:  # fmt: skip
    if mode == "consumer":
        return fetch_profile.run(
            address, broker_pid, topic, count, "fetch", fetch_bytes, counters, True
        )
    runner = {"aio": run_aio, "sync": run_sync_thread, "inline": run_inline}[mode]
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    broker0 = fetch_profile._process_cpu_ns(broker_pid)
    threads0 = _threads()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    answers, main = runner(address, topic, count, fetch_bytes)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    threads = {k: v - threads0.get(k, 0.0) for k, v in _threads().items()}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    broker = fetch_profile._process_cpu_ns(broker_pid) - broker0
    n = max(answers, 1)
    return (
        f"{mode:8} {count / wall:>11,.0f} rec/s  {answers / wall:>7,.0f} answers/s  per answer: "
        f"client {cpu / n * 1e6:.0f} us (calling thread {main / n * 1e6:.0f}), "
        f"broker {broker / n / 1e3:.0f} us; switches "
        f"{(usage.ru_nvcsw - usage0.ru_nvcsw) / n:.1f} voluntary "
        f"{(usage.ru_nivcsw - usage0.ru_nivcsw) / n:.1f} forced; load {os.getloadavg()[0]:.2f}\n"
        + "         threads (us/answer): "
        + ", ".join(f"{k} {v / n * 1e6:.0f}" for k, v in sorted(threads.items()) if v > 0)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--record-bytes", type=int, default=200)
    ap.add_argument("--fetch-bytes", type=int, default=204_800)
    ap.add_argument("--modes", default="consumer,aio,sync,inline")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    counters = fetch_profile._Counters()
    counters.install()
    with tidelog_broker() as broker:
        topic = "fetch-transport"
        workloads.create_topic(broker.address, topic)
        workloads.produce(
            broker.address, broker.pid, topic, args.records, args.record_bytes, workload="fill"
        )
        for _ in range(args.repeat):
            for mode in args.modes.split(","):
                line = measure(
                    mode, broker.address, broker.pid, topic, args.records, args.fetch_bytes,
                    counters,
                )  # fmt: skip
                print(line, flush=True)


if __name__ == "__main__":
    main()
