"""The gateway's Prometheus metrics (served with `--metrics-port`).

- `tidelog_rpc_requests_total{method}`, `tidelog_rpc_duration_seconds{method}`
  (unary calls) and `tidelog_rpc_active_streams{method}`: every call the
  gateway serves, by method (tidelog_server.metrics);
- `tidelog_gateway_streams` and `tidelog_gateway_streams_max`: streams open
  now against `--max-streams` (a client past the limit is refused).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from tidelog_server.metrics import LoopCollector, RpcMetrics

from tidelog_gateway.limits import StreamCounter


class GatewayMetrics:
    """Every metric of one gateway, on a registry of its own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.rpc = RpcMetrics(self.registry)

    def watch(self, streams: StreamCounter, loop: asyncio.AbstractEventLoop) -> None:
        """Read the stream counter at every scrape, on `loop`."""

        def collect() -> Iterable[Metric]:
            open_now = GaugeMetricFamily("tidelog_gateway_streams", "Streams open now")
            open_now.add_metric([], streams.open)
            limit = GaugeMetricFamily("tidelog_gateway_streams_max", "The --max-streams limit")
            limit.add_metric([], streams.max_streams)
            return [open_now, limit]

        self.registry.register(LoopCollector(loop, collect))
