"""The broker process: data survives restarts and crashes, generic gRPC tools
work (health, reflection), and topics are auto-created only when configured."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tidelog import records
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2, log_pb2, log_pb2_grpc

from tests.support.processes import BrokerProcess, start_broker

pytestmark = pytest.mark.timeout(90)


def produce(
    address: str, topic: str, partition: int, values: list[bytes]
) -> log_pb2.ProduceResponse:
    request = log_pb2.ProduceRequest(
        correlation_id=1,
        acks=1,
        partitions=[
            log_pb2.PartitionRecords(
                topic=topic, partition=partition, records=records.encode_batch(values)
            )
        ],
    )
    with grpc.insecure_channel(address) as channel:
        (response,) = list(log_pb2_grpc.LogStub(channel).Produce(iter([request]), timeout=10))
    return response


def fetch_all(address: str, topic: str, partition: int) -> list[tuple[int, bytes | None]]:
    """Every record of a partition, read through one Fetch stream."""
    with grpc.insecure_channel(address) as channel:
        stub = log_pb2_grpc.LogStub(channel)
        end = (
            stub.ListOffsets(
                log_pb2.ListOffsetsRequest(
                    partitions=[
                        log_pb2.ListOffsetsPartition(
                            topic=topic, partition=partition, timestamp_ms=-1
                        )
                    ]
                ),
                timeout=10,
            )
            .partitions[0]
            .offset
        )
        out: list[tuple[int, bytes | None]] = []
        if end == 0:
            return out

        def requests() -> Iterator[log_pb2.FetchRequest]:
            yield log_pb2.FetchRequest(
                positions=[log_pb2.FetchPosition(topic=topic, partition=partition, fetch_offset=0)],
                credit_bytes=1 << 30,
                max_wait_ms=100,
            )

        call = stub.Fetch(requests(), timeout=20)
        for response in call:
            for data in response.partitions:
                assert not data.HasField("error"), data.error
                for batch in records.decode_batches(data.records):
                    out.extend(zip(batch.offsets, batch.values, strict=True))
            if out and out[-1][0] >= end - 1:
                break
        call.cancel()
    return out


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker of this test alone (it gets restarted and killed)."""
    process = start_broker(
        tmp_path / "data", extra_args=("--auto-create-topics", "--set", "segment.bytes=4096")
    )
    try:
        yield process
    finally:
        process.stop()


def test_restart_keeps_all_data(own_broker: BrokerProcess) -> None:
    values = [f"record-{i}".encode() * 20 for i in range(300)]
    for start in range(0, len(values), 30):
        response = produce(own_broker.address, "durable", 0, values[start : start + 30])
        assert response.partitions[0].base_offset == start
    before = fetch_all(own_broker.address, "durable", 0)
    assert [v for _, v in before] == values
    segments = sorted(p.name for p in (own_broker.data_dir / "durable-0").glob("*.log"))
    assert len(segments) > 1, "segment.bytes=4096 should have rolled segments"
    assert segments[0] == "00000000000000000000.log"

    own_broker.restart()  # SIGTERM: a clean shutdown
    assert fetch_all(own_broker.address, "durable", 0) == before

    own_broker.kill()  # SIGKILL: recovery runs at the next start
    own_broker.spawn()
    assert fetch_all(own_broker.address, "durable", 0) == before
    # Offsets continue densely after recovery.
    response = produce(own_broker.address, "durable", 0, [b"after"])
    assert response.partitions[0].base_offset == len(values)


def test_health_and_reflection_for_generic_tools(own_broker: BrokerProcess) -> None:
    with grpc.insecure_channel(own_broker.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = list(
            stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
            )
        )
    services = {s.name for s in replies[0].list_services_response.service}
    assert {"tidelog.v1.Log", "tidelog.v1.Admin", "grpc.health.v1.Health"} <= services


def test_topics_are_not_auto_created_by_default(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data", extra_args=())
    try:
        response = produce(broker.address, "typo-topic", 0, [b"x"])
        error = response.partitions[0].error
        assert error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
        with grpc.insecure_channel(broker.address) as channel:
            listed = admin_pb2_grpc.AdminStub(channel).DescribeTopics(
                admin_pb2.DescribeTopicsRequest(), timeout=10
            )
        assert [t.name for t in listed.topics] == []
    finally:
        broker.stop()


def test_second_broker_on_the_same_data_dir_refuses_to_start(own_broker: BrokerProcess) -> None:
    """The data directory's lock (Kafka's `.lock`): a second broker process
    exits at once with an error naming the directory, its lock file and the
    holder, and the first one serves on, its data untouched. (A SIGKILLed
    broker leaves no stale lock: test_restart_keeps_all_data restarts one.)"""
    produce(own_broker.address, "locked", 0, [b"kept"])
    command = [
        sys.executable, "-m", "tidelog_broker",
        "--listen", "127.0.0.1:0",
        "--data-dir", str(own_broker.data_dir),
    ]  # fmt: skip
    second = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert second.returncode == 1, second.stderr
    assert str(own_broker.data_dir) in second.stderr
    assert str(own_broker.data_dir / ".lock") in second.stderr
    assert f"pid {own_broker.pid}" in second.stderr
    assert "Traceback" not in second.stderr
    assert fetch_all(own_broker.address, "locked", 0) == [(0, b"kept")]
