"""Client options: one frozen dataclass per client, with Kafka's names and defaults.

The public constructors (`Producer(...)`, `Consumer(...)`, `AdminClient(...)`)
take these fields as keyword-only arguments and build the dataclass, which
checks every value once, up front, so a typo fails at construction rather than
deep inside the sender. Field names are Kafka's with dots turned into
underscores (`linger.ms` -> `linger_ms`); units are last in the name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tidelog.compression import CompressionType
from tidelog.security import ChannelSecurity

DEFAULT_BOOTSTRAP = "127.0.0.1:9392"
#: Environment variable giving the bootstrap servers of a client created
#: without them (the CLI reads it too).
BOOTSTRAP_ENV = "TIDELOG_BOOTSTRAP"
#: Environment variables giving the security options of a client created
#: without them.
SECURITY_ENV = {
    "security_protocol": "TIDELOG_SECURITY_PROTOCOL",
    "ssl_cafile": "TIDELOG_SSL_CAFILE",
    "ssl_certfile": "TIDELOG_SSL_CERTFILE",
    "ssl_keyfile": "TIDELOG_SSL_KEYFILE",
    "sasl_plain_username": "TIDELOG_SASL_USERNAME",
    "sasl_plain_password": "TIDELOG_SASL_PASSWORD",
}
MIB = 1024 * 1024

#: gRPC's own cap on a message; Tidelog raises it to fit a full fetch
#: response (fetch_max_bytes, 50 MiB by default) plus framing.
GRPC_MAX_MESSAGE_BYTES = 64 * MIB
#: The broker's limit on FetchRequest.max_answers_per_message.
MAX_FETCH_ANSWERS_PER_MESSAGE = 16


def default_bootstrap() -> str:
    """$TIDELOG_BOOTSTRAP when set (and not empty), else the local cluster."""
    return os.environ.get(BOOTSTRAP_ENV, "").strip() or DEFAULT_BOOTSTRAP


def _parse_bootstrap(servers: str | Sequence[str] | None) -> tuple[str, ...]:
    if servers is None:
        servers = default_bootstrap()
    if isinstance(servers, str):
        servers = servers.split(",")
    out = tuple(s.strip() for s in servers if s.strip())
    if not out:
        raise ValueError("bootstrap_servers is empty: give at least one 'host:port'")
    for address in out:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"bootstrap server {address!r} is not 'host:port'")
    return out


def _positive(name: str, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def _non_negative(name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


@dataclass(frozen=True, kw_only=True)
class CommonConfig:
    """Options every client has."""

    #: "host:port" of one or more brokers (or the gateway), as a list or a
    #: comma-separated string. Only used to discover the cluster. None:
    #: $TIDELOG_BOOTSTRAP when set, else 127.0.0.1:9392.
    bootstrap_servers: str | Sequence[str] | None = None
    #: Kafka's client.id: sent with every call (metadata `tidelog-client-id`),
    #: so that quotas per client id apply, and as the gRPC user agent.
    #: Printable ASCII, at most 255 characters.
    client_id: str = "tidelog-python"
    #: How long one request (a unary call, or a produce answer) may take.
    request_timeout_ms: int = 30_000
    #: Pause before retrying a failed request or a metadata refresh.
    retry_backoff_ms: int = 100
    #: Refresh cached metadata at least this often, even without errors.
    metadata_max_age_ms: int = 300_000
    #: How long a call that waits for metadata (send() of a topic not seen
    #: before, a consumer placing a partition) keeps trying while no server
    #: can be reached at all: then it fails with BrokerNotAvailableError
    #: naming the addresses tried, instead of waiting out max_block_ms in
    #: silence (a wrong port). Kafka's name and default; here it bounds the
    #: whole attempt to connect, since gRPC retries connections itself. An
    #: outage shorter than this (a broker restarting) is waited out.
    socket_connection_setup_timeout_ms: int = 10_000
    #: gRPC keepalive ping interval on idle connections. 5.5 minutes, because
    #: a gRPC server by default treats pings closer than 5 minutes apart on a
    #: connection without data as abuse and closes it (GOAWAY too_many_pings).
    keepalive_time_ms: int = 330_000
    #: "PLAINTEXT" or "SSL" (TLS to every server; tidelog.security). None:
    #: $TIDELOG_SECURITY_PROTOCOL when set, else PLAINTEXT. The ssl_* files
    #: below likewise default to $TIDELOG_SSL_CAFILE, $TIDELOG_SSL_CERTFILE
    #: and $TIDELOG_SSL_KEYFILE, so that the CLI and scripts pointed at a TLS
    #: cluster (`tidelog dev --tls` prints the exports) need no flags.
    security_protocol: str | None = None
    #: PEM file of the authorities to trust (None: the system's).
    ssl_cafile: str | None = None
    #: PEM files of the client's own certificate and key, for servers that
    #: ask for one (mTLS): both or neither.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    #: With security_protocol "SASL_SSL": the user name and password checked
    #: by the servers against `tidelog users` (sent over TLS only). None:
    #: $TIDELOG_SASL_USERNAME and $TIDELOG_SASL_PASSWORD when set.
    sasl_mechanism: str = "PLAIN"
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = None
    #: Extra gRPC channel arguments, (name, value) pairs added after the
    #: client's own. gRPC shares one TCP connection per address among all
    #: channels of a process whose arguments are equal, so a program that
    #: runs many clients (the gateway) can spread them over several
    #: connections with an argument of its own, e.g. ("myapp.connection", n).
    grpc_channel_options: Sequence[tuple[str, int | str]] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "bootstrap_servers", _parse_bootstrap(self.bootstrap_servers))
        object.__setattr__(self, "grpc_channel_options", tuple(self.grpc_channel_options))
        for name, variable in SECURITY_ENV.items():
            if getattr(self, name) is None and os.environ.get(variable, "").strip():
                object.__setattr__(self, name, os.environ[variable].strip())
        if self.security_protocol is None:
            object.__setattr__(self, "security_protocol", "PLAINTEXT")
        assert self.security_protocol is not None
        object.__setattr__(
            self,
            "_security",
            ChannelSecurity.from_options(
                self.security_protocol,
                self.ssl_cafile,
                self.ssl_certfile,
                self.ssl_keyfile,
                self.sasl_plain_username,
                self.sasl_plain_password,
                self.sasl_mechanism,
                self.client_id,
            ),
        )
        _positive("request_timeout_ms", self.request_timeout_ms)
        _non_negative("retry_backoff_ms", self.retry_backoff_ms)
        _positive("metadata_max_age_ms", self.metadata_max_age_ms)
        _positive("keepalive_time_ms", self.keepalive_time_ms)
        _positive("socket_connection_setup_timeout_ms", self.socket_connection_setup_timeout_ms)

    @property
    def security(self) -> ChannelSecurity:
        """How this client opens its channels (checked and read at construction)."""
        return self._security  # type: ignore[attr-defined]

    @property
    def addresses(self) -> tuple[str, ...]:
        """The bootstrap servers, parsed (never None after __post_init__)."""
        assert self.bootstrap_servers is not None
        return tuple(self.bootstrap_servers)


@dataclass(frozen=True, kw_only=True)
class ProducerConfig(CommonConfig):
    """Options of `Producer` and `AsyncProducer`."""

    #: The blocking client runs its gRPC I/O on the loop thread it shares
    #: with the process's other blocking Producers and Consumers (fewer
    #: thread hops per record: lower tail latency); False: a loop thread of
    #: its own, for delivery callbacks that block on another client or are
    #: slow. The asyncio clients ignore it. See docs/python-sdk.md.
    shared_loop_thread: bool = True

    #: 0: do not wait for the broker (offsets are -1); 1: the leader has it
    #: in its log; -1 or "all": every in-sync replica has it. "all" also turns
    #: on enable_idempotence unless it is set to False.
    acks: int | Literal["all"] = 1
    #: How long a batch that is not full waits for more records before it is
    #: sent. A few ms lets a busy producer fill batches.
    linger_ms: int = 5
    #: A batch that is not full, its linger over, still waits while an
    #: earlier batch of its partition awaits the broker's answer, and takes
    #: the records that come meanwhile (Nagle's algorithm, for batches): a
    #: partition has at most one partial batch in flight. Full and flushed
    #: batches never wait, so a busy producer still pipelines
    #: max_in_flight_requests requests. Fewer, larger requests cost both
    #: ends less CPU: at 10,000 records/s with linger_ms=0 the end-to-end
    #: p99 was about half (docs/python-sdk.md). The cost: a record may wait
    #: up to one round trip of the previous request (with acks="all", its
    #: replication too). False: a batch goes once its linger is over, as
    #: Kafka's producer sends it.
    linger_while_in_flight: bool = True
    #: Target bytes of one batch (per partition). Kafka's default is 16 KB;
    #: ours is 256 KB because a gRPC message costs far more than a Kafka
    #: request (~1,800 unary round trips/s, and 16 KB stream messages move
    #: ~110 MB/s against ~1,100 MB/s at 256 KB; see ARCHITECTURE.md). Small
    #: batches would make the per-message cost dominate.
    batch_size: int = 256 * 1024
    #: Codec for batch bodies: None/"none", "gzip", "snappy", "lz4", "zstd".
    compression_type: str | CompressionType | None = None
    #: Largest produce request in bytes, and so the largest record.
    max_request_size: int = 1 * MIB
    #: Bytes of records the producer may hold before send() blocks (room
    #: granted to send()'s lock-free lanes counts until they close, within
    #: linger_ms; a lane is granted at most half of what is free).
    buffer_memory: int = 64 * MIB
    #: How long send() may block for metadata or buffer space.
    max_block_ms: int = 60_000
    #: Upper bound on the time from send() to success or failure, retries
    #: included. Must be >= linger_ms + request_timeout_ms.
    delivery_timeout_ms: int = 120_000
    #: How many times a batch is retried after a retriable error (bounded by
    #: delivery_timeout_ms in any case).
    retries: int = 2_147_483_647
    #: Produce requests sent on a connection without waiting for answers.
    #: Without idempotence, a retried batch can land after a later batch of
    #: the same partition that succeeded (set 1 when strict order matters);
    #: with it, brokers refuse the gap and order is kept with up to 5.
    max_in_flight_requests: int = 5
    #: Upper bound of the retry backoff, which doubles from retry_backoff_ms
    #: with each attempt of a batch (with jitter), as Kafka's
    #: retry.backoff.max.ms does. Lower than Kafka's 1000: a leader fail-over
    #: here completes ~2 s after a broker dies (the 2 s session TTL), and a
    #: 1 s backoff step then added up to a second to every fail-over
    #: (bench/replication_bench.py: p50 3.4 s with 1000, 2.3 s with 250).
    retry_backoff_max_ms: int = 250
    #: Exactly once per partition: the producer takes a producer id from the
    #: cluster at start (InitProducerId) and numbers its records per
    #: partition; brokers drop a retried batch they already wrote (answering
    #: with its original offsets) and refuse gaps, so retries neither
    #: duplicate nor reorder records. None (the default): on when acks is
    #: "all"/-1, retries > 0 and max_in_flight_requests <= 5, off otherwise
    #: (our default acks is 1, so it is off by default). True requires
    #: exactly those settings and fails the constructor otherwise.
    enable_idempotence: bool | None = None
    #: Optional stable name of this producer (Kafka's transactional.id,
    #: without transactions): a new producer started with the same key gets
    #: the same producer id with a higher epoch, and brokers then refuse the
    #: older instance's batches (InvalidProducerEpochError: it is fenced).
    producer_key: str | None = None
    #: Turn keys and values into bytes (kafka-python's serializers).
    key_serializer: Callable[[Any], bytes | None] | None = None
    value_serializer: Callable[[Any], bytes | None] | None = None
    #: Chooses the partition of each record sent without one, as
    #: kafka-python's `partitioner`: called with (serialized key or None,
    #: all partition numbers, the partitions that have a leader now) and
    #: returns one of all partitions. None (the default): murmur2 of the key
    #: (Kafka's, so keys land where Kafka's clients put them), sticky
    #: partitioning for records without a key.
    partitioner: Callable[[bytes | None, list[int], list[int]], int] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.partitioner is not None and not callable(self.partitioner):
            raise TypeError(f"partitioner must be callable, got {self.partitioner!r}")
        acks: Any = self.acks
        if acks == "all":
            acks = -1
        if acks not in (0, 1, -1):
            raise ValueError(f"acks must be 0, 1, -1 or 'all', got {self.acks!r}")
        object.__setattr__(self, "acks", acks)
        object.__setattr__(self, "compression_type", CompressionType.parse(self.compression_type))
        _non_negative("linger_ms", self.linger_ms)
        _positive("batch_size", self.batch_size)
        _positive("max_request_size", self.max_request_size)
        _positive("buffer_memory", self.buffer_memory)
        _non_negative("max_block_ms", self.max_block_ms)
        _non_negative("retries", self.retries)
        _positive("max_in_flight_requests", self.max_in_flight_requests)
        _non_negative("retry_backoff_max_ms", self.retry_backoff_max_ms)
        if self.enable_idempotence:
            problems = []
            if acks != -1:
                problems.append(f"acks='all' (got {self.acks!r})")
            if self.retries <= 0:
                problems.append(f"retries > 0 (got {self.retries})")
            if self.max_in_flight_requests > 5:
                problems.append(f"max_in_flight_requests <= 5 (got {self.max_in_flight_requests})")
            if problems:
                raise ValueError("enable_idempotence=True requires " + " and ".join(problems))
        if self.producer_key is not None and not self.idempotent:
            raise ValueError(
                "producer_key needs an idempotent producer: set acks='all' "
                "(enable_idempotence is then on)"
            )
        if self.producer_key is not None and not 0 < len(self.producer_key) <= 255:
            raise ValueError("producer_key must be 1 to 255 characters (None: no key)")
        if self.max_request_size > GRPC_MAX_MESSAGE_BYTES - MIB:
            raise ValueError(
                f"max_request_size {self.max_request_size} leaves no room under the "
                f"{GRPC_MAX_MESSAGE_BYTES}-byte gRPC message limit"
            )
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise ValueError(
                f"delivery_timeout_ms ({self.delivery_timeout_ms}) must be >= linger_ms + "
                f"request_timeout_ms ({self.linger_ms + self.request_timeout_ms})"
            )

    @property
    def codec(self) -> CompressionType:
        return CompressionType.parse(self.compression_type)

    @property
    def idempotent(self) -> bool:
        """enable_idempotence with its default resolved (see the field)."""
        if self.enable_idempotence is not None:
            return self.enable_idempotence
        return self.acks == -1 and self.retries > 0 and self.max_in_flight_requests <= 5


@dataclass(frozen=True, kw_only=True)
class ConsumerConfig(CommonConfig):
    """Options of `Consumer` and `AsyncConsumer`."""

    #: The blocking client runs its gRPC I/O on the loop thread it shares
    #: with the process's other blocking Producers and Consumers (fewer
    #: thread hops per record: lower tail latency); False: a loop thread of
    #: its own, for delivery callbacks that block on another client or are
    #: slow. The asyncio clients ignore it. See docs/python-sdk.md.
    shared_loop_thread: bool = True

    #: The consumer group to join (subscribe() needs one; assign() does not).
    #: Groups need a cluster: brokers started with --etcd, and a coordinator.
    group_id: str | None = None
    #: Static membership: a stable name for this instance (a pod name). A
    #: member that restarts within session_timeout_ms gets its partitions
    #: back without a rebalance; close() then does not leave the group.
    group_instance_id: str | None = None
    #: How the group's partitions are spread: "cooperative-sticky" (only
    #: partitions that move are revoked), "range" or "roundrobin".
    partition_assignment_strategy: str = "cooperative-sticky"
    #: The member is removed this long after its last heartbeat (a crash).
    session_timeout_ms: int = 45_000
    #: Heartbeat at least this often (the coordinator may ask for less).
    heartbeat_interval_ms: int = 3_000
    #: If poll() is not called for this long, the consumer leaves the group
    #: (its partitions move to live members) and says why in its log; the
    #: next poll() rejoins. Also the time allowed to release partitions.
    max_poll_interval_ms: int = 300_000
    #: Commit the positions of owned partitions every auto_commit_interval_ms
    #: (inside poll), before partitions are revoked, and on close. The
    #: committed position is that of records already returned, so a crash
    #: re-delivers at most the records of the last interval (at-least-once).
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
    #: The broker answers once this many bytes are available ...
    fetch_min_bytes: int = 1
    #: ... or once this much time has passed.
    fetch_max_wait_ms: int = 500
    #: Largest fetch answer (bytes of record data).
    fetch_max_bytes: int = 50 * MIB
    #: Largest amount of one partition's data in one response.
    max_partition_fetch_bytes: int = 1 * MIB
    #: Bytes of fetched data the broker may send ahead of the application
    #: (the credit window of a fetch stream: one per leader, or several
    #: through a gateway that limits the partitions per stream). It bounds
    #: the consumer's memory per stream; two or more responses' worth keeps
    #: the stream busy while the application works. None: 4 x
    #: max_partition_fetch_bytes, at least 8 MiB.
    fetch_buffer_bytes: int | None = None
    #: Fetch answers the broker may send in one gRPC message when several
    #: are ready at once (a consumer catching up): each answer keeps
    #: fetch_max_bytes and max_partition_fetch_bytes and is handled as its
    #: own fetch (poll_arrow: one RecordBatch each), but a message costs the
    #: client's gRPC receive more than its bytes do, so fewer, larger
    #: messages cost less CPU per record on both sides. The broker puts
    #: answers together only while a message stays within 1 MiB of records
    #: (small fetch sizes gain; 1 MiB answers go one per message). 1: one
    #: answer per message; at most 16. The credit window still bounds what
    #: is in flight.
    fetch_answers_per_message: int = 4
    #: Most records one poll() returns.
    max_poll_records: int = 500
    #: Where to start when there is no position or it is out of range:
    #: "earliest", "latest", or "none" (raise). The default differs from
    #: Kafka's clients ("latest"), on purpose: a new group, or a partition
    #: added while nobody had committed, reads what was produced before it
    #: joined instead of silently skipping it. Set "latest" for Kafka's
    #: behaviour (the CLI's `consume` does, unless --from-beginning).
    auto_offset_reset: Literal["earliest", "latest", "none"] = "earliest"
    #: Verify each batch's CRC32C while decoding (~24 GB/s, so on by default).
    check_crcs: bool = True
    #: Freed memory the process keeps for reuse instead of giving it back to
    #: the OS and faulting it in again for the next fetch: Python's freed
    #: arenas (with the SDK's C extension) and, on glibc, free heap memory up
    #: to min(this, 16 MiB) per heap (tidelog._memory_reuse). Process-wide:
    #: the largest bound of the process's consumers counts. 0 leaves the
    #: allocators alone; see docs/python-sdk.md.
    freed_memory_kept_bytes: int = 64 * MIB
    key_deserializer: Callable[[bytes], Any] | None = None
    value_deserializer: Callable[[bytes], Any] | None = None
    #: Iteration (`for record in consumer`) stops after this long without a
    #: record; None iterates forever (kafka-python's consumer_timeout_ms).
    consumer_timeout_ms: float | None = None
    #: Upper bound of the backoff between lookups of a group's coordinator,
    #: which doubles from retry_backoff_ms (Kafka's retry.backoff.max.ms and
    #: default).
    retry_backoff_max_ms: int = 1_000

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(
                f"auto_offset_reset must be 'earliest', 'latest' or 'none', "
                f"got {self.auto_offset_reset!r}"
            )
        _non_negative("fetch_min_bytes", self.fetch_min_bytes)
        _non_negative("fetch_max_wait_ms", self.fetch_max_wait_ms)
        _non_negative("retry_backoff_max_ms", self.retry_backoff_max_ms)
        _positive("fetch_max_bytes", self.fetch_max_bytes)
        _positive("max_partition_fetch_bytes", self.max_partition_fetch_bytes)
        _positive("max_poll_records", self.max_poll_records)
        if not 1 <= self.fetch_answers_per_message <= MAX_FETCH_ANSWERS_PER_MESSAGE:
            raise ValueError(
                f"fetch_answers_per_message must be between 1 and "
                f"{MAX_FETCH_ANSWERS_PER_MESSAGE}, got {self.fetch_answers_per_message}"
            )
        _non_negative("freed_memory_kept_bytes", self.freed_memory_kept_bytes)
        if self.partition_assignment_strategy not in ("cooperative-sticky", "range", "roundrobin"):
            raise ValueError(
                "partition_assignment_strategy must be 'cooperative-sticky', 'range' or "
                f"'roundrobin', got {self.partition_assignment_strategy!r}"
            )
        if self.session_timeout_ms < 2_000:
            raise ValueError(
                f"session_timeout_ms must be >= 2000 (etcd's shortest lease), "
                f"got {self.session_timeout_ms}"
            )
        _positive("heartbeat_interval_ms", self.heartbeat_interval_ms)
        _positive("max_poll_interval_ms", self.max_poll_interval_ms)
        _positive("auto_commit_interval_ms", self.auto_commit_interval_ms)
        if self.group_id is not None and not self.group_id:
            raise ValueError("group_id must not be empty (None: no group)")
        if self.fetch_max_bytes > GRPC_MAX_MESSAGE_BYTES - MIB:
            raise ValueError(
                f"fetch_max_bytes {self.fetch_max_bytes} leaves no room under the "
                f"{GRPC_MAX_MESSAGE_BYTES}-byte gRPC message limit"
            )
        if self.fetch_buffer_bytes is None:
            object.__setattr__(
                self, "fetch_buffer_bytes", max(4 * self.max_partition_fetch_bytes, 8 * MIB)
            )
        _positive("fetch_buffer_bytes", self.window_bytes)

    @property
    def window_bytes(self) -> int:
        """The credit window (fetch_buffer_bytes with its default filled in)."""
        assert self.fetch_buffer_bytes is not None
        return self.fetch_buffer_bytes

    @property
    def response_max_bytes(self) -> int:
        """max_bytes asked of the broker: never more than the window."""
        return min(self.fetch_max_bytes, self.window_bytes)


@dataclass(frozen=True, kw_only=True)
class AdminConfig(CommonConfig):
    """Options of `AdminClient` and `AsyncAdminClient`."""

    #: Kafka's default.api.timeout.ms: how long one admin call may take,
    #: retries included. A call that fails with a retriable error is sent
    #: again (after retry_backoff_ms, doubling up to retry_backoff_max_ms,
    #: with jitter) until this runs out; then the last error is raised,
    #: naming this option and the attempts made. Each attempt waits at most
    #: request_timeout_ms, and never past this. Only calls safe to repeat
    #: are sent again: see tidelog._admin_retry.
    default_api_timeout_ms: int = 60_000
    #: Upper bound of the admin retry backoff (Kafka's retry.backoff.max.ms
    #: and default).
    retry_backoff_max_ms: int = 1_000

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("default_api_timeout_ms", self.default_api_timeout_ms)
        _non_negative("retry_backoff_max_ms", self.retry_backoff_max_ms)
