"""gRPC front of topic administration (`tidelog.v1.Admin`) on a standalone broker.

Each topic of a request succeeds or fails alone, with an in-band typed error
(error_mapping). In cluster mode (`--etcd`) the broker does not serve this:
its Admin calls go to a coordinator (`coordinator_forwarding`), which serves
the same service with the same messages.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc
from tidelog.errors import InvalidRequestError
from tidelog.request_limits import (
    check_create_topics,
    check_topic_count,
    distinct,
    repeated,
    repeated_name_error,
)
from tidelog.v1 import admin_pb2, admin_pb2_grpc

from tidelog_broker.config import BrokerConfig
from tidelog_broker.delete_records import delete_records
from tidelog_broker.error_mapping import abort, error_proto
from tidelog_broker.partition_manager import PartitionManager, PartitionView
from tidelog_broker.storage import config_to_strings

_CONFIG_SOURCES = {
    "default": admin_pb2.CONFIG_SOURCE_DEFAULT,
    "broker": admin_pb2.CONFIG_SOURCE_BROKER,
    "topic": admin_pb2.CONFIG_SOURCE_TOPIC,
}


def described_partition(view: PartitionView, **placement: Any) -> admin_pb2.PartitionDescription:
    """A partition hosted here as DescribeTopics describes it: `placement`
    (leader, replicas...) and its log figures; for an offline log, -1 figures
    and its STORAGE_ERROR in `error` (the field that says the figures are
    unknown, and why), as Kafka describes an offline replica: never as an
    empty log."""
    described = admin_pb2.PartitionDescription(
        partition=view.partition,
        log_start_offset=view.log_start_offset,
        log_end_offset=view.log_end_offset,
        high_watermark=view.high_watermark,
        size_bytes=view.size_bytes,
        segment_count=view.segment_count,
        **placement,
    )
    if view.offline is not None:
        described.error.CopyFrom(
            error_proto(view.offline, f"describing {view.topic}-{view.partition}")
        )
    return described


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """CreateTopics, DeleteTopics, DescribeTopics, DescribeConfigs, AlterConfigs,
    DeleteRecords. The partition operations that need a cluster (adding
    partitions, elections, reassignments) answer INVALID_REQUEST saying so."""

    def __init__(self, manager: PartitionManager, config: BrokerConfig) -> None:
        self._manager = manager
        self._config = config

    @staticmethod
    async def _check_topic_count(count: int, rpc: str, context: grpc.aio.ServicerContext) -> None:
        """The same bound on named topics as the coordinator's."""
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
        response = admin_pb2.CreateTopicsResponse()
        repeated_topics = repeated(t.name for t in request.topics)
        for new in request.topics:
            result = response.topics.add(name=new.name)
            try:
                if new.name in repeated_topics:
                    raise repeated_name_error(new.name, "CreateTopics")
                partitions, replication_factor = self._standalone_shape(new)
                self._manager.logs.create_topic(
                    new.name,
                    partitions,
                    replication_factor,
                    dict(new.configs),
                    validate_only=request.validate_only,
                )
            except Exception as exc:
                result.error.CopyFrom(error_proto(exc, f"creating topic {new.name}"))
        return response

    def _standalone_shape(self, new: admin_pb2.NewTopic) -> tuple[int, int]:
        """Partitions and replication factor of a NewTopic. A replica
        assignment is accepted only when every partition names this broker
        alone (the only placement a standalone broker has); the partition
        count then comes from it, checked as the coordinator checks it."""
        if not new.replica_assignment:
            return new.partitions, new.replication_factor
        me = self._config.broker_id
        n = len(new.replica_assignment)
        seen: set[int] = set()
        for entry in new.replica_assignment:
            if list(entry.broker_ids) != [me]:
                raise InvalidRequestError(
                    f"replica assignment of {new.name!r}: partition {entry.partition} names "
                    f"brokers {':'.join(map(str, entry.broker_ids)) or '(none)'}, but this "
                    f"standalone broker (id {me}) can only place every partition on itself"
                )
            if entry.partition < 0 or entry.partition >= n or entry.partition in seen:
                raise InvalidRequestError(
                    f"replica assignment of {new.name!r}: partition {entry.partition} is out "
                    f"of range or given twice; list each of 0 to {n - 1} once"
                )
            seen.add(entry.partition)
        if new.partitions not in (0, -1, n):
            raise InvalidRequestError(
                f"topic {new.name!r} asks for {new.partitions} partitions but its replica "
                f"assignment has {n}: give the same count, or -1 to take it from the assignment"
            )
        if new.replication_factor not in (0, -1, 1):
            raise InvalidRequestError(
                f"topic {new.name!r} asks for replication factor {new.replication_factor} "
                f"but its replica assignment has 1 replica per partition"
            )
        return n, 1

    async def DeleteTopics(
        self, request: admin_pb2.DeleteTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DeleteTopicsResponse:
        await self._check_topic_count(len(request.names), "DeleteTopics", context)
        response = admin_pb2.DeleteTopicsResponse()
        repeated_topics = repeated(request.names)
        for name in request.names:
            result = response.topics.add(name=name)
            try:
                if name in repeated_topics:
                    raise repeated_name_error(name, "DeleteTopics")
                self._manager.logs.delete_topic(name)
            except Exception as exc:
                result.error.CopyFrom(error_proto(exc, f"deleting topic {name}"))
        return response

    async def DescribeTopics(
        self, request: admin_pb2.DescribeTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeTopicsResponse:
        await self._check_topic_count(len(request.names), "DescribeTopics", context)
        response = admin_pb2.DescribeTopicsResponse()
        broker_id = self._config.broker_id
        offline = set(self._manager.logs.offline_partitions())
        # Each name once (request_limits.distinct).
        for name in distinct(request.names) or self._manager.logs.topic_names():
            description = response.topics.add(name=name)
            try:
                topic = self._manager.logs.topic(name)
                views = self._manager.describe(name)
            except Exception as exc:
                description.error.CopyFrom(error_proto(exc, f"describing topic {name}"))
                continue
            description.configs.update(config_to_strings(topic.config))
            for view in views:
                description.partitions.append(
                    described_partition(
                        view,
                        leader_id=broker_id,
                        replicas=[broker_id],
                        isr=[broker_id],
                        offline_replicas=[broker_id] if (name, view.partition) in offline else [],
                    )
                )
        return response

    async def DescribeConfigs(
        self, request: admin_pb2.DescribeConfigsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeConfigsResponse:
        await self._check_topic_count(len(request.names), "DescribeConfigs", context)
        response = admin_pb2.DescribeConfigsResponse()
        for name in list(request.names) or self._manager.logs.topic_names():
            result = response.topics.add(name=name)
            try:
                values = self._manager.logs.describe_configs(name)
            except Exception as exc:
                result.error.CopyFrom(error_proto(exc, f"describing configs of {name}"))
                continue
            for value in values:
                result.entries.add(
                    name=value.name, value=value.value, source=_CONFIG_SOURCES[value.source]
                )
        return response

    async def AlterConfigs(
        self, request: admin_pb2.AlterConfigsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.AlterConfigsResponse:
        await self._check_topic_count(len(request.topics), "AlterConfigs", context)
        response = admin_pb2.AlterConfigsResponse()
        repeated_topics = repeated(change.name for change in request.topics)
        for change in request.topics:
            result = response.topics.add(name=change.name)
            try:
                if change.name in repeated_topics:
                    raise repeated_name_error(change.name, "AlterConfigs")
                self._manager.logs.alter_configs(
                    change.name,
                    dict(change.set),
                    list(change.delete),
                    validate_only=request.validate_only,
                )
            except Exception as exc:
                result.error.CopyFrom(error_proto(exc, f"altering configs of {change.name}"))
        return response

    async def DeleteRecords(
        self, request: admin_pb2.DeleteRecordsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DeleteRecordsResponse:
        try:
            return await delete_records(self._manager, request)
        except Exception as exc:
            await abort(context, exc, "deleting records")

    async def _needs_cluster(self, context: grpc.aio.ServicerContext, what: str) -> NoReturn:
        await abort(
            context,
            InvalidRequestError(
                f"{what} needs a cluster (brokers started with --etcd and a coordinator); "
                "this broker runs standalone"
            ),
            what,
        )

    async def CreatePartitions(
        self, request: admin_pb2.CreatePartitionsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CreatePartitionsResponse:
        await self._needs_cluster(context, "adding partitions")

    async def ElectLeaders(
        self, request: admin_pb2.ElectLeadersRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ElectLeadersResponse:
        await self._needs_cluster(context, "electing leaders")

    async def AlterPartitionReassignments(
        self,
        request: admin_pb2.AlterPartitionReassignmentsRequest,
        context: grpc.aio.ServicerContext,
    ) -> admin_pb2.AlterPartitionReassignmentsResponse:
        await self._needs_cluster(context, "reassigning partitions")

    async def ListPartitionReassignments(
        self,
        request: admin_pb2.ListPartitionReassignmentsRequest,
        context: grpc.aio.ServicerContext,
    ) -> admin_pb2.ListPartitionReassignmentsResponse:
        # A standalone broker never reassigns: nothing is in progress.
        return admin_pb2.ListPartitionReassignmentsResponse()
