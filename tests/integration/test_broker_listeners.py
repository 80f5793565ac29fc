"""A broker's two listeners (issue 14): clients on the client port, which
never serves replication; followers on the internal port, advertised in the
broker's etcd registration. A plain client that reached `tidelog.internal.
Replica` on the client port could read past the high watermark and pose as a
follower (the hardening issue's finding)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from tidelog import AdminClient, NewTopic, Producer
from tidelog_server.internal import replica_pb2, replica_pb2_grpc

from tests.support.cluster import ClusterProcesses, running_cluster
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(120)
REPLICA_SERVICE = "tidelog.internal.Replica"


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterProcesses]:
    with running_cluster(tmp_path_factory.mktemp("listeners"), etcd=etcd, brokers=2) as processes:
        yield processes


def _fetch_as_stranger(address: str) -> replica_pb2.ReplicaFetchResponse:
    request = replica_pb2.ReplicaFetchRequest(
        replica_id=99,
        max_wait_ms=10,
        max_bytes=1 << 20,
        partitions=[replica_pb2.ReplicaFetchPartition(topic="listeners", partition=0)],
    )
    with grpc.insecure_channel(address) as channel:
        answers = replica_pb2_grpc.ReplicaStub(channel).ReplicaFetch(iter([request]), timeout=10)
        return next(iter(answers))


def test_the_client_port_neither_serves_nor_lists_replication(cluster: ClusterProcesses) -> None:
    broker = cluster.brokers[0]
    with pytest.raises(grpc.RpcError) as info:
        _fetch_as_stranger(broker.address)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
    with grpc.insecure_channel(broker.address) as channel:
        services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
    assert "tidelog.v1.Log" in services
    assert REPLICA_SERVICE not in services


def test_followers_replicate_over_the_internal_port(cluster: ClusterProcesses) -> None:
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("listeners", 1, 2, {"min.insync.replicas": "2"})])
    # acks=all with min.insync.replicas=2 is answered only once the follower
    # has fetched the record: over the internal listener, the only one.
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        metadata = producer.send("listeners", b"replicated").get(timeout=60)
    assert metadata.offset == 0
    # The internal port answers the Replica service (here: a stranger refused).
    answer = _fetch_as_stranger(cluster.brokers[0].internal_address)
    assert answer.partitions and answer.partitions[0].records == b""
