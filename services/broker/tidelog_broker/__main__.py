"""`tidelog-broker` / `python -m tidelog_broker`: start one broker."""

from __future__ import annotations

# Before anything that imports gRPC: it reads its transport settings once, when first imported.
from tidelog_server import grpc_transport  # noqa: F401  isort: skip

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import re
import socket
import sys
from pathlib import Path

from tidelog.errors import TidelogError
from tidelog_server.etcd.client import EtcdEndpointError, parse_endpoints
from tidelog_server.metrics import add_metrics_arguments, metrics_options
from tidelog_server.security_options import SecurityOptions, add_security_arguments
from tidelog_server.tls import (
    add_etcd_tls_arguments,
    add_tls_arguments,
    etcd_auth_from_args,
    etcd_tls_from_args,
    tls_from_args,
)

from tidelog_broker.cluster_link import ClusterConfig
from tidelog_broker.config import (
    DEFAULT_PORT,
    BrokerConfig,
    build_config,
    parse_settings,
    read_properties,
)
from tidelog_broker.data_dir_lock import DataDirLockedError
from tidelog_broker.malloc_tuning import (
    MallocTuningError,
    apply_malloc_tuning,
    parse_malloc_tuning,
)
from tidelog_broker.resources import raise_open_file_limit
from tidelog_broker.server import serve


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tidelog-broker",
        description="Run a Tidelog broker: partition logs on disk, served over gRPC.",
    )
    parser.add_argument(
        "--listen",
        default=f"127.0.0.1:{DEFAULT_PORT}",
        help="host:port to serve on (default %(default)s; port 0 picks a free one)",
    )
    parser.add_argument(
        "--internal-port",
        type=int,
        default=0,
        help="cluster mode: port of the internal listener (replication between brokers), "
        "on the --listen host; never the client port (default 0: a free port, advertised "
        "in etcd)",
    )
    parser.add_argument("--data-dir", type=Path, default=Path("./data"), help="log directory")
    add_tls_arguments(parser)
    add_etcd_tls_arguments(parser)
    add_security_arguments(parser)
    parser.add_argument("--broker-id", type=int, default=None, help="this broker's id (default 0)")
    parser.add_argument(
        "--broker-id-from-hostname",
        action="store_true",
        help="take the broker id from the host name's trailing -<ordinal> "
        "(a Kubernetes StatefulSet pod: tidelog-broker-2 is broker 2)",
    )
    parser.add_argument(
        "--auto-create-topics",
        action="store_true",
        default=None,
        help="create unknown topics on first produce (auto.create.topics.enable)",
    )
    parser.add_argument("--config", type=Path, help="properties file with Kafka's config names")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config, e.g. --set log.segment.bytes=104857600 (repeatable)",
    )
    parser.add_argument(
        "--etcd",
        default=None,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="cluster mode: register in this etcd and learn topics from it (no topics.json); "
        "several members comma separated, used in turn when one dies",
    )
    parser.add_argument(
        "--etcd-prefix",
        default="/tidelog",
        help="key prefix of the cluster in etcd (the coordinator's --prefix; default %(default)s)",
    )
    parser.add_argument("--rack", default="", help="broker.rack, for rack-aware placement")
    parser.add_argument(
        "--session-ttl-s",
        type=int,
        default=2,
        help="cluster mode: seconds after its death until the broker leaves the cluster "
        "(and its partitions get new leaders; default %(default)s, the least etcd allows)",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    parser.add_argument(
        "--malloc-tuning",
        default="default",
        metavar="default|off|KEY=VALUE,...",
        help="glibc allocator settings applied at start (malloc_tuning.py), so that fetch "
        "answers reuse heap memory instead of fresh mmapped pages: 'default' "
        "(mmap_threshold=16MiB,trim_threshold=32MiB,arena_max=4), 'off', or your own "
        "values of those keys; skipped on other C libraries and for settings given by "
        "MALLOC_* environment variables (default %(default)s)",
    )
    add_metrics_arguments(parser)
    return parser.parse_args(argv)


def cluster_from_args(args: argparse.Namespace) -> ClusterConfig | None:
    if not args.etcd:
        return None
    try:
        parse_endpoints(args.etcd)
    except EtcdEndpointError as exc:
        raise TidelogError(f"--etcd: {exc}") from None
    try:
        etcd_tls = etcd_tls_from_args(args)
        etcd_auth = etcd_auth_from_args(args)
    except ValueError as exc:
        raise TidelogError(str(exc)) from None
    return ClusterConfig(
        args.etcd, args.etcd_prefix, args.rack, max(2, args.session_ttl_s), etcd_tls, etcd_auth
    )


def broker_id_from_hostname(hostname: str) -> int:
    """The ordinal that ends a StatefulSet pod's name (`<set>-<ordinal>`):
    stable across restarts and moves of the pod, as its volume is."""
    # The pod name is the host name's first label (the FQDN adds the Service).
    match = re.fullmatch(r".+-(\d{1,9})", hostname.split(".", 1)[0])
    if match is None:
        raise TidelogError(
            f"--broker-id-from-hostname: host name {hostname!r} does not end in "
            "-<ordinal> (as a StatefulSet pod's name does); give --broker-id instead"
        )
    return int(match.group(1))


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise TidelogError(f"--listen expects host:port, got {args.listen!r}")
    if not 0 <= args.internal_port <= 65535:
        raise TidelogError(f"--internal-port expects a port number, got {args.internal_port}")
    try:
        tls = tls_from_args(args)
        security = SecurityOptions.from_args(args)
    except ValueError as exc:
        raise TidelogError(str(exc)) from exc
    config = BrokerConfig(
        host=host,
        port=int(port),
        internal_port=args.internal_port,
        data_dir=args.data_dir,
        tls=tls,
        security=security,
    )
    if args.config is not None:
        config = build_config(config, read_properties(args.config))
    config = build_config(config, parse_settings(args.set))
    changes: dict[str, object] = {}
    if args.broker_id_from_hostname:
        if args.broker_id is not None:
            raise TidelogError("give --broker-id or --broker-id-from-hostname, not both")
        changes["broker_id"] = broker_id_from_hostname(socket.gethostname())
    if args.broker_id is not None:
        changes["broker_id"] = args.broker_id
    if args.auto_create_topics is not None:
        changes["auto_create_topics"] = args.auto_create_topics
    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = config_from_args(args)
        cluster = cluster_from_args(args)
        malloc_tuning = parse_malloc_tuning(args.malloc_tuning)
    except (TidelogError, MallocTuningError) as exc:
        print(f"tidelog-broker: {exc}", file=sys.stderr)
        return 2
    # Before the event loop and gRPC's threads allocate (and create arenas).
    apply_malloc_tuning(malloc_tuning)
    # Descriptors bound the partitions a broker can host (resources.py).
    raise_open_file_limit()
    # SIGINT is handled inside serve(); this covers one before the loop is up.
    with contextlib.suppress(KeyboardInterrupt):
        try:
            return asyncio.run(serve(config, cluster, metrics_options(args)))
        except DataDirLockedError as exc:
            # Another broker runs on this data directory: its words, no traceback.
            print(f"tidelog-broker: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
