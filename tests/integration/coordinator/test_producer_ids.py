"""InitProducerId in cluster mode: a coordinator allocates from etcd, and a
broker forwards the call to it."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from tidelog.v1 import cluster_pb2, cluster_pb2_grpc

from tests.support.cluster import start_cluster
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(40)


def init(address: str, key: str = "") -> tuple[int, int]:
    with grpc.insecure_channel(address) as channel:
        reply = cluster_pb2_grpc.ClusterStub(channel).InitProducerId(
            cluster_pb2.InitProducerIdRequest(producer_key=key), timeout=10
        )
    return reply.producer_id, reply.producer_epoch


def test_ids_from_the_coordinator_directly_and_through_a_broker(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    cluster = start_cluster(tmp_path, etcd=etcd, prefix=prefix, brokers=1)
    try:
        coordinator = cluster.coordinators[0].address
        broker = cluster.brokers[0].address
        assert init(coordinator) == (0, 0)
        assert init(broker) == (1, 0)  # forwarded: the same counter in etcd
        keyed = init(coordinator, "billing writer/1")
        assert keyed == (2, 0)
        # The same key: the same id, one epoch up (fencing the older instance).
        assert init(broker, "billing writer/1") == (2, 1)
        assert init(coordinator, "billing writer/1") == (2, 2)
        assert init(broker) == (3, 0)
    finally:
        cluster.stop()
