"""The broker's Prometheus metrics (served with `--metrics-port`).

Counted on the request paths (cheap: one cached child per topic, two
increments per partition of a request, never per record):
- `tidelog_broker_produce_requests_total{topic}`: partitions appended by
  Produce requests (a request of three partitions counts three);
- `tidelog_broker_produce_bytes_total{topic}`: record batch bytes appended;
- `tidelog_broker_produce_errors_total`: partitions of Produce requests that
  failed (no topic label: a client can name any topic);
- `tidelog_broker_produce_duration_seconds{acks}`: from a Produce request's
  arrival to its answer (acks=all includes the wait for the ISR);
- `tidelog_broker_fetch_responses_total{topic}` and
  `tidelog_broker_fetch_bytes_total{topic}`: partitions and record bytes sent
  to consumers (replication traffic is not counted here);
- `tidelog_broker_isr_shrinks_total`, `tidelog_broker_isr_expands_total`:
  ISR changes of partitions this broker leads.

Read from the broker's state at scrape time (on its event loop):
- per partition hosted: `tidelog_broker_log_size_bytes`,
  `tidelog_broker_log_start_offset`, `tidelog_broker_log_end_offset`,
  `tidelog_broker_high_watermark`;
- `tidelog_broker_partitions`, `tidelog_broker_leader_partitions`,
  `tidelog_broker_under_replicated_partitions` (led here, ISR smaller than
  the replicas), `tidelog_broker_under_min_isr_partitions`.
Plus the generic `tidelog_rpc_*` of every service (tidelog_server.metrics).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from tidelog_server.metrics import LATENCY_BUCKETS_S, LoopCollector, RpcMetrics

from tidelog_broker.partition_manager import PartitionManager


class BrokerMetrics:
    """Every metric of one broker, on a registry of its own. Counters are
    fed by the servicers; gauges are read from `manager` when scraped."""

    def __init__(self, broker_id: int, registry: CollectorRegistry | None = None) -> None:
        self.broker_id = broker_id
        self.registry = registry or CollectorRegistry()
        self.rpc = RpcMetrics(self.registry)
        r = self.registry
        self._produce_requests = Counter(
            "tidelog_broker_produce_requests",
            "Partitions appended by Produce requests",
            ["topic"],
            registry=r,
        )
        self._produce_bytes = Counter(
            "tidelog_broker_produce_bytes",
            "Record batch bytes appended by Produce requests",
            ["topic"],
            registry=r,
        )
        self.produce_errors = Counter(
            "tidelog_broker_produce_errors",
            "Partitions of Produce requests that were refused or failed",
            registry=r,
        )
        duration = Histogram(
            "tidelog_broker_produce_duration_seconds",
            "From a Produce request's arrival to its answer",
            ["acks"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        #: acks value (-1, 1) -> histogram child (acks=0 has no answer).
        self.produce_duration = {-1: duration.labels("all"), 1: duration.labels("1")}
        self._fetch_responses = Counter(
            "tidelog_broker_fetch_responses",
            "Partitions with records sent to consumers",
            ["topic"],
            registry=r,
        )
        self._fetch_bytes = Counter(
            "tidelog_broker_fetch_bytes",
            "Record batch bytes sent to consumers",
            ["topic"],
            registry=r,
        )
        self.isr_shrinks = Counter(
            "tidelog_broker_isr_shrinks", "ISR shrinks of partitions led here", registry=r
        )
        self.isr_expands = Counter(
            "tidelog_broker_isr_expands", "ISR expansions of partitions led here", registry=r
        )
        # topic -> (requests child, bytes child): labels() hashes and locks,
        # so it runs once per topic, not once per request.
        self._produce_children: dict[str, tuple[Any, Any]] = {}
        self._fetch_children: dict[str, tuple[Any, Any]] = {}

    def produced(self, topic: str, size: int) -> None:
        """One partition of a Produce request appended `size` bytes."""
        children = self._produce_children.get(topic)
        if children is None:
            children = self._produce_children[topic] = (
                self._produce_requests.labels(topic),
                self._produce_bytes.labels(topic),
            )
        children[0].inc()
        children[1].inc(size)

    def fetched(self, topic: str, size: int) -> None:
        """One partition of a Fetch response carried `size` record bytes."""
        children = self._fetch_children.get(topic)
        if children is None:
            children = self._fetch_children[topic] = (
                self._fetch_responses.labels(topic),
                self._fetch_bytes.labels(topic),
            )
        children[0].inc()
        children[1].inc(size)

    def watch(self, manager: PartitionManager, loop: asyncio.AbstractEventLoop) -> None:
        """Read `manager`'s partitions at every scrape, on `loop`."""
        manager.replicas.on_isr_change = self._on_isr_change
        self.registry.register(LoopCollector(loop, lambda: self._partitions(manager)))

    def _on_isr_change(self, old: list[int], new: list[int]) -> None:
        if len(new) < len(old):
            self.isr_shrinks.inc()
        elif len(new) > len(old):
            self.isr_expands.inc()

    def _partitions(self, manager: PartitionManager) -> Iterable[Metric]:
        labels = ["topic", "partition"]
        size = GaugeMetricFamily(
            "tidelog_broker_log_size_bytes", "Bytes on disk of a partition's log", labels=labels
        )
        start = GaugeMetricFamily(
            "tidelog_broker_log_start_offset", "A partition's first offset", labels=labels
        )
        end = GaugeMetricFamily(
            "tidelog_broker_log_end_offset",
            "A partition's log end offset (the next offset to be written)",
            labels=labels,
        )
        hw = GaugeMetricFamily(
            "tidelog_broker_high_watermark",
            "Consumers read up to here (every in-sync replica has it)",
            labels=labels,
        )
        hosted = leaders = under_replicated = under_min_isr = 0
        for partition_log, replication, min_isr in manager.hosted_partitions():
            key = [partition_log.topic, str(partition_log.partition)]
            hosted += 1
            size.add_metric(key, partition_log.size_bytes)
            start.add_metric(key, partition_log.log_start_offset)
            end.add_metric(key, partition_log.log_end_offset)
            hw.add_metric(key, manager.high_watermark(partition_log))
            if replication is None:
                leaders += 1  # standalone: this broker leads every partition
                continue
            if replication.is_leader:
                leaders += 1
                if len(replication.isr) < len(replication.replicas):
                    under_replicated += 1
                if len(replication.isr) < min_isr:
                    under_min_isr += 1
        yield from (size, start, end, hw)
        for name, doc, value in (
            ("tidelog_broker_partitions", "Partition replicas hosted here", hosted),
            ("tidelog_broker_leader_partitions", "Partitions led by this broker", leaders),
            (
                "tidelog_broker_under_replicated_partitions",
                "Partitions led here whose ISR is smaller than their replicas",
                under_replicated,
            ),
            (
                "tidelog_broker_under_min_isr_partitions",
                "Partitions led here whose ISR is below min.insync.replicas",
                under_min_isr,
            ),
        ):
            family = GaugeMetricFamily(name, doc, labels=["broker_id"])
            family.add_metric([str(self.broker_id)], value)
            yield family
