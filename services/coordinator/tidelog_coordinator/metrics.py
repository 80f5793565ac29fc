"""The coordinator's Prometheus metrics (served with `--metrics-port`).

Every replica:
- `tidelog_coordinator_active_controller`: 1 on the replica that is the
  controller now, else 0 (summed over replicas: exactly 1 when healthy);
- `tidelog_group_members{group}`: members of each group, from the replica's
  watch cache of etcd;
- `tidelog_group_rebalances_total{group}`: new generations of a group
  written by this replica (sum over replicas for the group's total).

The active controller only (the others serve none of these, so that sums
over replicas are right), refreshed every `--metrics-interval-ms` from etcd
and from the partition leaders:
- `tidelog_cluster_brokers`: live brokers;
- `tidelog_cluster_partitions`, `tidelog_cluster_under_replicated_partitions`
  (ISR smaller than the replicas), `tidelog_cluster_under_min_isr_partitions`,
  `tidelog_cluster_offline_partitions` (no live leader);
- `tidelog_cluster_offline_replicas`: replicas that cannot serve (served by
  the active controller only, as the partition gauges), as DescribeTopics
  reports them (Kafka's offline replicas): their broker is not
  registered (dead, or never was), or it lists their log offline (a storage
  failure). Counted from the refresh's DescribeTopics read, so it costs no
  read of its own: one read of the broker registrations per refresh serves
  every partition;
- `tidelog_cluster_partition_leaders{broker_id}`: partitions each broker leads;
- `tidelog_group_committed_offset{group,topic,partition}` and
  `tidelog_group_lag_records{group,topic,partition}`: the partition's high
  watermark (ListOffsets latest, asked of its leader) minus the group's
  committed offset, as `kafka-consumer-groups --describe` computes it.
  At most LAG_SERIES_MAX partitions; the rest are left out and the log says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aetcd
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from tidelog.request_limits import MAX_LIST_OFFSETS_ENTRIES, in_requests_of
from tidelog.security import PLAINTEXT, ChannelSecurity
from tidelog.types import TopicPartition
from tidelog.v1 import log_pb2, log_pb2_grpc
from tidelog_server.cancellation import raise_if_cancelling
from tidelog_server.etcd import is_unavailable
from tidelog_server.etcd.keys import Keys
from tidelog_server.forwarding import ChannelPool
from tidelog_server.log_flood import RateLimitedLog
from tidelog_server.metrics import LoopCollector, RpcMetrics

from tidelog_coordinator.group_state import GroupCache
from tidelog_coordinator.metadata import MetadataManager, TopicRecord

log = logging.getLogger("tidelog.coordinator.metrics")
flood = RateLimitedLog(log)

#: Partitions of committed offsets reported with a lag (a client can create
#: groups and commit: the series a scrape returns are bounded).
LAG_SERIES_MAX = 10_000
#: How long one ListOffsets to a leader may take before its partitions are
#: left out of this round.
LIST_OFFSETS_TIMEOUT_S = 5.0


@dataclass
class ClusterSnapshot:
    """What the controller's last refresh found."""

    brokers: int = 0
    partitions: int = 0
    under_replicated: int = 0
    under_min_isr: int = 0
    offline: int = 0
    #: Replicas reported offline (MetadataManager.describe_topics).
    offline_replicas: int = 0
    leaders: dict[int, int] = field(default_factory=dict)
    #: (group, partition) -> (committed offset, lag or None when the high
    #: watermark is unknown).
    offsets: dict[tuple[str, TopicPartition], tuple[int, int | None]] = field(default_factory=dict)


class CoordinatorMetrics:
    """Every metric of one coordinator replica, on a registry of its own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.rpc = RpcMetrics(self.registry)
        self._rebalances = Counter(
            "tidelog_group_rebalances",
            "New generations of a consumer group written by this replica",
            ["group"],
            registry=self.registry,
        )
        #: None until this replica, as controller, has refreshed once.
        self.snapshot: ClusterSnapshot | None = None
        self._is_controller: Callable[[], bool] = lambda: False
        self._cache: GroupCache | None = None

    def rebalanced(self, group_id: str) -> None:
        self._rebalances.labels(group_id).inc()

    def watch(
        self,
        loop: asyncio.AbstractEventLoop,
        is_controller: Callable[[], bool],
        cache: GroupCache,
    ) -> None:
        """Read the replica's state at every scrape, on `loop`."""
        self._is_controller = is_controller
        self._cache = cache
        self.registry.register(LoopCollector(loop, self._collect))

    def _collect(self) -> Iterable[Metric]:
        controller = self._is_controller()
        active = GaugeMetricFamily(
            "tidelog_coordinator_active_controller",
            "1 on the replica that is the controller now, else 0",
        )
        active.add_metric([], 1 if controller else 0)
        yield active
        members = GaugeMetricFamily(
            "tidelog_group_members", "Members of a consumer group", labels=["group"]
        )
        if self._cache is not None:
            for group_id, view in self._cache.groups.items():
                members.add_metric([group_id], len(view.members))
        yield members
        snapshot = self.snapshot
        if not controller or snapshot is None:
            return
        for name, doc, value in (
            ("tidelog_cluster_brokers", "Live brokers", snapshot.brokers),
            ("tidelog_cluster_partitions", "Partitions of every topic", snapshot.partitions),
            (
                "tidelog_cluster_under_replicated_partitions",
                "Partitions whose ISR is smaller than their replicas",
                snapshot.under_replicated,
            ),
            (
                "tidelog_cluster_under_min_isr_partitions",
                "Partitions whose ISR is below min.insync.replicas (acks=all refused)",
                snapshot.under_min_isr,
            ),
            (
                "tidelog_cluster_offline_partitions",
                "Partitions without a live leader (neither readable nor writable)",
                snapshot.offline,
            ),
            (
                "tidelog_cluster_offline_replicas",
                "Replicas that cannot serve: their broker is not registered, "
                "or its registration lists their log offline",
                snapshot.offline_replicas,
            ),
        ):
            family = GaugeMetricFamily(name, doc)
            family.add_metric([], value)
            yield family
        leaders = GaugeMetricFamily(
            "tidelog_cluster_partition_leaders",
            "Partitions each broker leads",
            labels=["broker_id"],
        )
        for broker_id, count in sorted(snapshot.leaders.items()):
            leaders.add_metric([str(broker_id)], count)
        yield leaders
        labels = ["group", "topic", "partition"]
        committed = GaugeMetricFamily(
            "tidelog_group_committed_offset", "A group's committed offset", labels=labels
        )
        lag = GaugeMetricFamily(
            "tidelog_group_lag_records",
            "Records between a group's committed offset and the partition's high watermark",
            labels=labels,
        )
        for (group_id, tp), (offset, behind) in snapshot.offsets.items():
            key = [group_id, tp.topic, str(tp.partition)]
            committed.add_metric(key, offset)
            if behind is not None:
                lag.add_metric(key, behind)
        yield committed
        yield lag


class ClusterProbe:
    """The controller's periodic look at the cluster for CoordinatorMetrics:
    partition states and brokers from etcd, high watermarks from leaders."""

    def __init__(
        self,
        metrics: CoordinatorMetrics,
        client: aetcd.Client,
        keys: Keys,
        metadata: MetadataManager,
        is_controller: Callable[[], bool],
        interval_ms: int,
        security: ChannelSecurity = PLAINTEXT,
    ) -> None:
        self._metrics = metrics
        self._client = client
        self._keys = keys
        self._metadata = metadata
        self._is_controller = is_controller
        self._interval_s = max(0.1, interval_ms / 1000)
        # As BrokerCalls': the coordinator's own TLS identity with TLS on.
        self._channels = ChannelPool(security)

    async def run(self) -> None:
        try:
            while True:
                if self._is_controller():
                    try:
                        self._metrics.snapshot = await self.refresh()
                    except Exception as exc:
                        raise_if_cancelling(exc)
                        level = logging.INFO if is_unavailable(exc) else logging.WARNING
                        flood.log(level, "metrics: refreshing the cluster view failed: %s", exc)
                else:
                    self._metrics.snapshot = None
                await asyncio.sleep(self._interval_s)
        finally:
            await self._channels.close()

    async def refresh(self) -> ClusterSnapshot:
        brokers = {b.broker_id: f"{b.host}:{b.port}" for b in await self._metadata.live_brokers()}
        topics = [
            t for t in await self._metadata.describe_topics([]) if not isinstance(t, Exception)
        ]
        snapshot = ClusterSnapshot(brokers=len(brokers))
        leader_of: dict[TopicPartition, int] = {}
        for topic in topics:
            assert isinstance(topic, TopicRecord)
            min_isr = int(
                self._metadata.effective_configs(topic.configs).get("min.insync.replicas", "1")
            )
            for part in topic.partitions:
                snapshot.partitions += 1
                if part.leader < 0 or part.leader not in brokers:
                    snapshot.offline += 1
                else:
                    leader_of[TopicPartition(topic.name, part.partition)] = part.leader
                    snapshot.leaders[part.leader] = snapshot.leaders.get(part.leader, 0) + 1
                if len(part.isr) < len(part.replicas):
                    snapshot.under_replicated += 1
                if len(part.isr) < min_isr:
                    snapshot.under_min_isr += 1
                snapshot.offline_replicas += len(part.offline)
        committed = await self._committed_offsets()
        watermarks = await self._high_watermarks({tp for _, tp in committed}, leader_of, brokers)
        for (group_id, tp), offset in committed.items():
            hw = watermarks.get(tp)
            snapshot.offsets[(group_id, tp)] = (offset, None if hw is None else max(0, hw - offset))
        return snapshot

    async def _committed_offsets(self) -> dict[tuple[str, TopicPartition], int]:
        found: dict[tuple[str, TopicPartition], int] = {}
        for kv in await self._client.get_prefix(self._keys.all_offsets):
            parsed = self._keys.parse_offset_key(kv.key)
            if parsed is None:
                continue
            if len(found) >= LAG_SERIES_MAX:
                flood.warning(
                    "metrics: more than %d committed partitions; the rest have no lag series",
                    LAG_SERIES_MAX,
                )
                break
            with contextlib.suppress(ValueError, KeyError, TypeError):
                found[parsed] = int(json.loads(kv.value)["offset"])
        return found

    async def _high_watermarks(
        self,
        wanted: set[TopicPartition],
        leader_of: dict[TopicPartition, int],
        brokers: dict[int, str],
    ) -> dict[TopicPartition, int]:
        """ListOffsets latest of each wanted partition, asked of its leader
        in requests of at most MAX_LIST_OFFSETS_ENTRIES (the brokers' limit)."""
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in wanted:
            leader = leader_of.get(tp)
            if leader is not None:
                by_leader.setdefault(leader, []).append(tp)

        async def ask(broker_id: int, tps: Sequence[TopicPartition]) -> list[Any]:
            stub = log_pb2_grpc.LogStub(self._channels.channel(brokers[broker_id]))
            request = log_pb2.ListOffsetsRequest()
            for tp in tps:
                request.partitions.add(topic=tp.topic, partition=tp.partition, timestamp_ms=-1)
            response = await stub.ListOffsets(request, timeout=LIST_OFFSETS_TIMEOUT_S)
            return list(response.partitions)

        answers = await asyncio.gather(
            *(
                ask(b, piece)
                for b, tps in by_leader.items()
                for piece in in_requests_of(tps, MAX_LIST_OFFSETS_ENTRIES)
            ),
            return_exceptions=True,
        )
        watermarks: dict[TopicPartition, int] = {}
        for answer in answers:
            if isinstance(answer, BaseException):
                flood.log(logging.INFO, "metrics: ListOffsets to a leader failed: %s", answer)
                continue
            for result in answer:
                if not result.HasField("error") and result.offset >= 0:
                    watermarks[TopicPartition(result.topic, result.partition)] = result.offset
        return watermarks
