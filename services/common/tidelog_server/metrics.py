"""What every service's Prometheus metrics share: the HTTP endpoint on a port
of its own, the gRPC interceptor that counts and times calls, and the bridge
that reads a service's state on its event loop at scrape time.

Each service builds its metrics in its own `metrics.py` on a
`CollectorRegistry` of its own (not prometheus-client's global one), so that
several services can live in one test process. Nothing here runs unless the
service was started with `--metrics-port`: without it no interceptor is
installed and no thread is started.

Naming follows Prometheus' conventions: a `tidelog_` prefix, the unit last
(`_seconds`, `_bytes`), `_total` on counters (prometheus-client appends it).

Threads: prometheus-client serves scrapes from its own thread. Counters and
histograms are thread-safe; state that lives on the event loop (partition
logs, groups) is read by `LoopCollector`, which runs the read on the loop and
waits for it, so no dict is iterated while the loop changes it.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import concurrent.futures
import contextlib
import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

log = logging.getLogger("tidelog.metrics")

#: Latency buckets (seconds) for gRPC calls: loopback calls take ~0.5 ms,
#: acks=all produce and etcd writes tens of ms, a long-poll up to seconds.
LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

#: How long a scrape waits for the event loop to take its snapshot: a loop
#: busier than this gets a scrape without those series, not a hung scraper.
SNAPSHOT_TIMEOUT_S = 5.0


def add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    """`--metrics-port` (and `--metrics-host`) on a service's command line."""
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (0: a free port, printed "
        "in the log; default: no metrics endpoint)",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the metrics endpoint binds to (default %(default)s)",
    )


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is out of range: use 0-65535")
    return port


@dataclass(frozen=True)
class MetricsOptions:
    """Where a service serves its metrics (port 0: a free one)."""

    host: str
    port: int


def metrics_options(args: argparse.Namespace) -> MetricsOptions | None:
    """The options add_metrics_arguments parsed; None without --metrics-port."""
    if args.metrics_port is None:
        return None
    return MetricsOptions(args.metrics_host, args.metrics_port)


class MetricsEndpoint:
    """prometheus-client's HTTP server for one registry, in a daemon thread."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"--metrics-port must be 0-65535, got {port}")
        # The *_created series double every counter for no use here.
        disable_created_metrics()
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot serve metrics on {host}:{port} (--metrics-port): {exc.strerror}"
            ) from None
        self.host = host
        self.port: int = self._server.server_port
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class LoopCollector(Collector):
    """A collector whose metrics are built on the service's event loop.

    `snapshot` runs on `loop` (scheduled from the scrape thread) and returns
    finished metric families; it must not block. When the loop is closed or
    does not answer within SNAPSHOT_TIMEOUT_S, the scrape gets none of them.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, snapshot: Callable[[], Iterable[Metric]]
    ) -> None:
        self._loop = loop
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        if threading.get_ident() == getattr(self._loop, "_thread_id", None):
            return list(self._snapshot())  # called on the loop itself (tests)
        done: concurrent.futures.Future[list[Metric]] = concurrent.futures.Future()

        def take() -> None:
            try:
                done.set_result(list(self._snapshot()))
            except BaseException as exc:
                done.set_exception(exc)

        try:
            self._loop.call_soon_threadsafe(take)
            return done.result(SNAPSHOT_TIMEOUT_S)
        except RuntimeError:
            return []  # the loop is closed: the service is stopping
        except concurrent.futures.TimeoutError:
            log.warning("metrics: the event loop did not answer in %s s", SNAPSHOT_TIMEOUT_S)
            return []

    def describe(self) -> Iterable[Metric]:
        # Describing would run the snapshot at registration, off the loop.
        return []


class LoopHistogram:
    """A histogram for one event loop's hot path: bisect and two additions,
    no lock (prometheus-client's Histogram takes one per observation:
    measured ~10x the cost). Observed and read on the same loop; exposed by
    a LoopCollector through `family`."""

    __slots__ = ("_buckets", "_counts", "_sum")

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self._buckets = buckets
        # One count per bucket, and one past the last (+Inf).
        self._counts = [0] * (len(buckets) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._buckets, value)] += 1
        self._sum += value

    def samples(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative (le, count) pairs, +Inf last, and the sum."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self._buckets, float("inf")), self._counts, strict=True):
            running += count
            out.append((floatToGoString(bound), running))
        return out, self._sum


def histogram_family(
    name: str, doc: str, label_names: list[str], children: dict[tuple[str, ...], LoopHistogram]
) -> HistogramMetricFamily:
    """The exposition of LoopHistograms, one per label values."""
    family = HistogramMetricFamily(name, doc, labels=label_names)
    for values, histogram in children.items():
        buckets, total = histogram.samples()
        family.add_metric(list(values), buckets, total)
    return family


class RpcMetrics:
    """Calls, latency and open streams per gRPC method, for one service.

    `tidelog_rpc_requests_total{method}`: calls started (a stream counts once);
    `tidelog_rpc_duration_seconds{method}`: latency of unary calls;
    `tidelog_rpc_active_streams{method}`: streaming calls open now.
    The interceptor caches its wrapped handler per method, so the labels
    lookup runs once per method, not once per call.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "tidelog_rpc_requests", "gRPC calls started, by method", ["method"], registry=registry
        )
        self.duration = Histogram(
            "tidelog_rpc_duration_seconds",
            "Latency of unary gRPC calls, from the handler's start to its answer",
            ["method"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.active_streams = Gauge(
            "tidelog_rpc_active_streams",
            "Streaming gRPC calls open now, by method",
            ["method"],
            registry=registry,
        )

    def unary(self, method: str) -> tuple[Any, Any]:
        """The (requests, duration) children of a unary method."""
        return self.requests.labels(method), self.duration.labels(method)

    def streaming(self, method: str) -> tuple[Any, Any]:
        """The (requests, active streams) children of a streaming method."""
        return self.requests.labels(method), self.active_streams.labels(method)

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        return _RpcInterceptor(self)


class _RpcInterceptor(grpc.aio.ServerInterceptor):
    """Wraps each handler of a grpc.aio server to feed RpcMetrics."""

    def __init__(self, metrics: RpcMetrics) -> None:
        self._metrics = metrics
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith("/grpc."):
            # Unknown methods stay unlabelled (a client picks the name:
            # bounded cardinality); health and reflection are not ours.
            return handler
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            wrapped = self._wrapped[method] = _wrap(handler, method, self._metrics)
        return wrapped


def _wrap(handler: grpc.RpcMethodHandler, method: str, metrics: RpcMetrics) -> Any:
    """The same handler, counted and timed (a handler of a shape not served
    here, such as one that writes with context.write, is returned as is)."""
    if handler.unary_unary is not None:
        behaviour: Any = handler.unary_unary
        requests, duration = metrics.unary(method)

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            requests.inc()
            start = time.perf_counter()
            try:
                return await behaviour(request, context)
            finally:
                duration.observe(time.perf_counter() - start)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    streaming: Any = handler.stream_stream or handler.unary_stream
    if streaming is None or not inspect.isasyncgenfunction(streaming):
        return handler
    requests, active = metrics.streaming(method)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        requests.inc()
        active.inc()
        try:
            # aclosing: the handler's own finally blocks (budgets, sessions)
            # run when the call ends, not when the generator is collected.
            async with contextlib.aclosing(streaming(request, context)) as responses:
                async for response in responses:
                    yield response
        finally:
            active.dec()

    make = (
        grpc.stream_stream_rpc_method_handler
        if handler.stream_stream is not None
        else grpc.unary_stream_rpc_method_handler
    )
    return make(
        stream,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
