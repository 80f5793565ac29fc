"""Connections to brokers and the cluster metadata a client works from.

`Cluster` owns, for one client:

- one grpc.aio channel per broker address (created on first use, with the
  message size and keepalive options every Tidelog client uses);
- bootstrap: the first Metadata call goes to the configured servers in turn
  until one answers; while none can be reached (one that cancels the call
  was reached), a call that waits for metadata gives up after
  socket_connection_setup_timeout_ms, naming the addresses, instead of
  waiting out its whole timeout in silence;
- the metadata cache: an immutable `MetadataSnapshot` replaced as a whole on
  each refresh, so other threads (the producer's send()) may read it without
  a lock; refreshes are coalesced (concurrent callers share one RPC);
- what each server said of the partitions one request may name
  (`partition_limits`, tidelog._partition_limits).

Everything except reading `snapshot` must run on the client's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from tidelog._partition_limits import PartitionLimits
from tidelog.config import GRPC_MAX_MESSAGE_BYTES, CommonConfig
from tidelog.errors import (
    BrokerNotAvailableError,
    ClosedError,
    TidelogError,
    UnknownTopicOrPartitionError,
    error_from_code,
    error_from_rpc,
    is_server_cancelled,
    is_unanswered,
    names_error_code,
)
from tidelog.names import validate_topic_name
from tidelog.request_limits import in_requests_of
from tidelog.v1 import admin_pb2_grpc, cluster_pb2_grpc, log_pb2, log_pb2_grpc

log = logging.getLogger(__name__)


def call_error(exc: grpc.aio.AioRpcError, address: str) -> TidelogError:
    """The error of a failed call that must not be mistaken for a verdict:
    a Tidelog server names its error in the trailing metadata, so a status
    without that name (UNAVAILABLE, or UNKNOWN/INTERNAL raised by gRPC itself
    while a broker dies) is a transport failure, retriable."""
    if names_error_code(exc):
        return error_from_rpc(exc)
    if exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        # CANCELLED: a call the server cancelled (tidelog.errors), retriable.
        return error_from_rpc(exc, address=address)
    return BrokerNotAvailableError(f"{address}: {exc.code().name}: {exc.details()}")


def channel_options(config: CommonConfig) -> list[tuple[str, int | str]]:
    """The gRPC options of every Tidelog client channel."""
    return [
        ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", config.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.primary_user_agent", config.client_id),
        # Reconnect quickly after a broker restart instead of gRPC's default
        # exponential backoff up to 120 s; our own retry loop paces attempts.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2_000),
        *config.grpc_channel_options,
    ]


@dataclass(frozen=True)
class TopicMetadata:
    """One topic as the cache holds it."""

    name: str
    #: Leader broker id per partition (index = partition number); -1: none.
    leaders: tuple[int, ...]
    #: Set when the broker could not describe the topic.
    error: TidelogError | None = None

    @property
    def partition_count(self) -> int:
        return len(self.leaders)


def no_such_partition(topic: str, partition: int, count: int | None) -> TidelogError:
    """The error for a partition the topic does not have."""
    if partition < 0:
        return UnknownTopicOrPartitionError(
            f"partition {partition} of topic {topic!r} does not exist: partitions count from 0"
        )
    return UnknownTopicOrPartitionError(
        f"partition {partition} of topic {topic!r} does not exist: "
        + (f"the topic has partitions 0 to {count - 1}" if count else "the topic has none")
    )


def check_known_partitions(
    snapshot: MetadataSnapshot, partitions: Iterable[tuple[str, int]]
) -> None:
    """Raise for a partition that `snapshot` says does not exist (a negative
    one, or one past its topic's count). Topics it does not know pass: they
    may be being created, and the fetcher waits for them."""
    for topic, partition in partitions:
        count = snapshot.partition_counts.get(topic)
        if partition < 0 or (count is not None and partition >= count):
            raise no_such_partition(topic, partition, count)


@dataclass(frozen=True)
class MetadataSnapshot:
    """The cluster as of one Metadata answer (never mutated)."""

    brokers: dict[int, str] = field(default_factory=dict)
    topics: dict[str, TopicMetadata] = field(default_factory=dict)
    #: time.monotonic() of the answer.
    fetched_at: float = 0.0
    #: Partition count of every topic without error: the producer's per-record
    #: lookup, one dict access.
    partition_counts: dict[str, int] = field(default_factory=dict)

    def partition_count(self, topic: str) -> int | None:
        """Partitions of `topic`, or None when unknown or in error."""
        meta = self.topics.get(topic)
        if meta is None or meta.error is not None or not meta.leaders:
            return None
        return meta.partition_count

    def leader_address(self, topic: str, partition: int) -> str | None:
        meta = self.topics.get(topic)
        if meta is None or not 0 <= partition < len(meta.leaders):
            return None
        return self.brokers.get(meta.leaders[partition])


class Cluster:
    """Channels by broker address plus the metadata cache (see module doc)."""

    def __init__(self, config: CommonConfig, *, allow_auto_topic_creation: bool = False) -> None:
        self._config = config
        self._auto_create = allow_auto_topic_creation
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._options = channel_options(config)
        self.snapshot = MetadataSnapshot()
        #: What each server said of the partitions one request may name.
        self.partition_limits = PartitionLimits()
        # Topics the client cares about: a refresh asks for all of them so
        # that one answer updates every user of the cache.
        self._interest: set[str] = set()
        self._refreshing: asyncio.Future[MetadataSnapshot] | None = None
        self._closed = False
        # time.monotonic() since when no server could be reached (None: the
        # last refresh reached one, answered or not).
        self._unreachable_since: float | None = None

    # ------------------------------------------------------------ channels

    def channel(self, address: str) -> grpc.aio.Channel:
        if self._closed:
            # Not BrokerNotAvailableError: retrying cannot make a closed
            # client reach anything (and retry loops stop at ClosedError).
            raise ClosedError("the client is closed")
        channel = self._channels.get(address)
        if channel is None:
            channel = self._config.security.aio_channel(address, options=self._options)
            self._channels[address] = channel
        return channel

    # The stubs are typed Any: the generated .pyi files describe the
    # synchronous API, while these run on grpc.aio channels (awaitables and
    # stream calls with read/write), which they would mistype.
    def log_stub(self, address: str) -> Any:
        return log_pb2_grpc.LogStub(self.channel(address))

    def admin_stub(self, address: str) -> Any:
        return admin_pb2_grpc.AdminStub(self.channel(address))

    def cluster_stub(self, address: str) -> Any:
        return cluster_pb2_grpc.ClusterStub(self.channel(address))

    def any_address(self) -> Sequence[str]:
        """Addresses to try for a request any broker can answer: known
        brokers first (they answered before), then the bootstrap list."""
        known = list(self.snapshot.brokers.values())
        return known + [a for a in self._config.addresses if a not in known]

    async def close(self) -> None:
        self._closed = True
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(grace=None)

    # ------------------------------------------------------------ metadata

    def add_interest(self, topics: Iterable[str]) -> bool:
        """Remember topics for future refreshes; True if any was new."""
        before = len(self._interest)
        self._interest.update(topics)
        return len(self._interest) != before

    async def refresh(self, topics: Iterable[str] = ()) -> MetadataSnapshot:
        """Fetch metadata for `topics` plus every topic asked for before.

        Concurrent callers share one RPC. Raises BrokerNotAvailableError when
        no server answers.
        """
        if self.add_interest(topics) and self._refreshing is not None:
            # A refresh already running may not include the new topics.
            await asyncio.shield(self._refreshing)
        if self._refreshing is None:
            self._refreshing = asyncio.get_running_loop().create_future()
            task = asyncio.ensure_future(self._refresh_once())
            task.add_done_callback(self._refresh_done)
        return await asyncio.shield(self._refreshing)

    async def all_topics(self) -> dict[str, TopicMetadata]:
        """Every topic the cluster has (a Metadata call naming none), without
        adding them to the topics refreshed later."""
        request = log_pb2.MetadataRequest(topics=[], allow_auto_topic_creation=False)
        timeout_s = self._config.request_timeout_ms / 1000
        last_error: Exception | None = None
        for address in self.any_address():
            try:
                response = await self.log_stub(address).Metadata(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                last_error = error_from_rpc(exc, address=address)
                if is_unanswered(exc):
                    continue
                raise last_error from exc
            return self._snapshot_from(response, address).topics
        raise BrokerNotAvailableError(
            f"no broker answered Metadata at {', '.join(self.any_address())}: {last_error}"
        )

    def _refresh_done(self, task: asyncio.Future[MetadataSnapshot]) -> None:
        waiter, self._refreshing = self._refreshing, None
        assert waiter is not None
        if task.cancelled():
            waiter.cancel()
        elif task.exception() is not None:
            waiter.set_exception(task.exception())  # type: ignore[arg-type]
        else:
            waiter.set_result(task.result())
        # Nobody may be waiting (a cancelled caller): mark it retrieved so
        # asyncio does not log "exception was never retrieved".
        if not waiter.cancelled():
            waiter.exception()

    async def _refresh_once(self) -> MetadataSnapshot:
        topics = sorted(self._interest)
        timeout_s = self._config.request_timeout_ms / 1000
        last_error: Exception | None = None
        reached = False
        for address in self.any_address():
            try:
                response = await self._metadata_of(address, topics, timeout_s)
            except grpc.aio.AioRpcError as exc:
                last_error = error_from_rpc(exc, address=address)
                if is_unanswered(exc):
                    # A server that cancelled the call was reached (busy, or
                    # stopping): callers retry it for their whole timeout.
                    # socket_connection_setup_timeout_ms bounds only the
                    # wait for a server that cannot be reached at all.
                    reached = reached or is_server_cancelled(exc)
                    continue
                raise last_error from exc
            self.snapshot = self._snapshot_from(response, address)
            self._unreachable_since = None
            return self.snapshot
        if reached:
            self._unreachable_since = None
        elif self._unreachable_since is None:
            self._unreachable_since = time.monotonic()
        raise BrokerNotAvailableError(
            f"no broker answered Metadata at {', '.join(self.any_address())}: {last_error}"
        )

    async def _metadata_of(
        self, address: str, topics: Sequence[str], timeout_s: float
    ) -> log_pb2.MetadataResponse:
        """Metadata of `topics` from the server at `address`, as one answer:
        one call, or several when the server takes fewer topics in one (a
        gateway's --max-partitions-per-request, tidelog._partition_limits,
        learned up front or from its refusal of a larger call, which is then
        asked again in pieces; each is smaller, so this ends). Raises the
        call's AioRpcError otherwise."""
        limits = self.partition_limits
        merged: log_pb2.MetadataResponse | None = None
        # No topics is one call too (the brokers' list).
        for piece in in_requests_of(topics, limits.of(address)) if topics else [topics]:
            request = log_pb2.MetadataRequest(
                topics=piece, allow_auto_topic_creation=self._auto_create
            )
            try:
                answer = await self.log_stub(address).Metadata(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                limits.learn_from(address, exc)
                if not limits.refused_for_size(
                    address, error_from_rpc(exc, address=address), len(piece)
                ):
                    raise
                answer = await self._metadata_of(address, piece, timeout_s)
            if merged is None:
                merged = answer
            else:
                merged.topics.extend(answer.topics)
        assert merged is not None
        return merged

    def _snapshot_from(
        self, response: log_pb2.MetadataResponse, answered_by: str
    ) -> MetadataSnapshot:
        brokers: dict[int, str] = {}
        for broker in response.brokers:
            host = broker.host
            # A broker listening on all interfaces may advertise 0.0.0.0 or
            # nothing; the address that reached it is then the best we have.
            if not host or host in ("0.0.0.0", "::", "[::]") or not broker.port:
                brokers[broker.broker_id] = answered_by
            else:
                host = f"[{host}]" if ":" in host and not host.startswith("[") else host
                brokers[broker.broker_id] = f"{host}:{broker.port}"
        topics: dict[str, TopicMetadata] = {}
        for topic in response.topics:
            error = (
                error_from_code(topic.error.code, topic.error.message) if topic.error.code else None
            )
            ordered = sorted(topic.partitions, key=lambda p: p.partition)
            leaders = tuple(p.leader_id if not p.error.code else -1 for p in ordered)
            topics[topic.name] = TopicMetadata(topic.name, leaders, error)
        counts = {
            name: meta.partition_count
            for name, meta in topics.items()
            if meta.error is None and meta.leaders
        }
        return MetadataSnapshot(brokers, topics, time.monotonic(), counts)

    async def check_partitions(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Raise UnknownTopicOrPartitionError for a partition that metadata
        says does not exist, asking for the topics not in the cache first.
        Unknown topics and an unreachable cluster pass (see
        check_known_partitions): the fetcher waits for them."""
        partitions = list(partitions)
        check_known_partitions(self.snapshot, partitions)
        unknown = {t for t, _ in partitions if t not in self.snapshot.partition_counts}
        if unknown:
            try:
                await self.refresh(unknown)
            except TidelogError as exc:
                log.debug("cannot check partitions of %s yet: %s", sorted(unknown), exc)
                return
            check_known_partitions(self.snapshot, partitions)

    def is_stale(self) -> bool:
        age_s = time.monotonic() - self.snapshot.fetched_at
        return age_s * 1000 > self._config.metadata_max_age_ms

    async def topic(self, name: str, *, timeout_s: float) -> TopicMetadata:
        """Metadata of one topic, refreshing (and retrying retriable errors,
        such as a topic being auto-created) until `timeout_s` passes."""
        validate_topic_name(name)  # no broker could ever answer for a bad name
        deadline = time.monotonic() + timeout_s
        backoff_s = self._config.retry_backoff_ms / 1000
        setup_timeout_s = self._config.socket_connection_setup_timeout_ms / 1000
        warned = False
        while True:
            meta = self.snapshot.topics.get(name)
            if meta is not None and meta.error is None and meta.leaders:
                return meta
            try:
                snapshot = await self.refresh([name])
                meta = snapshot.topics.get(name)
                if meta is not None and meta.error is None and meta.leaders:
                    return meta
                error: TidelogError = (
                    meta.error
                    if meta is not None and meta.error is not None
                    else BrokerNotAvailableError(f"no metadata for topic {name!r}")
                )
            except TidelogError as exc:
                error = exc
            if not error.retriable or time.monotonic() + backoff_s > deadline:
                raise error
            unreachable_since = self._unreachable_since
            if unreachable_since is not None:
                if time.monotonic() - unreachable_since >= setup_timeout_s:
                    raise BrokerNotAvailableError(
                        f"{error.message} (for socket_connection_setup_timeout_ms="
                        f"{self._config.socket_connection_setup_timeout_ms})"
                    )
                if not warned:
                    warned = True
                    log.warning(
                        "%s; retrying for up to socket_connection_setup_timeout_ms (%d)",
                        error.message,
                        self._config.socket_connection_setup_timeout_ms,
                    )
            await asyncio.sleep(backoff_s)
