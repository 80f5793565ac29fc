"""Settings of one coordinator replica, with their defaults and limits."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from tidelog_server.etcd.client import EtcdAuth, EtcdTls
from tidelog_server.security_options import SecurityOptions
from tidelog_server.tls import ServerTls


def _default_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Immutable; built once by __main__ (or a test)."""

    #: host:port to serve gRPC on (port 0: any free port).
    listen_address: str = "127.0.0.1:9093"
    #: host:port of etcd.
    etcd_endpoint: str = "127.0.0.1:2379"
    #: Key prefix of this cluster in etcd.
    etcd_prefix: str = "/tidelog"
    #: This replica's name (in the controller election and DescribeCluster).
    coordinator_id: str = field(default_factory=_default_id)
    #: Host that clients should use for this replica (default: the listen host).
    advertised_host: str = ""
    #: TTL of this replica's own session: registration and controller
    #: candidacy vanish this long after the process dies, so it bounds the
    #: controller fail-over time.
    session_ttl_s: int = 10
    #: num.partitions: partitions of a topic created with partitions = 0.
    default_partitions: int = 1
    #: default.replication.factor: used when a request says 0.
    default_replication_factor: int = 1
    #: offsets.retention.minutes: committed offsets of a group without members
    #: are deleted this long after their commit.
    offsets_retention_minutes: int = 7 * 24 * 60
    #: How often the controller looks for expired offsets.
    offsets_retention_check_interval_ms: int = 60_000
    #: etcd's --max-txn-ops (default 128): larger commits and topic creations
    #: are split into transactions of at most this many operations.
    etcd_max_txn_ops: int = 128
    #: Offset commits coalesced into one etcd transaction at most (group
    #: commit, see offset_committer.py); 1 writes one transaction per commit.
    offset_commit_coalesce_max: int = 127
    #: Offset commits waiting for etcd at most; past it a commit is refused
    #: with COORDINATOR_NOT_AVAILABLE (retriable) naming this limit.
    offset_commit_queue_max: int = 10_000
    #: Requests of one CommitOffsetsStream in flight at most: past it the
    #: coordinator reads no more of that stream's requests until it has sent
    #: an answer (bounds what a client that never reads answers holds here).
    commit_stream_in_flight_max: int = 1024
    #: leader.imbalance.check.interval.ms: how often the controller moves
    #: leadership back to each partition's preferred (first) replica when it
    #: is in the ISR (0: never).
    leader_imbalance_check_interval_ms: int = 5_000
    #: group.consumer.max.size: members of one consumer group (see
    #: group_limits.GROUP_MAX_MEMBERS, the default).
    group_max_members: int = 1_000
    #: ACL bindings the cluster stores at most: past it CreateAcls refuses
    #: new ones. Every service holds them all in memory (indexed, so a
    #: decision reads the matching ones only), and a DeleteAcls reads them all
    #: and matches at most acl_deletions.MATCH_SCANS_PER_REQUEST x this.
    max_acl_bindings: int = 10_000
    #: Quota entities (principal, client id) the cluster stores at most: past
    #: it AlterClientQuotas refuses new ones. Every service holds them all.
    max_quota_entities: int = 10_000
    #: Users with stored credentials the cluster stores at most: past it
    #: AlterUserCredentials refuses new ones. Every service holds them all.
    max_users: int = 10_000
    #: TLS on the listener (None: plain text).
    tls: ServerTls | None = None
    #: TLS to etcd (None: plain text).
    etcd_tls: EtcdTls | None = None
    #: etcd user and password (None: none, or the CN of the TLS certificate).
    etcd_auth: EtcdAuth | None = None
    #: With --metrics-port: how often the controller refreshes the cluster
    #: gauges and the groups' lag (one etcd read and one ListOffsets per
    #: leader and per 1,000 of its partitions each time).
    metrics_interval_ms: int = 5_000
    #: Authentication and authorization (--allow-anonymous, --super-users, ...).
    security: SecurityOptions = field(default_factory=SecurityOptions)
