"""The broker's own configuration: where it listens, where its data lives, and
the cluster-wide defaults of every topic config.

Sources, later ones winning: built-in defaults, a properties file
(`--config FILE`, lines of `key=value` with Kafka's names, `#` comments), and
`--set key=value` flags. Topic configs given here (`retention.ms`,
`segment.bytes`, ...) become the defaults that each topic's overrides sit on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tidelog.errors import InvalidConfigError

from tidelog_broker.fetch_limits import FetchLimits
from tidelog_broker.storage.config import TOPIC_CONFIGS, LogConfig, parse_topic_configs

if TYPE_CHECKING:  # the storage engine imports this module, and must not import grpc
    from tidelog_server.security_options import SecurityOptions
    from tidelog_server.tls import ServerTls

DEFAULT_PORT = 9392


@dataclass(frozen=True)
class BrokerConfig:
    """Settings of one broker process."""

    #: broker.id: this broker's id in the cluster.
    broker_id: int = 0
    #: listeners: host and port the gRPC server binds.
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    #: advertised.host: what clients are told to connect to (default: host).
    advertised_host: str | None = None
    #: The internal listener's port, on `host`: replication between brokers
    #: (tidelog.internal.Replica), never served on the client port. 0: a free
    #: port, advertised in the broker's registration.
    internal_port: int = 0
    #: TLS on both listeners and for the broker's own calls (None: plain text).
    tls: ServerTls | None = None
    #: Authentication and authorization (None: the defaults of SecurityOptions).
    security: SecurityOptions | None = None
    #: log.dirs: the data directory.
    data_dir: Path = Path("./data")
    #: auto.create.topics.enable: create a topic on first produce/metadata
    #: request. Off by default, as a typo should not create a topic.
    auto_create_topics: bool = False
    #: num.partitions: partitions of an auto-created topic or a CreateTopics
    #: request that leaves the count at 0.
    num_partitions: int = 1
    #: log.flush.scheduler.interval.ms: how often flush.ms is checked.
    flush_check_interval_ms: int = 1000
    #: log.retention.check.interval.ms: how often retention.ms/bytes are applied.
    retention_check_interval_ms: int = 5 * 60 * 1000
    #: log.cleaner.enable: run the compaction cleaner for compacted topics.
    cleaner_enable: bool = True
    #: log.cleaner.backoff.ms: pause between cleaner rounds.
    cleaner_backoff_ms: int = 15 * 1000
    #: log.cleaner.dedupe.buffer.size: memory bound of the cleaner's offset map
    #: (latest offset per key hash), bytes; it bounds the keys deduped per round.
    cleaner_dedupe_buffer_bytes: int = 128 * 1024 * 1024
    #: Defaults of every topic config (Kafka's `log.*` broker settings).
    log_defaults: LogConfig = field(default_factory=LogConfig)
    #: Largest gRPC message accepted, bytes (a produce request with its batches).
    max_request_bytes: int = 64 * 1024 * 1024
    #: replica.lag.time.max.ms: a follower not caught up for this long leaves the ISR.
    replica_lag_time_max_ms: int = 30_000
    #: replica.fetch.wait.max.ms: how long a leader holds a follower's fetch
    #: when nothing is new (also how often an idle follower reports in).
    replica_fetch_wait_max_ms: int = 500
    #: replica.fetch.max.bytes: record bytes per answer to a follower.
    replica_fetch_max_bytes: int = 8 * 1024 * 1024
    #: request.timeout.ms default for acks=all produce requests that set none.
    produce_timeout_ms: int = 30_000
    #: fetch.buffer.max.bytes[.per.connection], fetch.max.streams[.per.connection]:
    #: what Fetch streams may make this broker hold (fetch_limits).
    fetch_limits: FetchLimits = field(default_factory=FetchLimits)
    #: max.partitions: partition replicas this broker hosts at most (0: derived
    #: from its open-file limit, see resources.py). Reported in its etcd
    #: registration; coordinators refuse topics that would pass it.
    max_partitions: int = 0

    @property
    def listen_address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def internal_listen_address(self) -> str:
        return f"{self.host}:{self.internal_port}"


# Broker keys with Kafka's names -> (field, parser).
def _parse_bool(key: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise InvalidConfigError(f"{key}={raw!r} is not a boolean: use true or false")


def _parse_int(key: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise InvalidConfigError(f"{key}={raw!r} is not an integer") from None


def _parse_positive_int(key: str, raw: str) -> int:
    value = _parse_int(key, raw)
    if value < 1:
        raise InvalidConfigError(f"{key}={value} is out of range: use at least 1")
    return value


_BROKER_KEYS = {
    "broker.id": ("broker_id", _parse_int),
    "auto.create.topics.enable": ("auto_create_topics", _parse_bool),
    "num.partitions": ("num_partitions", _parse_int),
    "log.flush.scheduler.interval.ms": ("flush_check_interval_ms", _parse_int),
    "log.retention.check.interval.ms": ("retention_check_interval_ms", _parse_positive_int),
    "log.cleaner.enable": ("cleaner_enable", _parse_bool),
    "log.cleaner.backoff.ms": ("cleaner_backoff_ms", _parse_positive_int),
    "log.cleaner.dedupe.buffer.size": ("cleaner_dedupe_buffer_bytes", _parse_positive_int),
    "log.dirs": ("data_dir", lambda _k, raw: Path(raw)),
    "advertised.host": ("advertised_host", lambda _k, raw: raw),
    "replica.lag.time.max.ms": ("replica_lag_time_max_ms", _parse_positive_int),
    "replica.fetch.wait.max.ms": ("replica_fetch_wait_max_ms", _parse_positive_int),
    "replica.fetch.max.bytes": ("replica_fetch_max_bytes", _parse_positive_int),
    "max.partitions": ("max_partitions", _parse_positive_int),
}

# Keys of the FetchLimits inside BrokerConfig.fetch_limits.
_FETCH_LIMIT_KEYS = {
    "fetch.buffer.max.bytes": "buffer_max_bytes",
    "fetch.buffer.max.bytes.per.connection": "buffer_max_bytes_per_connection",
    "fetch.max.streams": "max_streams",
    "fetch.max.streams.per.connection": "max_streams_per_connection",
}


def _log_default_key(key: str) -> str | None:
    """Kafka names broker-wide topic defaults `log.<topic key>` for some keys
    (log.retention.ms, log.segment.bytes); accept both spellings."""
    if key in TOPIC_CONFIGS:
        return key
    if key.startswith("log.") and key[4:] in TOPIC_CONFIGS:
        return key[4:]
    return None


def read_properties(path: Path) -> dict[str, str]:
    """Parse a Java-style properties file: `key=value` lines, `#` comments."""
    out: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "!")):
            continue
        key, sep, value = stripped.partition("=")
        if not sep:
            raise InvalidConfigError(f"{path}:{number}: expected key=value, got {stripped!r}")
        out[key.strip()] = value.strip()
    return out


def build_config(base: BrokerConfig, settings: Mapping[str, str]) -> BrokerConfig:
    """Apply `key=value` settings with Kafka's names to `base`."""
    changes: dict[str, object] = {}
    log_overrides: dict[str, str] = {}
    fetch_limits: dict[str, int] = {}
    for key, raw in settings.items():
        if key in _FETCH_LIMIT_KEYS:
            fetch_limits[_FETCH_LIMIT_KEYS[key]] = _parse_positive_int(key, raw)
        elif key in _BROKER_KEYS:
            name, parse = _BROKER_KEYS[key]
            changes[name] = parse(key, raw)
        elif (topic_key := _log_default_key(key)) is not None:
            log_overrides[topic_key] = raw
        else:
            raise InvalidConfigError(f"unknown broker config {key!r}")
    if fetch_limits:
        changes["fetch_limits"] = dataclasses.replace(base.fetch_limits, **fetch_limits)
    if log_overrides:
        changes["log_defaults"] = parse_topic_configs(log_overrides, base.log_defaults)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def parse_settings(pairs: Iterable[str]) -> dict[str, str]:
    """Parse `key=value` command-line flags."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidConfigError(f"--set expects key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out
