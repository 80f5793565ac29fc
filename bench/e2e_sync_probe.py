"""End-to-end latency by receive path: ``python -m bench.e2e_sync_probe``.

Runs bench.workloads.end_to_end_latency (10k rec/s, producer and consumer in one process)
with the consumer's poll() replaced by a bare reader of gRPC's blocking API: ``thread`` (a
reader thread hands answers to poll()) or ``inline`` (poll() reads the stream itself, blocking
until the next answer: enough for this workload, whose stream never idles). ``consumer``: the
Consumer as it is. A measurement of what the thread hops cost, not a consumer.
"""

from __future__ import annotations

# First: it chooses gRPC's transport before grpc is imported.
import tidelog._grpc_setup  # noqa: F401

# isort: split
import argparse
import queue
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import grpc
from tidelog import _fetch_wire, records
from tidelog.types import ConsumerRecord, TopicPartition
from tidelog.v1 import log_pb2, log_pb2_grpc

from bench import workloads
from bench._processes import tidelog_broker

_WINDOW = 8 << 20


class _SyncReader:
    mode = "inline"

    def __init__(self, bootstrap_servers: str, fetch_max_wait_ms: int) -> None:
        self._channel = grpc.insecure_channel(bootstrap_servers)
        self._wait_ms = fetch_max_wait_ms
        self._requests: queue.Queue[Any] = queue.Queue()
        self._inbox: deque[Any] = deque()
        self._ready = threading.Event()
        self._owed = 0
        self._call: Any = None

    def __enter__(self) -> _SyncReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._requests.put(None)
        if self._call is not None:
            self._call.cancel()
        self._channel.close()

    def assign(self, tps: list[TopicPartition]) -> None:
        self._tp = tps[0]

    def seek_to_end(self, tp: TopicPartition) -> None:
        answer = log_pb2_grpc.LogStub(self._channel).ListOffsets(
            log_pb2.ListOffsetsRequest(
                partitions=[
                    log_pb2.ListOffsetsPartition(
                        topic=tp.topic, partition=tp.partition, timestamp_ms=-1
                    )
                ]
            )
        )
        self._offset = answer.partitions[0].offset
        self._requests.put(
            log_pb2.FetchRequest(
                positions=[
                    log_pb2.FetchPosition(
                        topic=tp.topic,
                        partition=tp.partition,
                        fetch_offset=self._offset,
                        partition_max_bytes=1 << 20,
                    )
                ],
                credit_bytes=_WINDOW,
                max_bytes=_WINDOW,
                min_bytes=1,
                max_wait_ms=self._wait_ms,
            )
        )
        fetch = self._channel.stream_stream(
            "/tidelog.v1.Log/Fetch",
            request_serializer=log_pb2.FetchRequest.SerializeToString,
            response_deserializer=_fetch_wire.parse,
        )
        self._call = fetch(self._iterate())
        if self.mode == "thread":
            threading.Thread(target=self._read, daemon=True).start()

    def _iterate(self) -> Iterator[Any]:
        while (request := self._requests.get()) is not None:
            yield request

    def _read(self) -> None:
        try:
            for response in self._call:
                self._inbox.append(response)
                self._ready.set()
        except grpc.RpcError:
            pass

    def position(self, tp: TopicPartition) -> int:
        return self._offset

    def poll(self, timeout_ms: float) -> dict[TopicPartition, list[ConsumerRecord]]:
        if self.mode == "inline":
            responses = [next(self._call)]
        else:
            self._ready.clear()
            if not self._inbox:
                self._ready.wait(timeout_ms / 1000)
            responses = []
            while self._inbox:
                responses.append(self._inbox.popleft())
        out: list[ConsumerRecord] = []
        for response in responses:
            for data in response.partitions:
                buf, start, end = data.records_span()
                view = memoryview(buf)[start:end]
                for pos, header in records.iter_batches(view):
                    out += records.decode_records_at(
                        view, pos, header, ConsumerRecord, self._tp.topic, 0, 0
                    )
                self._owed += data.records_size
        if self._owed >= _WINDOW // 4:
            self._requests.put(log_pb2.FetchRequest(credit_bytes=self._owed))
            self._owed = 0
        return {self._tp: out} if out else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="consumer,thread,inline")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    real = workloads.Consumer
    with tidelog_broker() as broker:
        for round_ in range(args.repeat):
            for mode in args.modes.split(","):
                if mode == "consumer":
                    workloads.Consumer = real  # type: ignore[misc]
                else:
                    _SyncReader.mode = mode
                    workloads.Consumer = _SyncReader  # type: ignore[assignment,misc]
                result = workloads.end_to_end_latency(
                    broker.address, broker.pid, f"e2e-{mode}-{round_}", rate=10_000,
                    seconds=args.seconds, record_bytes=200, workload="e2e",
                )  # fmt: skip
                print(
                    f"{mode:8} p50 {result['p50_ms']} p99 {result['p99_ms']} "
                    f"p99.9 {result['p999_ms']} ms, received {result['records']}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
