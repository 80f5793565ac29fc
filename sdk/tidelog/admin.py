"""`AdminClient` (blocking) and `AsyncAdminClient`: create, delete, describe
topics, and describe and alter their configs; list, describe, reset and
delete consumer groups (`_admin_groups`); add partitions, delete records,
elect preferred leaders and reassign replicas (`_admin_partitions`).

The Admin service is unary; any broker (or the gateway) answers it, so calls
go to the first address that is reachable. A call failing with a retriable
error is sent again until default_api_timeout_ms runs out, as Kafka's
AdminClient does: reads (describe, list) always, writes only when the error
says they were surely not carried out (`_admin_retry` says which). Topics
succeed or fail one by one, as the service does. create_topics and delete_topics return each topic's
result (None or its typed error: TopicAlreadyExistsError, InvalidTopicError,
UnknownTopicOrPartitionError, ...) and, unless raise_errors=False, raise the
first error after the whole request ran; the other calls raise it.

Configs: describe_configs, alter_configs (Kafka's: the given configs replace
every override) and incremental_alter_configs (set, delete, append, subtract)
take kafka-python's ConfigResource; only TOPIC resources are served (a
broker's configs live in its config file). The older mapping form of
alter_configs ({topic: {key: value or None}}) changes only the keys named.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import grpc.aio

from tidelog import _admin_partitions
from tidelog._admin_groups import GroupAdmin, GroupDescription, GroupListing
from tidelog._admin_retry import AdminRetry
from tidelog._admin_security import (
    AclBinding,
    AclBindingFilter,
    AsyncSecurityAdmin,
    ClientQuota,
    SecurityAdmin,
)
from tidelog._closing_calls import RunningCalls, ended_by_close
from tidelog._connection import Cluster
from tidelog._loop_thread import LoopThread
from tidelog.config import AdminConfig
from tidelog.errors import (
    BrokerNotAvailableError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    TidelogError,
    error_from_code,
    error_from_rpc,
    names_error_code,
    never_connected,
)
from tidelog.group import OffsetAndMetadata
from tidelog.types import (
    AlterConfigOp,
    AlterConfigOpType,
    ClusterDescription,
    ConfigResource,
    ConfigResourceType,
    ListOffsetsResultInfo,
    NewPartitions,
    NewTopic,
    Node,
    OffsetSpec,
    PartitionInfo,
    PartitionReassignment,
    TopicDescription,
    TopicPartition,
)
from tidelog.v1 import admin_pb2, cluster_pb2

__all__ = [
    "AclBinding",
    "AclBindingFilter",
    "AdminClient",
    "AsyncAdminClient",
    "ClientQuota",
    "ConfigEntry",
    "GroupDescription",
    "GroupListing",
]

T = TypeVar("T")


def _raise_first_error(results: Iterable[Any]) -> None:
    for result in results:
        if result.error.code:
            raise error_from_code(result.error.code, f"{result.name}: {result.error.message}")


def _topic_results(results: Iterable[Any], raise_errors: bool) -> dict[str, TidelogError | None]:
    """Each topic's outcome: None, or its typed error (raised, the first
    one, when `raise_errors`)."""
    out: dict[str, TidelogError | None] = {}
    for result in results:
        out[result.name] = (
            error_from_code(result.error.code, f"{result.name}: {result.error.message}")
            if result.error.code
            else None
        )
    if raise_errors:
        for error in out.values():
            if error is not None:
                raise error
    return out


def _topic_of(resource: ConfigResource | str) -> str:
    """The topic a config resource names; BROKER resources are refused."""
    if isinstance(resource, str):
        return resource
    if not isinstance(resource, ConfigResource):
        raise TypeError(f"expected a ConfigResource or a topic name, got {resource!r}")
    kind = resource.resource_type
    if kind is not ConfigResourceType.TOPIC:
        kind_name = kind.name if isinstance(kind, ConfigResourceType) else kind
        raise InvalidRequestError(
            f"{kind_name} {resource.name!r}: only TOPIC configs are served "
            "by the Admin API (a broker's configs are set in its config file or flags)"
        )
    return resource.name


def _offset_query(query: Mapping[TopicPartition, OffsetSpec | int]) -> dict[TopicPartition, int]:
    out = {}
    for tp, spec in query.items():
        timestamp = spec.timestamp if isinstance(spec, OffsetSpec) else OffsetSpec(spec).timestamp
        out[TopicPartition(*tp)] = timestamp
    return out


def _list_items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _description(topic: admin_pb2.TopicDescription) -> TopicDescription:
    return TopicDescription(
        name=topic.name,
        partitions=[
            PartitionInfo(
                partition=p.partition,
                leader=p.leader_id,
                replicas=list(p.replicas),
                isr=list(p.isr),
                log_start_offset=p.log_start_offset,
                log_end_offset=p.log_end_offset,
                high_watermark=p.high_watermark,
                size_bytes=p.size_bytes,
                segment_count=p.segment_count,
                adding_replicas=list(p.adding_replicas),
                removing_replicas=list(p.removing_replicas),
                error=(error_from_code(p.error.code, p.error.message) if p.error.code else None),
                offline_replicas=list(p.offline_replicas),
                torn_replicas=list(p.torn_replicas),
                eligible_leader_replicas=list(p.eligible_leader_replicas),
            )
            for p in sorted(topic.partitions, key=lambda p: p.partition)
        ],
        configs=dict(topic.configs),
    )


@dataclass(frozen=True)
class ConfigEntry:
    """One topic config as the broker applies it."""

    name: str
    value: str
    #: "topic" (an override of this topic), "broker" (the broker's config
    #: file) or "default" (built in).
    source: str

    @property
    def is_override(self) -> bool:
        return self.source == "topic"


_SOURCES = {
    admin_pb2.CONFIG_SOURCE_DEFAULT: "default",
    admin_pb2.CONFIG_SOURCE_BROKER: "broker",
    admin_pb2.CONFIG_SOURCE_TOPIC: "topic",
}


@ended_by_close
class AsyncAdminClient(AsyncSecurityAdmin):
    """Topic administration on asyncio. Options: see `tidelog.config.AdminConfig`.

    A call running when close() is called, or made after it, raises
    ClosedError (`_closing_calls`)."""

    def __init__(self, bootstrap_servers: str | Sequence[str] | None = None, **options: Any):
        self._config = AdminConfig(bootstrap_servers=bootstrap_servers, **options)
        self._cluster = Cluster(self._config)
        self._timeout_s = self._config.request_timeout_ms / 1000
        self._closed = False
        self._running = RunningCalls("admin client")
        self._retry = AdminRetry(self._config)
        # Consumer groups live on the coordinator (found through the brokers).
        self._groups = GroupAdmin(self._cluster, self._config, self._retry)

    async def _call(self, fn: Callable[[Any], Awaitable[T]], *, idempotent: bool = False) -> T:
        """Run one unary call on the first reachable address, sent again
        while it fails with a retriable error, until default_api_timeout_ms
        (`_admin_retry`). A write (the default) is sent again only when the
        error says it was surely not carried out; `idempotent` (reads) on
        any retriable error. (A closed client's calls never get here:
        `ended_by_close` refuses them.)"""
        return await self._retry.run(
            lambda: self._call_once(fn), idempotent=idempotent, what="admin call"
        )

    async def _read(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """`_call` of a read: safe to send again whatever the failure."""
        return await self._call(fn, idempotent=True)

    async def _call_once(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """One attempt: the first address that can be reached answers."""
        last = ""
        never_sent = True
        for address in self._cluster.any_address():
            try:
                return await fn(self._cluster.admin_stub(address))
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or names_error_code(exc):
                    # The server's own answer (a coordinator it could not
                    # reach, say), or a call it cancelled (retriable, naming
                    # the address): not sent to another address, since it
                    # may have been carried out; `_admin_retry` decides.
                    raise error_from_rpc(exc, address=address) from exc
                never_sent = never_sent and error_from_rpc(exc).not_carried_out
                last = exc.details() or exc.code().name
        # The reason in one line (str() of an AioRpcError is gRPC's debug dump).
        error = BrokerNotAvailableError(
            f"no broker answered at {', '.join(self._cluster.any_address())}: {last}"
        )
        if never_sent:
            error.surely_not_carried_out()
        raise error

    async def create_topics(
        self,
        new_topics: Iterable[NewTopic],
        validate_only: bool = False,
        raise_errors: bool = True,
    ) -> dict[str, TidelogError | None]:
        """Create topics; returns topic -> None (created, or with
        `validate_only` would be) or its typed error. With `raise_errors`
        (the default) the first error is raised instead, after every topic
        was tried. A NewTopic with `replica_assignments` is placed as given
        (checked by the coordinator: see NewTopic).

        Sent again (until default_api_timeout_ms) only when it surely was
        not carried out (no broker reachable, no coordinator registered):
        a call whose outcome is unknown (DEADLINE_EXCEEDED, cut off mid-way)
        raises at once, since a resend could answer TopicAlreadyExistsError
        for a topic this call did create (`_admin_retry`)."""
        new_topics = list(new_topics)
        for t in new_topics:
            if t.replica_assignments is not None:
                _check_assignment_shape(t)
                continue
            # On the wire 0 means "the broker's default": refuse it here
            # rather than create a topic of another size than asked for.
            if t.num_partitions < 1:
                raise InvalidPartitionsError(
                    f"{t.name}: num_partitions={t.num_partitions}: use at least 1"
                )
            if t.replication_factor < 1:
                raise InvalidReplicationFactorError(
                    f"{t.name}: replication_factor={t.replication_factor}: use at least 1"
                )
        request = admin_pb2.CreateTopicsRequest(
            topics=[
                admin_pb2.NewTopic(
                    name=t.name,
                    partitions=t.num_partitions,
                    replication_factor=t.replication_factor,
                    configs=dict(t.topic_configs),
                    replica_assignment=[
                        admin_pb2.ReplicaAssignment(partition=p, broker_ids=list(ids))
                        for p, ids in sorted((t.replica_assignments or {}).items())
                    ],
                )
                for t in new_topics
            ],
            validate_only=validate_only,
        )
        response: admin_pb2.CreateTopicsResponse = await self._call(
            lambda s: s.CreateTopics(request, timeout=self._timeout_s)
        )
        return _topic_results(response.topics, raise_errors)

    async def delete_topics(
        self, names: Iterable[str], raise_errors: bool = True
    ) -> dict[str, TidelogError | None]:
        """Delete topics; results as create_topics'."""
        request = admin_pb2.DeleteTopicsRequest(names=list(names))
        response: admin_pb2.DeleteTopicsResponse = await self._call(
            lambda s: s.DeleteTopics(request, timeout=self._timeout_s)
        )
        return _topic_results(response.topics, raise_errors)

    async def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicDescription]:
        """Describe the named topics (every topic when None). Raises a
        topic's error (an unknown topic, say); a partition whose leader's
        figures could not be had has its own `error` instead (PartitionInfo)."""
        request = admin_pb2.DescribeTopicsRequest(names=list(names or ()))
        response: admin_pb2.DescribeTopicsResponse = await self._read(
            lambda s: s.DescribeTopics(request, timeout=self._timeout_s)
        )
        _raise_first_error(response.topics)
        return [_description(t) for t in response.topics]

    async def list_topics(self) -> list[str]:
        """Names of every topic, sorted."""
        return sorted(t.name for t in await self.describe_topics())

    async def describe_configs(
        self, resources: Iterable[ConfigResource | str] | None = None
    ) -> dict[Any, dict[str, ConfigEntry]]:
        """Every config of the given topics, as ConfigResources or names
        (every topic when None): resource (as given; the topic name when
        None) -> key -> ConfigEntry (effective value and its source)."""
        items = None if resources is None else list(resources)
        names = [] if items is None else [_topic_of(item) for item in items]
        request = admin_pb2.DescribeConfigsRequest(names=names)
        response = await self._read(lambda s: s.DescribeConfigs(request, timeout=self._timeout_s))
        _raise_first_error(response.topics)
        by_name = {
            t.name: {
                e.name: ConfigEntry(e.name, e.value, _SOURCES.get(e.source, "default"))
                for e in t.entries
            }
            for t in response.topics
        }
        if items is None:
            return dict(by_name)
        return {item: by_name[name] for item, name in zip(items, names, strict=True)}

    async def alter_configs(
        self,
        configs: Mapping[str, Mapping[str, str | None]] | Iterable[ConfigResource],
        validate_only: bool = False,
    ) -> None:
        """Change topic configs; takes effect without restart. Raises
        InvalidConfigError naming the key for an unknown key or a bad value.

        Given ConfigResources (Kafka's alter_configs): each resource's
        `configs` become the topic's whole set of overrides; an override
        not named goes back to the default. (The current overrides are read
        first: a change made by someone else in between is undone.)

        Given a mapping {topic: {key: value}}: only the keys named change; a
        value of None removes the override."""
        if isinstance(configs, Mapping):
            changes = {topic: dict(c) for topic, c in configs.items()}
        else:
            resources = list(configs)
            names = [_topic_of(r) for r in resources]
            current = await self.describe_configs(names) if names else {}
            changes = {}
            for resource, name in zip(resources, names, strict=True):
                wanted: dict[str, str | None] = {
                    k: str(v) for k, v in (resource.configs or {}).items()
                }
                for key, entry in current[name].items():
                    if entry.is_override and key not in wanted:
                        wanted[key] = None
                changes[name] = wanted
        await self._alter(changes, validate_only)

    async def incremental_alter_configs(
        self, resources: Iterable[ConfigResource], validate_only: bool = False
    ) -> None:
        """Kafka's incremental_alter_configs: each resource's `configs` maps
        a key to a value (set), None (delete the override) or an
        AlterConfigOp; APPEND and SUBTRACT add values to and remove them
        from a comma-separated list config (cleanup.policy), read first."""
        resources = list(resources)
        names = [_topic_of(r) for r in resources]
        ops: dict[str, dict[str, AlterConfigOp]] = {}
        for resource, name in zip(resources, names, strict=True):
            for key, change in (resource.configs or {}).items():
                if isinstance(change, AlterConfigOp):
                    op = change
                elif change is None:
                    op = AlterConfigOp(AlterConfigOpType.DELETE)
                else:
                    op = AlterConfigOp(AlterConfigOpType.SET, str(change))
                if op.op_type is not AlterConfigOpType.DELETE and op.value is None:
                    raise InvalidConfigError(f"{name}: {op.op_type.name} of {key} needs a value")
                ops.setdefault(name, {})[key] = op
        lists = (AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT)
        needs_read = [
            n for n, by_key in ops.items() if any(o.op_type in lists for o in by_key.values())
        ]
        current = await self.describe_configs(needs_read) if needs_read else {}
        changes: dict[str, dict[str, str | None]] = {}
        for name, by_key in ops.items():
            out = changes.setdefault(name, {})
            for key, op in by_key.items():
                if op.op_type is AlterConfigOpType.SET:
                    out[key] = op.value
                elif op.op_type is AlterConfigOpType.DELETE:
                    out[key] = None
                else:
                    entry = current[name].get(key)
                    if entry is None:
                        raise InvalidConfigError(f"{name}: unknown config {key!r}")
                    items = _list_items(entry.value)
                    given = _list_items(op.value or "")
                    if op.op_type is AlterConfigOpType.APPEND:
                        items += [v for v in given if v not in items]
                    else:
                        items = [v for v in items if v not in given]
                    out[key] = ",".join(items)
        await self._alter(changes, validate_only)

    async def _alter(
        self, changes: Mapping[str, Mapping[str, str | None]], validate_only: bool
    ) -> None:
        request = admin_pb2.AlterConfigsRequest(
            topics=[
                admin_pb2.AlterTopicConfigs(
                    name=topic,
                    set={k: str(v) for k, v in c.items() if v is not None},
                    delete=[k for k, v in c.items() if v is None],
                )
                for topic, c in changes.items()
            ],
            validate_only=validate_only,
        )
        response = await self._call(lambda s: s.AlterConfigs(request, timeout=self._timeout_s))
        _raise_first_error(response.topics)

    # ------------------------------------------------------------ partitions
    # (need a cluster, except delete_records)

    async def create_partitions(
        self,
        topic_partitions: Mapping[str, NewPartitions | int],
        validate_only: bool = False,
        raise_errors: bool = True,
    ) -> dict[str, TidelogError | None]:
        """Add partitions: topic -> NewPartitions(total_count, new_assignments)
        (or the total count alone). The count only grows (InvalidPartitionsError
        otherwise). Records with a key may map to another partition afterwards;
        producers and group members see the new partitions at their next
        metadata refresh (metadata_max_age_ms) or rebalance. Results as
        create_topics'."""
        return await _admin_partitions.create_partitions(
            self._call, self._timeout_s, dict(topic_partitions), validate_only, raise_errors
        )

    async def delete_records(
        self, records_to_delete: Mapping[TopicPartition, int], raise_errors: bool = True
    ) -> dict[TopicPartition, int | TidelogError]:
        """Delete the records below an offset in each partition (-1: the high
        watermark, that is every committed record): partition -> its new log
        start offset (Kafka's low watermark), or its typed error (the first
        one raised unless raise_errors=False). An offset past the high
        watermark fails with OffsetOutOfRangeError."""
        return await _admin_partitions.delete_records(
            self._call, self._timeout_s, dict(records_to_delete), raise_errors
        )

    async def elect_leaders(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, TidelogError | None]:
        """Preferred-leader election (Kafka's electLeaders, PREFERRED): make
        each partition's first replica its leader where it is alive and in
        the ISR; every partition when None. partition -> None (elected) or
        ElectionNotNeededError (it already led) or
        PreferredLeaderNotAvailableError (it is not alive or not in sync)."""
        return await _admin_partitions.elect_leaders(
            self._call, self._timeout_s, None if partitions is None else list(partitions)
        )

    async def alter_partition_reassignments(
        self,
        reassignments: Mapping[TopicPartition, Sequence[int] | None],
        throttle_bytes_per_s: int = 0,
        raise_errors: bool = True,
    ) -> dict[TopicPartition, TidelogError | None]:
        """Move partitions to other replicas: partition -> target broker ids
        (the preferred leader first), or None to cancel its move (the
        original replicas are restored). The new replicas catch up, join the
        ISR, then the others are removed; `throttle_bytes_per_s` limits what
        each leader sends to the new replicas (0: no limit). Returns at once;
        list_partition_reassignments shows the progress."""
        return await _admin_partitions.alter_partition_reassignments(
            self._call, self._timeout_s, dict(reassignments), throttle_bytes_per_s, raise_errors
        )

    async def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, PartitionReassignment]:
        """Reassignments in progress (of `partitions`; all when None), with
        each adding replica's progress."""
        return await _admin_partitions.list_partition_reassignments(
            self._read, self._timeout_s, None if partitions is None else list(partitions)
        )

    async def describe_cluster(self) -> ClusterDescription:
        """The cluster id, controller, live brokers and coordinators. A
        standalone broker (no etcd) answers with its brokers only."""
        return await self._retry.run(
            self._describe_cluster_once, idempotent=True, what="describe_cluster"
        )

    async def _describe_cluster_once(self) -> ClusterDescription:
        last = ""
        never_sent = True
        for address in self._cluster.any_address():
            try:
                reply = await self._cluster.cluster_stub(address).DescribeCluster(
                    cluster_pb2.DescribeClusterRequest(), timeout=self._timeout_s
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return await self._standalone_description()
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise error_from_rpc(exc, address=address) from exc
                never_sent = never_sent and never_connected(exc)
                last = exc.details() or exc.code().name
                continue
            return ClusterDescription(
                cluster_id=reply.cluster_id or None,
                controller_id=reply.controller_id or None,
                brokers=[
                    Node(b.broker_id, b.host, b.port, b.rack or None)
                    for b in sorted(reply.brokers, key=lambda b: b.broker_id)
                ],
                coordinators=[(c.id, f"{c.host}:{c.port}") for c in reply.coordinators],
            )
        error = BrokerNotAvailableError(
            f"no broker answered at {', '.join(self._cluster.any_address())}: {last}"
        )
        if never_sent:
            error.surely_not_carried_out()  # no connection could be made
        raise error

    async def _standalone_description(self) -> ClusterDescription:
        snapshot = await self._cluster.refresh()
        brokers = []
        for broker_id, address in sorted(snapshot.brokers.items()):
            host, _, port = address.rpartition(":")
            brokers.append(Node(broker_id, host, int(port)))
        return ClusterDescription(None, None, brokers, [])

    # ------------------------------------------------------------ consumer groups
    # (need a cluster: brokers with --etcd and a coordinator)

    async def list_consumer_groups(self) -> list[GroupListing]:
        """Every group with members or committed offsets, by id."""
        return await self._groups.list_groups()

    async def describe_consumer_groups(
        self, group_ids: Iterable[str]
    ) -> dict[str, GroupDescription]:
        """State, generation, assignor and members (owned and target partitions)."""
        return {g: await self._groups.describe_group(g) for g in group_ids}

    async def list_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Committed offsets of a group (of `partitions`; all when None)."""
        return await self._groups.committed(group_id, list(partitions or ()))

    async def alter_consumer_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int | OffsetAndMetadata]
    ) -> None:
        """Set a group's committed offsets (an offset reset). Refused with
        NonEmptyGroupError while the group has live members."""
        await self._groups.alter_offsets(group_id, offsets)

    async def delete_consumer_groups(self, group_ids: Iterable[str]) -> None:
        """Delete groups and their offsets; NonEmptyGroupError while one has members."""
        for group_id in group_ids:
            await self._groups.delete_group(group_id)

    async def list_offsets(
        self, query: Mapping[TopicPartition, OffsetSpec | int]
    ) -> dict[TopicPartition, ListOffsetsResultInfo]:
        """Log offsets: tp -> OffsetSpec.earliest(), .latest() or
        .for_timestamp(ms) (or the wire values -2, -1, a time in ms);
        answers tp -> ListOffsetsResultInfo(offset, timestamp), offset -1
        when no record is that late. Kafka's OffsetSpec.max_timestamp() is
        not available: the broker cannot answer it."""
        found = await self._groups.list_offsets(_offset_query(query))
        return {tp: ListOffsetsResultInfo(*answer) for tp, answer in found.items()}

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            # The calls end first: none goes on to open a channel again.
            await self._running.end()
            await self._groups.close()
            await self._cluster.close()

    async def __aenter__(self) -> AsyncAdminClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class AdminClient(SecurityAdmin):
    """Blocking topic administration. Options: see `tidelog.config.AdminConfig`."""

    def __init__(self, bootstrap_servers: str | Sequence[str] | None = None, **options: Any):
        self._async = AsyncAdminClient(bootstrap_servers, **options)
        # The async call ends within default_api_timeout_ms, retries
        # included; the second more is for its loop to hand the answer back.
        self._timeout_s = self._async._config.default_api_timeout_ms / 1000 + 1
        self._loop_thread = LoopThread("tidelog-admin")
        self._closed = False

    def create_topics(
        self,
        new_topics: Iterable[NewTopic],
        validate_only: bool = False,
        raise_errors: bool = True,
    ) -> dict[str, TidelogError | None]:
        """Create topics: topic -> None or its typed error (the first one
        raised unless raise_errors=False); see AsyncAdminClient.create_topics."""
        return self._loop_thread.run(
            self._async.create_topics(list(new_topics), validate_only, raise_errors),
            self._timeout_s,
        )

    def delete_topics(
        self, names: Iterable[str], raise_errors: bool = True
    ) -> dict[str, TidelogError | None]:
        """Delete topics and their data; results as create_topics'."""
        return self._loop_thread.run(
            self._async.delete_topics(list(names), raise_errors), self._timeout_s
        )

    def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicDescription]:
        """Describe the named topics (every topic when None). Raises a
        topic's error (an unknown topic, say); a partition whose leader's
        figures could not be had has its own `error` instead (PartitionInfo)."""
        names = None if names is None else list(names)
        return self._loop_thread.run(self._async.describe_topics(names), self._timeout_s)

    def list_topics(self) -> list[str]:
        """Names of every topic, sorted."""
        return self._loop_thread.run(self._async.list_topics(), self._timeout_s)

    def describe_configs(
        self, resources: Iterable[ConfigResource | str] | None = None
    ) -> dict[Any, dict[str, ConfigEntry]]:
        """Every config of the given topics (ConfigResources or names; every
        topic when None): resource -> key -> ConfigEntry."""
        resources = None if resources is None else list(resources)
        return self._loop_thread.run(self._async.describe_configs(resources), self._timeout_s)

    def alter_configs(
        self,
        configs: Mapping[str, Mapping[str, str | None]] | Iterable[ConfigResource],
        validate_only: bool = False,
    ) -> None:
        """Change topic configs: ConfigResources replace the overrides, a
        {topic: {key: value or None}} mapping changes only the keys named;
        see AsyncAdminClient.alter_configs."""
        if not isinstance(configs, Mapping):
            configs = list(configs)
        # ConfigResources take two calls (read the overrides, then alter).
        self._loop_thread.run(
            self._async.alter_configs(configs, validate_only), 2 * self._timeout_s
        )

    def incremental_alter_configs(
        self, resources: Iterable[ConfigResource], validate_only: bool = False
    ) -> None:
        """Set, delete, append to or subtract from topic configs; see
        AsyncAdminClient.incremental_alter_configs."""
        self._loop_thread.run(
            self._async.incremental_alter_configs(list(resources), validate_only),
            2 * self._timeout_s,
        )

    def create_partitions(
        self,
        topic_partitions: Mapping[str, NewPartitions | int],
        validate_only: bool = False,
        raise_errors: bool = True,
    ) -> dict[str, TidelogError | None]:
        """Add partitions to topics; see AsyncAdminClient.create_partitions."""
        return self._loop_thread.run(
            self._async.create_partitions(dict(topic_partitions), validate_only, raise_errors),
            self._timeout_s,
        )

    def delete_records(
        self, records_to_delete: Mapping[TopicPartition, int], raise_errors: bool = True
    ) -> dict[TopicPartition, int | TidelogError]:
        """Delete records below offsets; see AsyncAdminClient.delete_records."""
        return self._loop_thread.run(
            self._async.delete_records(dict(records_to_delete), raise_errors), self._timeout_s
        )

    def elect_leaders(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, TidelogError | None]:
        """Preferred-leader election; see AsyncAdminClient.elect_leaders."""
        partitions = None if partitions is None else list(partitions)
        return self._loop_thread.run(self._async.elect_leaders(partitions), self._timeout_s)

    def alter_partition_reassignments(
        self,
        reassignments: Mapping[TopicPartition, Sequence[int] | None],
        throttle_bytes_per_s: int = 0,
        raise_errors: bool = True,
    ) -> dict[TopicPartition, TidelogError | None]:
        """Start, change or cancel replica moves; see
        AsyncAdminClient.alter_partition_reassignments."""
        return self._loop_thread.run(
            self._async.alter_partition_reassignments(
                dict(reassignments), throttle_bytes_per_s, raise_errors
            ),
            self._timeout_s,
        )

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, PartitionReassignment]:
        """Reassignments in progress with their progress."""
        partitions = None if partitions is None else list(partitions)
        return self._loop_thread.run(
            self._async.list_partition_reassignments(partitions), self._timeout_s
        )

    def describe_cluster(self) -> ClusterDescription:
        """Cluster id, controller, brokers and coordinators."""
        return self._loop_thread.run(self._async.describe_cluster(), self._timeout_s)

    # ------------------------------------------------------------ consumer groups

    def list_consumer_groups(self) -> list[GroupListing]:
        """Every group with members or committed offsets, by id."""
        return self._loop_thread.run(self._async.list_consumer_groups(), self._timeout_s)

    def describe_consumer_groups(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        """State, generation, assignor and members of each group."""
        return self._loop_thread.run(
            self._async.describe_consumer_groups(list(group_ids)), self._timeout_s
        )

    def list_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Committed offsets of a group (of `partitions`; all when None)."""
        return self._loop_thread.run(
            self._async.list_consumer_group_offsets(group_id, partitions), self._timeout_s
        )

    def alter_consumer_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int | OffsetAndMetadata]
    ) -> None:
        """Set a group's committed offsets; refused while it has live members."""
        self._loop_thread.run(
            self._async.alter_consumer_group_offsets(group_id, offsets), self._timeout_s
        )

    def delete_consumer_groups(self, group_ids: Iterable[str]) -> None:
        """Delete groups and their offsets; refused while one has members."""
        self._loop_thread.run(self._async.delete_consumer_groups(list(group_ids)), self._timeout_s)

    def list_offsets(
        self, query: Mapping[TopicPartition, OffsetSpec | int]
    ) -> dict[TopicPartition, ListOffsetsResultInfo]:
        """Log offsets by OffsetSpec (see AsyncAdminClient.list_offsets)."""
        return self._loop_thread.run(self._async.list_offsets(query), self._timeout_s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._loop_thread.run(self._async.close(), self._timeout_s)
        finally:
            self._loop_thread.stop()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _check_assignment_shape(topic: NewTopic) -> None:
    """What the client can refuse before sending a replica assignment (the
    coordinator checks the rest, e.g. that every broker is live)."""
    assignment = topic.replica_assignments or {}
    if not assignment:
        raise InvalidRequestError(f"{topic.name}: replica_assignments is empty")
    for name, value, derived in (
        ("num_partitions", topic.num_partitions, len(assignment)),
        ("replication_factor", topic.replication_factor, len(next(iter(assignment.values())))),
    ):
        if value != -1 and value != derived:
            raise InvalidRequestError(
                f"{topic.name}: {name}={value} but replica_assignments gives {derived}: "
                f"pass {name}=-1 (as in kafka-python) to take it from the assignment"
            )
