"""`tidelog.v1.Admin` and `tidelog.v1.Cluster` on the coordinator.

Validates and maps errors; MetadataManager does the work. Each topic of a
request succeeds or fails alone, with its error in-band. Log offsets and
sizes in DescribeTopics are the brokers' to report; here they are zero.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import grpc
from tidelog.errors import InvalidRequestError
from tidelog.request_limits import check_create_topics, check_topic_count
from tidelog.v1 import admin_pb2, admin_pb2_grpc, cluster_pb2, cluster_pb2_grpc, log_pb2

from tidelog_coordinator.errors import abort, error_proto
from tidelog_coordinator.metadata import MetadataManager, TopicRecord
from tidelog_coordinator.producer_ids import ProducerIdAllocator
from tidelog_coordinator.security_admin import SecurityAdmin


class AdminServicer(SecurityAdmin, admin_pb2_grpc.AdminServicer):
    def __init__(self, metadata: MetadataManager) -> None:
        self.metadata = metadata

    @staticmethod
    async def _check_topic_count(count: int, rpc: str, context: grpc.aio.ServicerContext) -> None:
        """Each named topic costs etcd reads or a transaction: a bounded number."""
        try:
            check_topic_count(count, rpc)
        except InvalidRequestError as exc:
            await abort(context, exc, f"answering {rpc}")

    async def CreateTopics(
        self, request: admin_pb2.CreateTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CreateTopicsResponse:
        try:
            # The request's shape first: nothing is created when it is too big.
            check_create_topics(
                (t.name, max(t.partitions, len(t.replica_assignment))) for t in request.topics
            )
        except InvalidRequestError as exc:
            await abort(context, exc, "creating topics")
        results = []
        for topic in request.topics:
            try:
                await self.metadata.create_topic(
                    topic.name,
                    topic.partitions,
                    topic.replication_factor,
                    dict(topic.configs),
                    validate_only=request.validate_only,
                    replica_assignment=[
                        (a.partition, list(a.broker_ids)) for a in topic.replica_assignment
                    ],
                )
                results.append(admin_pb2.TopicResult(name=topic.name))
            except Exception as exc:
                results.append(
                    admin_pb2.TopicResult(
                        name=topic.name, error=error_proto(exc, f"creating topic {topic.name!r}")
                    )
                )
        return admin_pb2.CreateTopicsResponse(topics=results)

    async def DeleteTopics(
        self, request: admin_pb2.DeleteTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DeleteTopicsResponse:
        await self._check_topic_count(len(request.names), "DeleteTopics", context)
        results = []
        for name in request.names:
            try:
                await self.metadata.delete_topic(name)
                results.append(admin_pb2.TopicResult(name=name))
            except Exception as exc:
                results.append(
                    admin_pb2.TopicResult(name=name, error=error_proto(exc, f"deleting {name!r}"))
                )
        return admin_pb2.DeleteTopicsResponse(topics=results)

    async def DescribeTopics(
        self, request: admin_pb2.DescribeTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeTopicsResponse:
        await self._check_topic_count(len(request.names), "DescribeTopics", context)
        try:
            described = await self.metadata.describe_topics(list(request.names))
        except Exception as exc:
            await abort(context, exc, "describing topics")
        out = []
        for name, item in zip(request.names or [None] * len(described), described, strict=True):
            if isinstance(item, TopicRecord):
                out.append(
                    admin_pb2.TopicDescription(
                        name=item.name,
                        partitions=[
                            admin_pb2.PartitionDescription(
                                partition=p.partition,
                                leader_id=p.leader,
                                replicas=p.replicas,
                                isr=p.isr,
                            )
                            for p in item.partitions
                        ],
                        configs=self.metadata.effective_configs(item.configs),
                    )
                )
            else:
                out.append(
                    admin_pb2.TopicDescription(
                        name=name or "", error=error_proto(item, "describing topics")
                    )
                )
        return admin_pb2.DescribeTopicsResponse(topics=out)

    async def DescribeConfigs(
        self, request: admin_pb2.DescribeConfigsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeConfigsResponse:
        await self._check_topic_count(len(request.names), "DescribeConfigs", context)
        names = list(request.names)
        if not names:
            try:
                names = await self.metadata.topic_names()
            except Exception as exc:
                await abort(context, exc, "listing topics")
        response = admin_pb2.DescribeConfigsResponse()
        for name in names:
            result = response.topics.add(name=name)
            try:
                entries = await self.metadata.describe_configs(name)
            except Exception as exc:
                result.error.CopyFrom(error_proto(exc, f"describing configs of {name!r}"))
                continue
            for key, value, is_override in entries:
                result.entries.add(
                    name=key,
                    value=value,
                    source=admin_pb2.CONFIG_SOURCE_TOPIC
                    if is_override
                    else admin_pb2.CONFIG_SOURCE_DEFAULT,
                )
        return response

    async def AlterConfigs(
        self, request: admin_pb2.AlterConfigsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.AlterConfigsResponse:
        await self._check_topic_count(len(request.topics), "AlterConfigs", context)
        response = admin_pb2.AlterConfigsResponse()
        for change in request.topics:
            result = response.topics.add(name=change.name)
            try:
                await self.metadata.alter_configs(
                    change.name,
                    dict(change.set),
                    list(change.delete),
                    validate_only=request.validate_only,
                )
            except Exception as exc:
                result.error.CopyFrom(error_proto(exc, f"altering configs of {change.name!r}"))
        return response


def controller_value_id(value: bytes | None) -> str:
    return "" if value is None else str(json.loads(value).get("id", ""))


class ClusterServicer(cluster_pb2_grpc.ClusterServicer):
    def __init__(
        self, metadata: MetadataManager, controller_id: Callable[[], Awaitable[str]]
    ) -> None:
        self.metadata = metadata
        self.controller_id = controller_id
        self.producer_ids = ProducerIdAllocator(metadata.client, metadata.keys)

    async def InitProducerId(
        self, request: cluster_pb2.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> cluster_pb2.InitProducerIdResponse:
        try:
            producer_id, epoch = await self.producer_ids.init_producer_id(request.producer_key)
        except Exception as exc:
            await abort(context, exc, "allocating a producer id")
        return cluster_pb2.InitProducerIdResponse(producer_id=producer_id, producer_epoch=epoch)

    async def DescribeCluster(
        self, request: cluster_pb2.DescribeClusterRequest, context: grpc.aio.ServicerContext
    ) -> cluster_pb2.DescribeClusterResponse:
        try:
            cluster_id = await self.metadata.ensure_cluster_id()
            brokers = await self.metadata.live_brokers()
            coordinators = await self.metadata.coordinators()
            controller = await self.controller_id()
        except Exception as exc:
            await abort(context, exc, "describing the cluster")
        return cluster_pb2.DescribeClusterResponse(
            cluster_id=cluster_id,
            controller_id=controller,
            brokers=[
                log_pb2.BrokerInfo(broker_id=b.broker_id, host=b.host, port=b.port, rack=b.rack)
                for b in brokers
            ],
            coordinators=[
                cluster_pb2.CoordinatorInfo(id=c["id"], host=c["host"], port=int(c["port"]))
                for c in coordinators
            ],
        )
