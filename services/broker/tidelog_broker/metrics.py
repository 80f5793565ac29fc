"""The broker's Prometheus metrics (served with `--metrics-port`).

Counted on the request paths (cheap: two int increments per partition of a
request, never per record; exposed at scrape time):
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
  the replicas), `tidelog_broker_under_min_isr_partitions`,
  `tidelog_broker_offline_partitions` (logs a storage failure took offline,
  `PartitionLog.offline`: not served until the broker restarts; their
  per-partition gauges are left out, their offsets being a half-done reset).
Plus the generic `tidelog_rpc_*` of every service (tidelog_server.metrics).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from tidelog_server.metrics import LoopCollector, LoopHistogram, RpcMetrics, histogram_family

from tidelog_broker.partition_manager import PartitionManager


class _TopicCounters:
    """Plain ints, bumped on the event loop and read on it at scrape time
    (LoopCollector): no lock on the request path."""

    __slots__ = ("fetch_bytes", "fetch_responses", "produce_bytes", "produce_requests")

    def __init__(self) -> None:
        self.produce_requests = 0
        self.produce_bytes = 0
        self.fetch_responses = 0
        self.fetch_bytes = 0


class BrokerMetrics:
    """Every metric of one broker, on a registry of its own. Counters are
    fed by the servicers; gauges are read from `manager` when scraped.

    The per-topic counters are plain ints in a dict, exposed at scrape time,
    rather than prometheus-client children: measured here, two increments of
    cached children cost ~10x two attribute increments (each child takes a
    lock), and the broker runs them on every partition of every request."""

    def __init__(self, broker_id: int, registry: CollectorRegistry | None = None) -> None:
        self.broker_id = broker_id
        self.registry = registry or CollectorRegistry()
        self.rpc = RpcMetrics(self.registry)
        #: acks value (-1, 1) -> histogram (acks=0 has no answer).
        self.produce_duration = {-1: LoopHistogram(), 1: LoopHistogram()}
        self.topics: dict[str, _TopicCounters] = {}
        self.produce_errors = 0
        self.isr_shrinks = 0
        self.isr_expands = 0

    def produced(self, topic: str, size: int) -> None:
        """One partition of a Produce request appended `size` bytes."""
        counters = self.topics.get(topic)
        if counters is None:
            counters = self.topics[topic] = _TopicCounters()
        counters.produce_requests += 1
        counters.produce_bytes += size

    def fetched(self, topic: str, size: int) -> None:
        """One partition of a Fetch response carried `size` record bytes."""
        counters = self.topics.get(topic)
        if counters is None:
            counters = self.topics[topic] = _TopicCounters()
        counters.fetch_responses += 1
        counters.fetch_bytes += size

    def watch(self, manager: PartitionManager, loop: asyncio.AbstractEventLoop) -> None:
        """Read `manager`'s partitions at every scrape, on `loop`."""
        manager.replicas.on_isr_change = self._on_isr_change
        self.registry.register(LoopCollector(loop, lambda: self._partitions(manager)))

    def _on_isr_change(self, old: list[int], new: list[int]) -> None:
        if len(new) < len(old):
            self.isr_shrinks += 1
        elif len(new) > len(old):
            self.isr_expands += 1

    def _counters(self) -> Iterable[Metric]:
        families = {
            field: CounterMetricFamily(name, doc, labels=["topic"])
            for field, name, doc in (
                (
                    "produce_requests",
                    "tidelog_broker_produce_requests",
                    "Partitions appended by Produce requests",
                ),
                (
                    "produce_bytes",
                    "tidelog_broker_produce_bytes",
                    "Record batch bytes appended by Produce requests",
                ),
                (
                    "fetch_responses",
                    "tidelog_broker_fetch_responses",
                    "Partitions with records sent to consumers",
                ),
                (
                    "fetch_bytes",
                    "tidelog_broker_fetch_bytes",
                    "Record batch bytes sent to consumers",
                ),
            )
        }
        for topic, counters in self.topics.items():
            for field, family in families.items():
                family.add_metric([topic], getattr(counters, field))
        yield from families.values()
        for name, doc, value in (
            (
                "tidelog_broker_produce_errors",
                "Partitions of Produce requests that were refused or failed",
                self.produce_errors,
            ),
            ("tidelog_broker_isr_shrinks", "ISR shrinks of partitions led here", self.isr_shrinks),
            (
                "tidelog_broker_isr_expands",
                "ISR expansions of partitions led here",
                self.isr_expands,
            ),
        ):
            family = CounterMetricFamily(name, doc)
            family.add_metric([], value)
            yield family

    def _partitions(self, manager: PartitionManager) -> Iterable[Metric]:
        yield from self._counters()
        yield histogram_family(
            "tidelog_broker_produce_duration_seconds",
            "From a Produce request's arrival to its answer",
            ["acks"],
            {("all",): self.produce_duration[-1], ("1",): self.produce_duration[1]},
        )
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
        hosted = leaders = under_replicated = under_min_isr = offline = 0
        for partition_log, replication, min_isr in manager.hosted_partitions():
            key = [partition_log.topic, str(partition_log.partition)]
            hosted += 1
            if partition_log.offline is not None:
                offline += 1
                continue
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
            (
                "tidelog_broker_offline_partitions",
                "Partition replicas whose log a storage failure took offline until a restart",
                offline,
            ),
        ):
            family = GaugeMetricFamily(name, doc, labels=["broker_id"])
            family.add_metric([str(self.broker_id)], value)
            yield family
