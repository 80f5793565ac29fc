"""Kafka fetch latency with a raw Fetch request (v4) on one loopback connection.

The counterpart of bench.workloads.fetch_latency: each sample is one Fetch of one partition
at one offset with partition_max_bytes=1, so the broker answers with exactly the one stored
batch that holds the offset (KIP-74: the first batch is returned whole even when it is larger
than the limit). The latency is request sent to response read. Standard library only.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from typing import Any

from bench._processes import Meter
from bench.kafka_baseline import _recv_exact
from bench.workloads import Result, make_result

_FETCH = 1
_VERSION = 4
_CLIENT = b"tidelog-bench"


class _Conn:
    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def fetch(self, topic: str, offset: int) -> int:
        """One Fetch v4; returns the bytes of records returned (raises on an error code)."""
        self.correlation += 1
        name = topic.encode()
        header = struct.pack(">hhih", _FETCH, _VERSION, self.correlation, len(_CLIENT)) + _CLIENT
        body = struct.pack(">iiiib", -1, 500, 1, 1, 0)  # replica, max_wait, min, max, isolation
        body += struct.pack(">ih", 1, len(name)) + name
        body += struct.pack(">iiqi", 1, 0, offset, 1)  # one partition: 0, offset, max 1 byte
        payload = header + body
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", _recv_exact(self.sock, 4))[0]
        resp = _recv_exact(self.sock, size)
        corr, _throttle, _ntopics = struct.unpack_from(">iii", resp, 0)
        if corr != self.correlation:
            raise OSError("correlation id mismatch")
        pos = 12
        (tlen,) = struct.unpack_from(">h", resp, pos)
        pos += 2 + tlen
        _nparts, _part, error = struct.unpack_from(">iih", resp, pos)
        if error:
            raise RuntimeError(f"Kafka fetch at offset {offset}: error code {error}")
        pos += 10 + 16  # high watermark, last stable offset
        (naborted,) = struct.unpack_from(">i", resp, pos)
        pos += 4 + max(0, naborted) * 16
        (nrecords,) = struct.unpack_from(">i", resp, pos)
        return max(0, nrecords)


def fetch_latency(
    bootstrap: str,
    broker_pids: list[int],
    topic: str,
    end_offset: int,
    *,
    samples: int,
    where: str,
    workload: str,
    record_bytes: int,
    rng: random.Random,
) -> Result:
    conn = _Conn(bootstrap)
    latencies: list[float] = []
    returned = 0
    meter = Meter(broker_pids[0] if broker_pids else None)
    try:
        for i in range(samples + 5):
            if where == "tail":
                offset = max(0, end_offset - 1)
            else:
                offset = rng.randrange(0, max(1, end_offset - 1000))
            t0 = time.perf_counter()
            got = conn.fetch(topic, offset)
            if i >= 5:
                latencies.append((time.perf_counter() - t0) * 1000)
                returned += got
    finally:
        conn.close()
    m = meter.done()
    detail: dict[str, Any] = {
        "where": where,
        "end_offset": end_offset,
        "samples": len(latencies),
        "mean_bytes_returned": round(returned / max(1, len(latencies))),
        "request": "Fetch v4, partition_max_bytes=1 (one batch)",
    }
    return {
        **make_result(
            workload,
            "kafka",
            len(latencies),
            record_bytes,
            sum(latencies) / 1000,
            m,
            latencies,
            detail,
        ),
    }
