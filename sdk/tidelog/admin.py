"""`AdminClient` (blocking) and `AsyncAdminClient`: create, delete, describe
topics, and describe and alter their configs; list, describe, reset and
delete consumer groups (`_admin_groups`).

The Admin service is unary; any broker (or the gateway) answers it, so calls
go to the first address that is reachable. Each call raises the typed error
of the first topic that failed (TopicAlreadyExistsError, InvalidTopicError,
UnknownTopicOrPartitionError, ...), after the whole request ran: topics
succeed or fail one by one, as the service does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import grpc.aio

from tidelog._admin_groups import GroupAdmin, GroupDescription, GroupListing
from tidelog._connection import Cluster
from tidelog._loop_thread import LoopThread
from tidelog.config import AdminConfig
from tidelog.errors import (
    BrokerNotAvailableError,
    ClosedError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    error_from_code,
    error_from_rpc,
)
from tidelog.group import OffsetAndMetadata
from tidelog.types import NewTopic, PartitionInfo, TopicDescription, TopicPartition
from tidelog.v1 import admin_pb2

__all__ = ["AdminClient", "AsyncAdminClient", "ConfigEntry", "GroupDescription", "GroupListing"]

T = TypeVar("T")


def _raise_first_error(results: Iterable[Any]) -> None:
    for result in results:
        if result.error.code:
            raise error_from_code(result.error.code, f"{result.name}: {result.error.message}")


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


class AsyncAdminClient:
    """Topic administration on asyncio. Options: see `tidelog.config.AdminConfig`."""

    def __init__(self, bootstrap_servers: str | Sequence[str] | None = None, **options: Any):
        self._config = AdminConfig(bootstrap_servers=bootstrap_servers, **options)
        self._cluster = Cluster(self._config)
        self._timeout_s = self._config.request_timeout_ms / 1000
        self._closed = False
        # Consumer groups live on the coordinator (found through the brokers).
        self._groups = GroupAdmin(self._cluster, self._config)

    async def _call(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """Run one unary call on the first reachable address."""
        if self._closed:
            raise ClosedError("the admin client is closed")
        last = ""
        for address in self._cluster.any_address():
            try:
                return await fn(self._cluster.admin_stub(address))
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise error_from_rpc(exc) from exc
                last = exc.details() or exc.code().name
        # The reason in one line (str() of an AioRpcError is gRPC's debug dump).
        raise BrokerNotAvailableError(
            f"no broker answered at {', '.join(self._cluster.any_address())}: {last}"
        )

    async def create_topics(
        self, new_topics: Iterable[NewTopic], validate_only: bool = False
    ) -> None:
        new_topics = list(new_topics)
        for t in new_topics:
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
                )
                for t in new_topics
            ],
            validate_only=validate_only,
        )
        response: admin_pb2.CreateTopicsResponse = await self._call(
            lambda s: s.CreateTopics(request, timeout=self._timeout_s)
        )
        _raise_first_error(response.topics)

    async def delete_topics(self, names: Iterable[str]) -> None:
        request = admin_pb2.DeleteTopicsRequest(names=list(names))
        response: admin_pb2.DeleteTopicsResponse = await self._call(
            lambda s: s.DeleteTopics(request, timeout=self._timeout_s)
        )
        _raise_first_error(response.topics)

    async def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicDescription]:
        """Describe the named topics (every topic when None)."""
        request = admin_pb2.DescribeTopicsRequest(names=list(names or ()))
        response: admin_pb2.DescribeTopicsResponse = await self._call(
            lambda s: s.DescribeTopics(request, timeout=self._timeout_s)
        )
        _raise_first_error(response.topics)
        return [_description(t) for t in response.topics]

    async def list_topics(self) -> list[str]:
        """Names of every topic, sorted."""
        return sorted(t.name for t in await self.describe_topics())

    async def describe_configs(
        self, names: Iterable[str] | None = None
    ) -> dict[str, dict[str, ConfigEntry]]:
        """Every config of the named topics (every topic when None):
        topic -> key -> ConfigEntry (effective value and its source)."""
        request = admin_pb2.DescribeConfigsRequest(names=list(names or ()))
        response = await self._call(lambda s: s.DescribeConfigs(request, timeout=self._timeout_s))
        _raise_first_error(response.topics)
        return {
            t.name: {
                e.name: ConfigEntry(e.name, e.value, _SOURCES.get(e.source, "default"))
                for e in t.entries
            }
            for t in response.topics
        }

    async def alter_configs(
        self,
        configs: Mapping[str, Mapping[str, str | None]],
        validate_only: bool = False,
    ) -> None:
        """Set topic config overrides: {topic: {key: value}}; a value of None
        removes the override (the key falls back to the broker's default).
        Keys not named keep their value. Raises InvalidConfigError naming the
        key for an unknown key or a bad value; takes effect without restart."""
        request = admin_pb2.AlterConfigsRequest(
            topics=[
                admin_pb2.AlterTopicConfigs(
                    name=topic,
                    set={k: str(v) for k, v in changes.items() if v is not None},
                    delete=[k for k, v in changes.items() if v is None],
                )
                for topic, changes in configs.items()
            ],
            validate_only=validate_only,
        )
        response = await self._call(lambda s: s.AlterConfigs(request, timeout=self._timeout_s))
        _raise_first_error(response.topics)

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
        self, query: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """Log offsets by time: tp -> -2 (earliest), -1 (latest) or a time in
        ms; answers tp -> (offset, timestamp), offset -1 when none is that late."""
        return await self._groups.list_offsets(query)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._groups.close()
            await self._cluster.close()

    async def __aenter__(self) -> AsyncAdminClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class AdminClient:
    """Blocking topic administration. Options: see `tidelog.config.AdminConfig`."""

    def __init__(self, bootstrap_servers: str | Sequence[str] | None = None, **options: Any):
        self._async = AsyncAdminClient(bootstrap_servers, **options)
        self._timeout_s = self._async._timeout_s + 1
        self._loop_thread = LoopThread("tidelog-admin")
        self._closed = False

    def create_topics(self, new_topics: Iterable[NewTopic], validate_only: bool = False) -> None:
        """Create topics; raise the typed error of the first that failed."""
        self._loop_thread.run(
            self._async.create_topics(list(new_topics), validate_only), self._timeout_s
        )

    def delete_topics(self, names: Iterable[str]) -> None:
        """Delete topics and their data; raise the first failure."""
        self._loop_thread.run(self._async.delete_topics(list(names)), self._timeout_s)

    def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicDescription]:
        """Describe the named topics (every topic when None)."""
        names = None if names is None else list(names)
        return self._loop_thread.run(self._async.describe_topics(names), self._timeout_s)

    def list_topics(self) -> list[str]:
        """Names of every topic, sorted."""
        return self._loop_thread.run(self._async.list_topics(), self._timeout_s)

    def describe_configs(
        self, names: Iterable[str] | None = None
    ) -> dict[str, dict[str, ConfigEntry]]:
        """Every config of the named topics (every topic when None):
        topic -> key -> ConfigEntry (effective value and its source)."""
        names = None if names is None else list(names)
        return self._loop_thread.run(self._async.describe_configs(names), self._timeout_s)

    def alter_configs(
        self,
        configs: Mapping[str, Mapping[str, str | None]],
        validate_only: bool = False,
    ) -> None:
        """Set topic config overrides, {topic: {key: value}} (None removes
        one); see AsyncAdminClient.alter_configs."""
        self._loop_thread.run(self._async.alter_configs(configs, validate_only), self._timeout_s)

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
        self, query: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """Log offsets by time (see AsyncAdminClient.list_offsets)."""
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
