"""`tidelog.v1.Admin` and `tidelog.v1.Cluster` on the coordinator.

Validates and maps errors; MetadataManager (topics, configs) and
PartitionAdmin (partitions added, leaders elected, reassignments) do the
work. Each topic or partition of a request succeeds or fails alone, with its
error in-band; one named twice fails in each of its entries
(request_limits.repeated). DescribeTopics answers the placement from etcd;
the log figures of each partition (offsets, size, segments) are its
leader's to report: asked of each leader (BrokerCalls.complete_figures)
when a client calls the coordinator directly, but not when the call
carries `tidelog-local`, as a broker's or the gateway's forwarded call
does (they ask the leaders themselves: asked here too, each leader would
be asked twice per call). DeleteRecords and the progress of reassignments
are asked of the brokers (BrokerCalls).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import grpc
from tidelog.errors import InvalidRequestError
from tidelog.request_limits import (
    check_create_topics,
    check_partitions_per_request,
    check_topic_count,
    distinct,
    repeated,
    repeated_name_error,
    repeated_partition_error,
)
from tidelog.types import TopicPartition
from tidelog.v1 import admin_pb2, admin_pb2_grpc, cluster_pb2, cluster_pb2_grpc, log_pb2
from tidelog_server.forwarding import is_local
from tidelog_server.leader_figures import leader_call_timeout

from tidelog_coordinator.broker_calls import BROKER_CALL_TIMEOUT_S, BrokerCalls
from tidelog_coordinator.errors import abort, error_proto
from tidelog_coordinator.metadata import MetadataManager, TopicReads, TopicRecord
from tidelog_coordinator.partition_admin import ElectionResult, PartitionAdmin, ReassignmentReads
from tidelog_coordinator.producer_ids import ProducerIdAllocator
from tidelog_coordinator.security_admin import SecurityAdmin


class AdminServicer(SecurityAdmin, admin_pb2_grpc.AdminServicer):
    def __init__(self, metadata: MetadataManager, brokers: BrokerCalls | None = None) -> None:
        self.metadata = metadata
        self.partitions = PartitionAdmin(metadata)
        self.brokers = brokers or BrokerCalls(metadata.client, metadata.keys)

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
        repeated_topics = repeated(t.name for t in request.topics)
        for topic in request.topics:
            try:
                if topic.name in repeated_topics:
                    raise repeated_name_error(topic.name, "CreateTopics")
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
        repeated_topics = repeated(request.names)
        reads = TopicReads(self.metadata, request.names)
        for name in request.names:
            try:
                if name in repeated_topics:
                    raise repeated_name_error(name, "DeleteTopics")
                await self.metadata.delete_topic(name, reads)
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
        names = distinct(request.names)  # each described once (request_limits.distinct)
        try:
            described = await self.metadata.describe_topics(names)
        except Exception as exc:
            await abort(context, exc, "describing topics")
        out = []
        asked: list[str | None] = list(names) or [None] * len(described)
        for name, item in zip(asked, described, strict=True):
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
                                adding_replicas=p.adding,
                                removing_replicas=p.removing,
                                offline_replicas=p.offline,
                                torn_replicas=p.torn,
                                eligible_leader_replicas=p.elr,
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
        response = admin_pb2.DescribeTopicsResponse(topics=out)
        if not is_local(context):
            try:
                await self.brokers.complete_figures(
                    response, leader_call_timeout(context, BROKER_CALL_TIMEOUT_S)
                )
            except Exception as exc:  # etcd unreachable for the brokers' addresses
                await abort(context, exc, "describing topics")
        return response

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
        reads = TopicReads(self.metadata, names)
        for name in names:
            result = response.topics.add(name=name)
            try:
                entries = await self.metadata.describe_configs(name, reads)
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
        repeated_topics = repeated(change.name for change in request.topics)
        reads = TopicReads(self.metadata, [change.name for change in request.topics])
        for change in request.topics:
            result = response.topics.add(name=change.name)
            try:
                if change.name in repeated_topics:
                    raise repeated_name_error(change.name, "AlterConfigs")
                await self.metadata.alter_configs(
                    change.name,
                    dict(change.set),
                    list(change.delete),
                    validate_only=request.validate_only,
                    reads=reads,
                )
            except Exception as exc:
                result.error.CopyFrom(error_proto(exc, f"altering configs of {change.name!r}"))
        return response

    # ------------------------------------------------------------ partitions

    async def CreatePartitions(
        self, request: admin_pb2.CreatePartitionsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CreatePartitionsResponse:
        try:
            check_create_topics((t.name, t.total_count) for t in request.topics)
        except InvalidRequestError as exc:
            await abort(context, exc, "adding partitions")
        response = admin_pb2.CreatePartitionsResponse()
        repeated_topics = repeated(t.name for t in request.topics)
        for topic in request.topics:
            result = response.topics.add(name=topic.name)
            try:
                if topic.name in repeated_topics:
                    raise repeated_name_error(topic.name, "CreatePartitions")
                await self.partitions.create_partitions(
                    topic.name,
                    topic.total_count,
                    [(a.partition, list(a.broker_ids)) for a in topic.assignment],
                    request.validate_only,
                )
            except Exception as exc:
                result.error.CopyFrom(error_proto(exc, f"adding partitions to {topic.name!r}"))
        return response

    async def DeleteRecords(
        self, request: admin_pb2.DeleteRecordsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DeleteRecordsResponse:
        try:
            check_partitions_per_request(len(request.partitions), "DeleteRecords")
            check_topic_count(len({p.topic for p in request.partitions}), "DeleteRecords")
            repeated_partitions = repeated((p.topic, p.partition) for p in request.partitions)
            # A repeated partition is not sent to its leader at all: its log
            # start stays where it is.
            wanted = [
                p for p in request.partitions if (p.topic, p.partition) not in repeated_partitions
            ]
            deleted = await self.brokers.delete_records(wanted)
        except Exception as exc:
            await abort(context, exc, "deleting records")
        # One result per entry, in request order (deleted is in wanted's).
        in_order = iter(deleted)
        response = admin_pb2.DeleteRecordsResponse()
        for part in request.partitions:
            if (part.topic, part.partition) not in repeated_partitions:
                response.partitions.append(next(in_order))
                continue
            refused = response.partitions.add(topic=part.topic, partition=part.partition)
            refused.error.CopyFrom(
                error_proto(
                    repeated_partition_error(part.topic, part.partition, "DeleteRecords"),
                    "deleting records",
                )
            )
        return response

    async def ElectLeaders(
        self, request: admin_pb2.ElectLeadersRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ElectLeadersResponse:
        try:
            check_partitions_per_request(len(request.partitions), "ElectLeaders")
        except InvalidRequestError as exc:
            await abort(context, exc, "electing leaders")
        named = [TopicPartition(p.topic, p.partition) for p in request.partitions]
        repeated_partitions = repeated(named)
        wanted = [tp for tp in named if tp not in repeated_partitions]
        try:
            # No partition named means every partition.
            elected = await self.partitions.elect_preferred(wanted if named else None)
        except Exception as exc:
            await abort(context, exc, "electing leaders")
        if not named:
            results = elected
        else:
            # One result per entry, in request order (elected is in wanted's).
            in_order = iter(elected)
            results = [
                ElectionResult(
                    tp, -1, repeated_partition_error(tp.topic, tp.partition, "ElectLeaders")
                )
                if tp in repeated_partitions
                else next(in_order)
                for tp in named
            ]
        response = admin_pb2.ElectLeadersResponse()
        for result in results:
            item = response.partitions.add(
                topic=result.tp.topic, partition=result.tp.partition, leader_id=result.leader
            )
            if result.error is not None:
                item.error.CopyFrom(error_proto(result.error, "electing leaders"))
        return response

    async def AlterPartitionReassignments(
        self,
        request: admin_pb2.AlterPartitionReassignmentsRequest,
        context: grpc.aio.ServicerContext,
    ) -> admin_pb2.AlterPartitionReassignmentsResponse:
        try:
            check_partitions_per_request(len(request.partitions), "AlterPartitionReassignments")
        except InvalidRequestError as exc:
            await abort(context, exc, "reassigning partitions")
        response = admin_pb2.AlterPartitionReassignmentsResponse()
        reads = ReassignmentReads(self.partitions)
        repeated_partitions = repeated((p.topic, p.partition) for p in request.partitions)
        for part in request.partitions:
            result = response.partitions.add(topic=part.topic, partition=part.partition)
            try:
                if (part.topic, part.partition) in repeated_partitions:
                    raise repeated_partition_error(
                        part.topic, part.partition, "AlterPartitionReassignments"
                    )
                await self.partitions.alter_reassignment(
                    TopicPartition(part.topic, part.partition),
                    list(part.replicas),
                    request.throttle_bytes_per_s,
                    reads,
                )
            except Exception as exc:
                result.error.CopyFrom(
                    error_proto(exc, f"reassigning {part.topic}-{part.partition}")
                )
        return response

    async def ListPartitionReassignments(
        self,
        request: admin_pb2.ListPartitionReassignmentsRequest,
        context: grpc.aio.ServicerContext,
    ) -> admin_pb2.ListPartitionReassignmentsResponse:
        try:
            check_partitions_per_request(len(request.partitions), "ListPartitionReassignments")
            ongoing = await self.partitions.list_reassignments(
                [TopicPartition(p.topic, p.partition) for p in request.partitions]
            )
            asked = {r.leader for r in ongoing} | {
                b for r in ongoing for b in r.reassignment.adding
            }
            logs = await self.brokers.local_logs(asked, {r.tp.topic for r in ongoing})
        except Exception as exc:
            await abort(context, exc, "listing reassignments")
        response = admin_pb2.ListPartitionReassignmentsResponse()
        for r in ongoing:
            leader_log = logs.get((r.leader, r.tp))
            if leader_log is not None and leader_log.offline is not None:
                leader_log = None  # no figures: as a leader that could not be asked
            item = response.reassignments.add(
                topic=r.tp.topic,
                partition=r.tp.partition,
                replicas=r.replicas,
                adding_replicas=r.reassignment.adding,
                removing_replicas=r.reassignment.removing,
                original_replicas=r.reassignment.original,
                throttle_bytes_per_s=r.reassignment.throttle_bytes_per_s,
                started_ms=r.reassignment.started_ms,
                leader_id=r.leader,
                isr=r.isr,
            )
            if leader_log is not None:
                item.leader_log_end_offset = leader_log.log_end_offset
                item.leader_size_bytes = leader_log.size_bytes
            else:
                # Unknown, not 0: the lags below would be measured from 0
                # and read as caught up.
                item.leader_log_end_offset = item.leader_size_bytes = -1
            for broker in r.reassignment.adding:
                local = logs.get((broker, r.tp))
                progress = item.progress.add(broker_id=broker, in_sync=broker in r.isr)
                if local is None:
                    # Its broker did not answer: unknown (-1), not 0 figures
                    # that a program not looking at `reachable` reads as a
                    # replica caught up with an empty leader.
                    progress.log_end_offset = progress.size_bytes = -1
                    progress.lag_records = progress.lag_bytes = -1
                    continue
                progress.reachable = True
                if local.offline is not None:
                    # It copies nothing until its broker restarts: not an
                    # empty log catching up (ReplicaProgress.error).
                    progress.error.CopyFrom(local.offline)
                    progress.log_end_offset = progress.size_bytes = -1
                    progress.lag_records = progress.lag_bytes = -1
                    continue
                progress.log_end_offset = local.log_end_offset
                progress.size_bytes = local.size_bytes
                if leader_log is not None:
                    progress.lag_records = max(0, leader_log.log_end_offset - local.log_end_offset)
                    progress.lag_bytes = max(0, leader_log.size_bytes - local.size_bytes)
                else:
                    progress.lag_records = progress.lag_bytes = -1
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
