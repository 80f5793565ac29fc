"""No split brain: a leader paused (SIGSTOP) longer than its session TTL, then
resumed (SIGCONT), accepts not a single write once its lease may have
expired; the controller has meanwhile elected another leader (issue 5)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tidelog import records
from tidelog.v1 import common_pb2, log_pb2, log_pb2_grpc

from tests.fault.replication_support import SESSION_TTL_S, ReplicatedCluster, read_back
from tests.support.etcd import EtcdProcess

TOPIC = "fenced"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ReplicatedCluster]:
    etcd = EtcdProcess.start(tmp_path)
    processes = ReplicatedCluster(etcd, tmp_path, "/isolated")
    try:
        processes.start()
        yield processes
    finally:
        processes.stop()
        etcd.stop()


def produce_raw(address: str, value: bytes, acks: int) -> log_pb2.PartitionProduceResult:
    batch = records.encode_batch([value], timestamps=[int(time.time() * 1000)])
    request = log_pb2.ProduceRequest(
        correlation_id=1,
        acks=acks,
        timeout_ms=2000,
        partitions=[log_pb2.PartitionRecords(topic=TOPIC, partition=0, records=batch)],
    )
    with grpc.insecure_channel(address) as channel:
        stub = log_pb2_grpc.LogStub(channel)
        responses = stub.Produce(iter([request]), timeout=10)
        return next(iter(responses)).partitions[0]


@pytest.mark.timeout(60)
def test_paused_leader_accepts_no_write_after_its_lease_expired(cluster: ReplicatedCluster) -> None:
    cluster.create_topic(TOPIC, 1, 3, {"min.insync.replicas": "2"})
    leader_id = cluster.leaders(TOPIC)[0]
    leader = cluster.brokers[leader_id]
    before = produce_raw(leader.address, b"0:0", acks=-1)
    assert before.error.code == common_pb2.NONE, before.error

    os.kill(leader.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and cluster.leaders(TOPIC).get(0) in (leader_id, -1):
            time.sleep(0.1)
        new_leader = cluster.leaders(TOPIC)[0]
        assert new_leader not in (leader_id, -1)
        time.sleep(SESSION_TTL_S)  # well past the old lease
    finally:
        os.kill(leader.pid, signal.SIGCONT)

    # Straight after the resume, before it could hear anything from etcd.
    rejected = [produce_raw(leader.address, f"0:{i}".encode(), acks=1) for i in range(1, 4)]
    codes = [r.error.code for r in rejected]
    print(f"\nwrites to the resumed old leader: {[common_pb2.ErrorCode.Name(c) for c in codes]}")
    assert all(c == common_pb2.NOT_LEADER_OR_FOLLOWER for c in codes), rejected

    after = produce_raw(cluster.brokers[new_leader].address, b"0:9", acks=-1)
    assert after.error.code == common_pb2.NONE, after.error
    read = read_back(cluster.bootstrap, TOPIC, 1, 30)
    assert read[0] == [0, 9], read
