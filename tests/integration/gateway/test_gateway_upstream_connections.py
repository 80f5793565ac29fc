"""A broker limits the Fetch streams of one connection, expecting one client
process behind it; the gateway's streams belong to many clients, so it
spreads them over several connections per broker. Here a broker allows 4
streams per connection, and 10 clients' streams through the gateway are all
served."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from tidelog import AdminClient, NewTopic, Producer
from tidelog.v1 import log_pb2, log_pb2_grpc

from tests.support.coordinator import start_coordinator
from tests.support.etcd import EtcdProcess
from tests.support.gateway import start_gateway
from tests.support.processes import start_broker

pytestmark = pytest.mark.timeout(120)

PREFIX = "/upstream-connections"
STREAMS = 10


def test_streams_past_one_broker_connection_limit_are_served(tmp_path: Path) -> None:
    etcd = EtcdProcess.start(tmp_path / "etcd")
    processes: list = []
    try:
        processes.append(
            start_coordinator(etcd.endpoint, tmp_path / "logs", prefix=PREFIX, coordinator_id="c0")
        )
        broker_args = [
            "--etcd", etcd.endpoint, "--etcd-prefix", PREFIX,
            "--set", "fetch.max.streams.per.connection=4",
        ]  # fmt: skip
        processes.append(start_broker(tmp_path / "broker-0", extra_args=broker_args))
        gateway = start_gateway(etcd.endpoint, tmp_path / "logs", prefix=PREFIX)
        processes.append(gateway)
        with AdminClient(gateway.address) as admin:
            admin.create_topics([NewTopic("t", 1)])
        with Producer(gateway.address) as producer:
            producer.send("t", b"hello").get(timeout=30)
        request = log_pb2.FetchRequest(
            positions=[log_pb2.FetchPosition(topic="t", partition=0, fetch_offset=0)],
            credit_bytes=1024 * 1024,
        )
        with grpc.insecure_channel(gateway.address) as channel:
            stub = log_pb2_grpc.LogStub(channel)
            calls = [stub.Fetch(iter([request]), timeout=60) for _ in range(STREAMS)]
            for call in calls:
                (data,) = next(call).partitions
                assert data.error.code == 0, data.error.message
                assert data.records
            for call in calls:
                call.cancel()
    finally:
        for process in reversed(processes):
            process.stop()
        etcd.stop()
