"""`tidelog-coordinator`: run one coordinator replica until SIGTERM or SIGINT."""

from __future__ import annotations

# Before anything that imports gRPC: it reads its transport settings once, when first imported.
from tidelog_server import grpc_transport  # noqa: F401  isort: skip

import argparse
import asyncio
import logging
import sys

from tidelog_server.etcd.client import EtcdEndpointError, parse_endpoints, serve_until_signal
from tidelog_server.gc_tuning import tune_gc
from tidelog_server.metrics import MetricsOptions, add_metrics_arguments, metrics_options
from tidelog_server.security_options import SecurityOptions, add_security_arguments
from tidelog_server.tls import (
    add_etcd_tls_arguments,
    add_tls_arguments,
    etcd_auth_from_args,
    etcd_tls_from_args,
    tls_from_args,
)

from tidelog_coordinator.config import CoordinatorConfig
from tidelog_coordinator.server import CoordinatorServer

#: The flags' defaults are the config's own (one place to change them).
DEFAULTS = CoordinatorConfig()


def parse_args(argv: list[str] | None = None) -> tuple[CoordinatorConfig, MetricsOptions | None]:
    parser = argparse.ArgumentParser(prog="tidelog-coordinator", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:9093", help="host:port to serve on")
    parser.add_argument(
        "--etcd",
        default="127.0.0.1:2379",
        help="etcd endpoints host:port[,host:port...] (several: used in turn when one dies)",
    )
    parser.add_argument("--prefix", default="/tidelog", help="key prefix of the cluster in etcd")
    parser.add_argument("--id", default=None, help="replica name (default: host-pid)")
    parser.add_argument("--advertised-host", default="", help="host clients should use")
    parser.add_argument(
        "--session-ttl-s",
        type=int,
        default=DEFAULTS.session_ttl_s,
        help="TTL of this replica's etcd session: bounds the controller fail-over time",
    )
    parser.add_argument("--default-partitions", type=int, default=DEFAULTS.default_partitions)
    parser.add_argument(
        "--default-replication-factor",
        type=int,
        default=DEFAULTS.default_replication_factor,
    )
    parser.add_argument(
        "--offsets-retention-minutes", type=int, default=DEFAULTS.offsets_retention_minutes
    )
    parser.add_argument(
        "--offsets-retention-check-interval-ms",
        type=int,
        default=DEFAULTS.offsets_retention_check_interval_ms,
    )
    parser.add_argument("--etcd-max-txn-ops", type=int, default=DEFAULTS.etcd_max_txn_ops)
    parser.add_argument(
        "--offset-commit-coalesce-max",
        type=int,
        default=DEFAULTS.offset_commit_coalesce_max,
        help="offset commits written in one etcd transaction at most (1: one each)",
    )
    parser.add_argument(
        "--offset-commit-queue-max",
        type=int,
        default=DEFAULTS.offset_commit_queue_max,
        help="offset commits waiting for etcd at most; more are refused (retriable)",
    )
    parser.add_argument(
        "--commit-stream-in-flight-max",
        type=int,
        default=DEFAULTS.commit_stream_in_flight_max,
        help="requests of one CommitOffsetsStream in flight at most; past it that "
        "stream's requests are not read until an answer was sent",
    )
    parser.add_argument(
        "--leader-imbalance-check-interval-ms",
        type=int,
        default=DEFAULTS.leader_imbalance_check_interval_ms,
        help="how often leadership returns to preferred replicas (0: never)",
    )
    parser.add_argument(
        "--group-max-members",
        type=int,
        default=DEFAULTS.group_max_members,
        help="members of one consumer group",
    )
    parser.add_argument(
        "--max-acl-bindings",
        type=int,
        default=DEFAULTS.max_acl_bindings,
        help="ACL bindings the cluster stores at most; CreateAcls refuses more",
    )
    parser.add_argument(
        "--max-quota-entities",
        type=int,
        default=DEFAULTS.max_quota_entities,
        help="quota entities (principal, client id) the cluster stores at most; "
        "AlterClientQuotas refuses more",
    )
    parser.add_argument(
        "--max-users",
        type=int,
        default=DEFAULTS.max_users,
        help="users with stored credentials the cluster stores at most; "
        "AlterUserCredentials refuses more",
    )
    parser.add_argument("--log-level", default="INFO")
    add_tls_arguments(parser)
    add_etcd_tls_arguments(parser)
    add_metrics_arguments(parser)
    parser.add_argument(
        "--metrics-interval-ms",
        type=int,
        default=DEFAULTS.metrics_interval_ms,
        help="how often the controller refreshes cluster gauges and consumer lag",
    )
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
    if args.commit_stream_in_flight_max < 1:
        parser.error(
            "--commit-stream-in-flight-max must be at least 1, "
            f"got {args.commit_stream_in_flight_max}"
        )
    for flag, limit in (
        ("--max-acl-bindings", args.max_acl_bindings),
        ("--max-quota-entities", args.max_quota_entities),
        ("--max-users", args.max_users),
    ):
        if limit < 1:
            parser.error(f"{flag} must be at least 1, got {limit}")
    if args.metrics_interval_ms < 100:
        parser.error(f"--metrics-interval-ms must be at least 100, got {args.metrics_interval_ms}")
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    extra = {"coordinator_id": args.id} if args.id else {}
    config = CoordinatorConfig(
        listen_address=args.listen,
        etcd_endpoint=args.etcd,
        etcd_prefix=args.prefix,
        advertised_host=args.advertised_host,
        session_ttl_s=args.session_ttl_s,
        default_partitions=args.default_partitions,
        default_replication_factor=args.default_replication_factor,
        offsets_retention_minutes=args.offsets_retention_minutes,
        offsets_retention_check_interval_ms=args.offsets_retention_check_interval_ms,
        leader_imbalance_check_interval_ms=args.leader_imbalance_check_interval_ms,
        etcd_max_txn_ops=args.etcd_max_txn_ops,
        offset_commit_coalesce_max=args.offset_commit_coalesce_max,
        offset_commit_queue_max=args.offset_commit_queue_max,
        commit_stream_in_flight_max=args.commit_stream_in_flight_max,
        group_max_members=args.group_max_members,
        max_acl_bindings=args.max_acl_bindings,
        max_quota_entities=args.max_quota_entities,
        max_users=args.max_users,
        tls=tls,
        etcd_tls=etcd_tls,
        etcd_auth=etcd_auth,
        metrics_interval_ms=args.metrics_interval_ms,
        security=security,
        **extra,
    )
    return config, metrics_options(args)


async def serve(config: CoordinatorConfig, metrics: MetricsOptions | None = None) -> int:
    """Run a coordinator until SIGTERM or SIGINT (or etcd refuses it): the exit status."""
    server = CoordinatorServer(config, metrics)
    return await serve_until_signal(server.start, server.stop, server.client, config.etcd_prefix)


def main(argv: list[str] | None = None) -> int:
    tune_gc()
    return asyncio.run(serve(*parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
