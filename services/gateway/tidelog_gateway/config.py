"""The gateway's settings and the limits on what clients control."""

from __future__ import annotations

from dataclasses import dataclass, field

from tidelog_server.etcd.client import EtcdAuth, EtcdTls
from tidelog_server.security_options import SecurityOptions
from tidelog_server.tls import ServerTls

MIB = 1024 * 1024

#: The gateway's id in its own Metadata and DescribeCluster answers: it names
#: itself as the leader of every partition, so no broker may use this id.
GATEWAY_NODE_ID = 2**31 - 1


@dataclass(frozen=True)
class GatewayConfig:
    """`tidelog-gateway` options (see __main__ for their flags)."""

    listen_address: str = "127.0.0.1:9400"
    etcd_endpoint: str = "127.0.0.1:2379"
    etcd_prefix: str = "/tidelog"
    #: host:port clients should use to reach the gateway. Empty: clients use
    #: the address they reached it at (right behind a Kubernetes Service or
    #: a NAT, where the gateway cannot know that address).
    advertised_address: str = ""
    #: Largest gRPC message in either direction (the SDK's limit).
    max_message_bytes: int = 64 * MIB
    #: Streaming calls (Produce, Fetch, Heartbeat) open on one connection.
    max_streams_per_connection: int = 512
    #: Streaming calls open on the whole gateway.
    max_streams: int = 4096
    #: Partitions named in one request (Produce, ListOffsets, one Fetch request;
    #: topics in one Metadata request). ListOffsets is also held to the
    #: brokers' MAX_LIST_OFFSETS_ENTRIES (tidelog.request_limits), whichever is
    #: lower. Named to clients (tidelog.errors.MAX_PARTITIONS_METADATA_KEY) in
    #: each Produce and Fetch stream's initial metadata and in a refusal's
    #: trailing metadata; the SDK splits its requests by it
    #: (tidelog._partition_limits), so a value below the SDK's own
    #: MAX_FETCH_PARTITIONS_PER_REQUEST (10,000) costs a client at most one
    #: refused request, sent again split.
    max_partitions_per_request: int = 10_000
    #: Partitions one Fetch stream may read at once. Named to clients
    #: (tidelog.errors.MAX_PARTITIONS_PER_FETCH_METADATA_KEY) in each Fetch
    #: stream's initial metadata and in a refusal's trailing metadata; the
    #: SDK reads the partitions it is assigned on as many streams as this
    #: takes (each with its own credit window: memory on the client grows
    #: with the streams, as it does with the brokers of a cluster).
    max_partitions_per_fetch: int = 10_000
    #: Produce requests one stream may have awaiting their answers.
    max_pending_produce: int = 1024
    #: Record bytes of produce requests being forwarded, all streams together.
    produce_buffer_max_bytes: int = 256 * MIB
    #: Largest credit a Fetch stream may have outstanding (the broker's limit).
    fetch_max_credit_bytes: int = 1024 * MIB
    #: Record bytes the gateway may hold or have asked brokers for, for all
    #: Fetch streams together, and for the streams of one connection.
    fetch_buffer_max_bytes: int = 512 * MIB
    fetch_buffer_max_bytes_per_connection: int = 128 * MIB
    #: TCP connections to each broker, streams spread over them round-robin:
    #: a broker limits the Fetch streams of one connection
    #: (fetch.max.streams.per.connection), and the gateway's carry many clients.
    upstream_connections: int = 4
    #: How long the record-level API's producer waits for a broker's answer
    #: before it sends the batch again (idempotently with ACKS_ALL).
    producer_request_timeout_ms: int = 30_000
    #: Deadline of a forwarded unary call.
    forward_timeout_s: float = 30.0
    #: On SIGTERM: how long in-flight produce requests may take to be
    #: answered before the remaining streams are cancelled.
    drain_timeout_s: float = 10.0
    #: TLS on the listener and to the brokers and coordinators (None: plain text).
    tls: ServerTls | None = None
    #: TLS to etcd (None: plain text).
    etcd_tls: EtcdTls | None = None
    #: etcd user and password (None: none, or the CN of the TLS certificate).
    etcd_auth: EtcdAuth | None = None
    #: Authentication and authorization (--allow-anonymous, --super-users, ...).
    security: SecurityOptions = field(default_factory=SecurityOptions)

    @property
    def advertised(self) -> tuple[str, int]:
        """(host, port) the gateway names itself with; ("", 0) when unset."""
        if not self.advertised_address:
            return "", 0
        host, _, port = self.advertised_address.rpartition(":")
        return host, int(port)
