"""gRPC services a broker serves only in cluster mode.

- `AdminForwarder` (`tidelog.v1.Admin`): topic administration belongs to the
  coordinator in cluster mode, but clients bootstrap from brokers; each call
  is forwarded unchanged to a live coordinator replica (the next one on
  UNAVAILABLE), and its answer or error is passed back as is. DescribeTopics
  is then completed with what only brokers know (log offsets, sizes,
  segments): from this broker's logs, and from each other leader, asked with
  the `tidelog-local` metadata key so that it answers from its own logs
  instead of forwarding again.
- `BrokerClusterServicer` (`tidelog.v1.Cluster`): DescribeCluster from the
  broker's etcd view, so that a client given only a broker address learns
  the coordinator endpoints (the consumer's group membership needs them).
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio
from tidelog.errors import CoordinatorNotAvailableError
from tidelog.v1 import admin_pb2, admin_pb2_grpc, cluster_pb2, cluster_pb2_grpc
from tidelog_server.forwarding import CoordinatorForwarding

from tidelog_broker.cluster_link import ClusterLink
from tidelog_broker.coordinator_forwarding import FORWARD_TIMEOUT_S, forward_to_coordinator
from tidelog_broker.error_mapping import abort
from tidelog_broker.producer_ids import ProducerIdForwarder

#: Invocation metadata key: "answer DescribeTopics from your own logs".
LOCAL_METADATA_KEY = "tidelog-local"


class AdminForwarder:
    """Every rpc of `tidelog.v1.Admin`, forwarded to a coordinator."""

    def __init__(self, link: ClusterLink, forwarding: CoordinatorForwarding) -> None:
        self._link = link
        # Channels to coordinators and to other brokers alike: one pool,
        # closed by the broker's stop.
        self._forwarding = forwarding

    def _stub(self, address: str) -> Any:
        return admin_pb2_grpc.AdminStub(self._forwarding.pool.channel(address))

    async def forward(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await forward_to_coordinator(
            self._forwarding,
            lambda channel: getattr(admin_pb2_grpc.AdminStub(channel), method)(
                request, timeout=FORWARD_TIMEOUT_S
            ),
            context,
            method,
        )

    async def DescribeTopics(
        self, request: admin_pb2.DescribeTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeTopicsResponse:
        if any(k == LOCAL_METADATA_KEY for k, _ in context.invocation_metadata() or ()):
            return self._describe_local(request)
        response: admin_pb2.DescribeTopicsResponse = await self.forward(
            "DescribeTopics", request, context
        )
        names_by_leader: dict[int, set[str]] = {}
        for topic in response.topics:
            for partition in topic.partitions:
                names_by_leader.setdefault(partition.leader_id, set()).add(topic.name)
        local: dict[tuple[str, int], admin_pb2.PartitionDescription] = {}
        for leader, names in names_by_leader.items():
            sub = admin_pb2.DescribeTopicsRequest(names=sorted(names))
            try:
                if leader == self._link.broker.broker_id:
                    answer = self._describe_local(sub)
                else:
                    info = self._link.brokers.get(leader)
                    if info is None:
                        continue  # leader down: its partitions keep zeros
                    answer = await self._stub(f"{info['host']}:{info['port']}").DescribeTopics(
                        sub, timeout=5, metadata=((LOCAL_METADATA_KEY, "1"),)
                    )
            except grpc.aio.AioRpcError:
                continue
            for topic in answer.topics:
                for partition in topic.partitions:
                    local[(topic.name, partition.partition)] = partition
        for topic in response.topics:
            for partition in topic.partitions:
                found = local.get((topic.name, partition.partition))
                if found is not None:
                    partition.log_start_offset = found.log_start_offset
                    partition.log_end_offset = found.log_end_offset
                    partition.high_watermark = found.high_watermark
                    partition.size_bytes = found.size_bytes
                    partition.segment_count = found.segment_count
        return response

    def _describe_local(
        self, request: admin_pb2.DescribeTopicsRequest
    ) -> admin_pb2.DescribeTopicsResponse:
        """The partitions of `request.names` this broker hosts (no error for others)."""
        response = admin_pb2.DescribeTopicsResponse()
        manager = self._link.manager
        for name in request.names:
            description = response.topics.add(name=name)
            try:
                views = manager.describe(name)
            except Exception:
                continue
            for view in views:
                description.partitions.add(
                    partition=view.partition,
                    leader_id=self._link.broker.broker_id,
                    log_start_offset=view.log_start_offset,
                    log_end_offset=view.log_end_offset,
                    high_watermark=view.high_watermark,
                    size_bytes=view.size_bytes,
                    segment_count=view.segment_count,
                )
        return response


def _forwarding_method(name: str) -> Any:
    async def method(self: AdminForwarder, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.forward(name, request, context)

    method.__name__ = name
    return method


# One forwarding method per rpc of the service, so rpcs added to admin.proto
# are forwarded without touching this file.
for _name in admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods_by_name:
    if not hasattr(AdminForwarder, _name):
        setattr(AdminForwarder, _name, _forwarding_method(_name))


def add_admin_forwarder(forwarder: AdminForwarder, server: grpc.aio.Server) -> None:
    admin_pb2_grpc.add_AdminServicer_to_server(forwarder, server)  # type: ignore[arg-type]


class BrokerClusterServicer(cluster_pb2_grpc.ClusterServicer):
    def __init__(self, link: ClusterLink, forwarding: CoordinatorForwarding) -> None:
        self._link = link
        self._producer_ids = ProducerIdForwarder(forwarding)

    async def InitProducerId(
        self, request: cluster_pb2.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> cluster_pb2.InitProducerIdResponse:
        # Producer ids live in etcd; a coordinator allocates them.
        return await self._producer_ids.forward(request, context)

    async def DescribeCluster(
        self, request: cluster_pb2.DescribeClusterRequest, context: grpc.aio.ServicerContext
    ) -> cluster_pb2.DescribeClusterResponse:
        try:
            return await self._link.describe_cluster()
        except Exception as exc:
            await abort(
                context,
                CoordinatorNotAvailableError(f"etcd is not reachable from this broker: {exc}"),
                "describing the cluster",
            )
