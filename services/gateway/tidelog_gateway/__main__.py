"""`tidelog-gateway`: run one gateway until SIGTERM or SIGINT."""

from __future__ import annotations

# Before anything that imports gRPC: it reads its transport settings once, when first imported.
from tidelog_server import grpc_transport  # noqa: F401  isort: skip

import argparse
import asyncio
import logging
import sys

from tidelog_server.etcd.client import EtcdEndpointError, parse_endpoints
from tidelog_server.metrics import MetricsOptions, add_metrics_arguments, metrics_options
from tidelog_server.security_options import SecurityOptions, add_security_arguments
from tidelog_server.tls import (
    add_etcd_tls_arguments,
    add_tls_arguments,
    etcd_auth_from_args,
    etcd_tls_from_args,
    tls_from_args,
)

from tidelog_gateway.config import GatewayConfig
from tidelog_gateway.server import serve

#: The largest --producer-request-timeout-ms: the SDK producer's default
#: delivery_timeout_ms (120 s) less its linger_ms in the gateway (2 ms).
MAX_PRODUCER_REQUEST_TIMEOUT_MS = 119_998


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def parse_args(argv: list[str] | None = None) -> GatewayConfig:
    return parse_all(argv)[0]


def parse_all(argv: list[str] | None = None) -> tuple[GatewayConfig, MetricsOptions | None]:
    """The gateway's config and its metrics endpoint (--metrics-port)."""
    defaults = GatewayConfig()
    parser = argparse.ArgumentParser(prog="tidelog-gateway", description=__doc__)
    parser.add_argument("--listen", default=defaults.listen_address, help="host:port to serve on")
    parser.add_argument(
        "--etcd",
        default=defaults.etcd_endpoint,
        help="etcd endpoints host:port[,host:port...] (several: used in turn when one dies)",
    )
    parser.add_argument("--prefix", default=defaults.etcd_prefix, help="the cluster's etcd prefix")
    parser.add_argument(
        "--advertised-address",
        default=defaults.advertised_address,
        help="host:port clients should use (default: the address each client reached)",
    )
    for flag, field, doc in (
        ("--max-streams", "max_streams", "streams open on the gateway"),
        ("--max-streams-per-connection", "max_streams_per_connection", "streams per connection"),
        ("--max-partitions-per-request", "max_partitions_per_request", "partitions per request"),
        ("--max-partitions-per-fetch", "max_partitions_per_fetch", "partitions per Fetch stream"),
        ("--fetch-max-credit-bytes", "fetch_max_credit_bytes", "credit outstanding per stream"),
        ("--fetch-buffer-max-bytes", "fetch_buffer_max_bytes", "fetch bytes, all streams"),
        (
            "--fetch-buffer-max-bytes-per-connection",
            "fetch_buffer_max_bytes_per_connection",
            "fetch bytes, one connection",
        ),
        ("--produce-buffer-max-bytes", "produce_buffer_max_bytes", "produce bytes in transit"),
        ("--upstream-connections", "upstream_connections", "connections to each broker"),
        (
            "--producer-request-timeout-ms",
            "producer_request_timeout_ms",
            "Records.Produce: wait for a broker's answer before sending again",
        ),
    ):
        parser.add_argument(
            flag, dest=field, type=_positive, default=getattr(defaults, field), help=doc
        )
    parser.add_argument(
        "--forward-timeout-s",
        type=_positive_seconds,
        default=defaults.forward_timeout_s,
        help="deadline of a call forwarded to a coordinator or asked of a leader "
        "(DescribeTopics' figures)",
    )
    parser.add_argument("--drain-timeout-s", type=float, default=defaults.drain_timeout_s)
    parser.add_argument("--log-level", default="INFO")
    add_tls_arguments(parser)
    add_etcd_tls_arguments(parser)
    add_metrics_arguments(parser)
    add_security_arguments(parser)
    args = parser.parse_args(argv)
    try:
        parse_endpoints(args.etcd)
    except EtcdEndpointError as exc:
        parser.error(f"--etcd: {exc}")
    try:
        tls = tls_from_args(args)
        etcd_tls = etcd_tls_from_args(args)
        etcd_auth = etcd_auth_from_args(args)
        security = SecurityOptions.from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.producer_request_timeout_ms > MAX_PRODUCER_REQUEST_TIMEOUT_MS:
        # The producer's delivery timeout (120 s) must cover linger + one request.
        parser.error(
            f"--producer-request-timeout-ms must be at most {MAX_PRODUCER_REQUEST_TIMEOUT_MS}, "
            f"got {args.producer_request_timeout_ms}"
        )
    if args.advertised_address and not args.advertised_address.rpartition(":")[2].isdigit():
        parser.error(f"--advertised-address must be host:port, got {args.advertised_address!r}")
    config = GatewayConfig(
        listen_address=args.listen,
        etcd_endpoint=args.etcd,
        etcd_prefix=args.prefix,
        advertised_address=args.advertised_address,
        max_streams=args.max_streams,
        max_streams_per_connection=args.max_streams_per_connection,
        max_partitions_per_request=args.max_partitions_per_request,
        max_partitions_per_fetch=args.max_partitions_per_fetch,
        fetch_max_credit_bytes=args.fetch_max_credit_bytes,
        fetch_buffer_max_bytes=args.fetch_buffer_max_bytes,
        fetch_buffer_max_bytes_per_connection=args.fetch_buffer_max_bytes_per_connection,
        produce_buffer_max_bytes=args.produce_buffer_max_bytes,
        upstream_connections=args.upstream_connections,
        producer_request_timeout_ms=args.producer_request_timeout_ms,
        forward_timeout_s=args.forward_timeout_s,
        drain_timeout_s=args.drain_timeout_s,
        tls=tls,
        etcd_tls=etcd_tls,
        etcd_auth=etcd_auth,
        security=security,
    )
    return config, metrics_options(args)


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(serve(*parse_all(argv)))


if __name__ == "__main__":
    sys.exit(main())
