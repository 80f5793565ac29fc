"""The metrics plumbing every service shares: the lock-free histogram of the
hot paths, the collector that reads state on the event loop, and the
interceptor that counts and times gRPC calls."""

from __future__ import annotations

import asyncio

import grpc
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from tidelog_server.metrics import LoopCollector, LoopHistogram, RpcMetrics, histogram_family


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_loop_histogram_buckets_are_cumulative_and_inclusive() -> None:
    histogram = LoopHistogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 7.0):
        histogram.observe(value)
    buckets, total = histogram.samples()
    assert buckets == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert total == 7.65
    family = histogram_family("x_seconds", "doc", ["acks"], {("all",): histogram})
    names = {s.name for s in family.samples}
    assert names == {"x_seconds_bucket", "x_seconds_count", "x_seconds_sum"}


def test_loop_collector_reads_on_the_loop_from_the_scrape_thread() -> None:
    async def main() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        loop = asyncio.get_running_loop()
        seen_threads: list[object] = []

        def snapshot() -> list[GaugeMetricFamily]:
            seen_threads.append(asyncio.get_running_loop())
            family = GaugeMetricFamily("tidelog_test_value", "doc")
            family.add_metric([], 42)
            return [family]

        registry = CollectorRegistry()
        registry.register(LoopCollector(loop, snapshot))
        # Scrapes come from prometheus-client's HTTP thread.
        found = await asyncio.to_thread(samples, registry)
        assert seen_threads == [loop]
        return found

    found = asyncio.run(main())
    assert found[("tidelog_test_value", frozenset())] == 42


def test_a_closed_loop_gives_an_empty_scrape_not_a_hang() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    registry = CollectorRegistry()
    registry.register(LoopCollector(loop, lambda: [GaugeMetricFamily("never", "doc")]))
    assert not any(name == "never" for name, _ in samples(registry))


class _Echo:
    async def unary(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def stream(self, requests: object, context: grpc.aio.ServicerContext) -> object:
        async for request in requests:  # type: ignore[attr-defined]
            yield request


def test_the_interceptor_counts_times_and_tracks_streams() -> None:
    registry = CollectorRegistry()
    metrics = RpcMetrics(registry)

    async def main() -> None:
        echo = _Echo()
        server = grpc.aio.server(interceptors=[metrics.interceptor()])
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "test.Echo",
                    {
                        "Unary": grpc.unary_unary_rpc_method_handler(echo.unary),
                        "Stream": grpc.stream_stream_rpc_method_handler(echo.stream),
                    },
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                unary = channel.unary_unary("/test.Echo/Unary")
                assert await unary(b"hi", timeout=10) == b"hi"
                assert await unary(b"again", timeout=10) == b"again"
                stream = channel.stream_stream("/test.Echo/Stream")(timeout=10)
                await stream.write(b"one")
                assert await stream.read() == b"one"
                open_now = samples(registry)
                key = ("tidelog_rpc_active_streams", frozenset({("method", "/test.Echo/Stream")}))
                assert open_now[key] == 1
                await stream.done_writing()
                assert await stream.read() == grpc.aio.EOF  # type: ignore[attr-defined]
        finally:
            await server.stop(None)

    asyncio.run(main())
    found = samples(registry)
    unary = frozenset({("method", "/test.Echo/Unary")})
    stream = frozenset({("method", "/test.Echo/Stream")})
    assert found[("tidelog_rpc_requests_total", unary)] == 2
    assert found[("tidelog_rpc_duration_seconds_count", unary)] == 2
    assert found[("tidelog_rpc_requests_total", stream)] == 1
    assert found[("tidelog_rpc_active_streams", stream)] == 0
