"""Topic configs with Kafka's names: the one table of accepted keys and ranges.

Shared by every part that validates topic configs: the coordinator (which
now serves CreateTopics and must reject a bad config before any broker sees
it) and brokers (which build their per-log settings from it). Clients send
configs as strings and learn of a bad one from the INVALID_CONFIG answer.
Copied from the broker's `storage/config.py` with the same keys, ranges and
messages, so that the broker can switch to this module.

`TopicConfig` holds the effective settings of one topic; it is built from a
topic's overrides (strings, as they travel in the admin API) on top of
defaults. Every key is validated here, in one place, with a message that
names the key and the accepted range. Every number has an upper bound as
well as a lower one (int64 at most, so that any Kafka client can read the
value back; less where the storage packs it in 32 bits), and
`check_replication` refuses a config that the topic's replication factor
cannot satisfy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tidelog.errors import InvalidConfigError

_DAY_MS = 24 * 60 * 60 * 1000
#: The largest value of a config Kafka declares a long (int64).
MAX_LONG = 2**63 - 1
#: The largest value of a config Kafka declares an int (int32).
MAX_INT = 2**31 - 1
#: Digits of the longest integer a config may be written with: int() on a
#: string of many thousand digits costs quadratic time, so longer strings are
#: refused before they are parsed.
_MAX_DIGITS = 20


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """Effective settings of one topic. Immutable; replace to change."""

    #: segment.bytes: roll the active segment before it grows past this.
    segment_bytes: int = 1024 * 1024 * 1024
    #: segment.ms: roll the active segment once its first batch is this old.
    segment_ms: int = 7 * _DAY_MS
    #: index.interval.bytes: one offset-index entry per this many log bytes.
    index_interval_bytes: int = 4096
    #: segment.index.bytes: roll when an index file would grow past this.
    segment_index_bytes: int = 10 * 1024 * 1024
    #: flush.messages: fsync after this many records (None: leave it to the OS).
    flush_messages: int | None = None
    #: flush.ms: fsync when unflushed data is this old (None: leave it to the OS).
    flush_ms: int | None = None
    #: max.message.bytes: largest batch accepted, header included.
    max_message_bytes: int = 1024 * 1024 + 12
    #: retention.ms: delete closed segments older than this (-1: keep forever).
    retention_ms: int = 7 * _DAY_MS
    #: retention.bytes: delete closed segments while the log is bigger (-1: no limit).
    retention_bytes: int = -1
    #: cleanup.policy: "delete", "compact" or "compact,delete".
    cleanup_policy: str = "delete"
    #: message.timestamp.type: "CreateTime" or "LogAppendTime".
    message_timestamp_type: str = "CreateTime"
    #: delete.retention.ms: how long a tombstone outlives its record timestamp
    #: in a compacted log (time for consumers to see the delete).
    delete_retention_ms: int = _DAY_MS
    #: min.cleanable.dirty.ratio: clean once dirty bytes / all bytes reach this.
    min_cleanable_dirty_ratio: float = 0.5
    #: min.compaction.lag.ms: records younger than this are never compacted.
    min_compaction_lag_ms: int = 0
    #: compression.type: "producer" (keep the producer's codec) or a codec the
    #: broker re-encodes every batch with: none, gzip, snappy, lz4, zstd.
    compression_type: str = "producer"
    #: min.insync.replicas: with acks=all, a write needs at least this many
    #: in-sync replicas (leader included), else NOT_ENOUGH_REPLICAS.
    min_insync_replicas: int = 1
    #: unclean.leader.election.enable: when no in-sync replica is alive, elect
    #: the first live replica (losing what only the ISR had) instead of waiting.
    unclean_leader_election_enable: bool = False

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def compact(self) -> bool:
        """cleanup.policy includes compact."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """cleanup.policy includes delete (retention applies)."""
        return "delete" in self.cleanup_policy


def _int_in(low: int, high: int) -> Callable[[str, str], int]:
    def parse(key: str, raw: str) -> int:
        text = raw.strip()
        if len(text.lstrip("+-")) > _MAX_DIGITS:
            raise InvalidConfigError(
                f"{key} has {len(text)} characters, too many for a number: use {low} to {high}"
            )
        try:
            value = int(text)
        except ValueError:
            raise InvalidConfigError(f"{key}={raw!r} is not an integer") from None
        if not low <= value <= high:
            raise InvalidConfigError(f"{key}={value} is out of range: use {low} to {high}")
        return value

    return parse


def _optional_int_in(low: int, high: int) -> Callable[[str, str], int | None]:
    parse_int = _int_in(low, high)

    def parse(key: str, raw: str) -> int | None:
        if raw.strip().lower() in ("", "none", "null"):
            return None
        return parse_int(key, raw)

    return parse


def _float_in(low: float, high: float) -> Callable[[str, str], float]:
    def parse(key: str, raw: str) -> float:
        if len(raw) > _MAX_DIGITS:
            raise InvalidConfigError(f"{key} is too long for a number: use {low} to {high}")
        try:
            value = float(raw)
        except ValueError:
            raise InvalidConfigError(f"{key}={raw!r} is not a number") from None
        if not low <= value <= high:
            raise InvalidConfigError(f"{key}={value} is out of range: use {low} to {high}")
        return value

    return parse


def _bool(key: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise InvalidConfigError(f"{key}={raw!r} is not a boolean: use true or false")


def _limit_or_unlimited(key: str, raw: str) -> int:
    value = _int_in(-1, MAX_LONG)(key, raw)
    if value == 0:
        raise InvalidConfigError(f"{key}=0 would delete everything: use -1 (unlimited) or > 0")
    return value


def _one_of(*choices: str) -> Callable[[str, str], str]:
    def parse(key: str, raw: str) -> str:
        normalized = ",".join(sorted(p.strip() for p in raw.split(",")))
        for choice in choices:
            if normalized == ",".join(sorted(choice.split(","))):
                return choice
        raise InvalidConfigError(f"{key}={raw!r} is not accepted: use one of {', '.join(choices)}")

    return parse


# Kafka name -> (TopicConfig field, parser). The one table of accepted keys.
TOPIC_CONFIGS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    # Positions in a segment are 32-bit (the offset index packs them so).
    "segment.bytes": ("segment_bytes", _int_in(1024, MAX_INT)),
    "segment.ms": ("segment_ms", _int_in(1, MAX_LONG)),
    # 0 bytes between index entries is no interval at all; 1 already means
    # an entry per batch, the densest index there is.
    "index.interval.bytes": ("index_interval_bytes", _int_in(1, MAX_INT)),
    "segment.index.bytes": ("segment_index_bytes", _int_in(64, MAX_INT)),
    "flush.messages": ("flush_messages", _optional_int_in(1, MAX_LONG)),
    "flush.ms": ("flush_ms", _optional_int_in(0, MAX_LONG)),
    "max.message.bytes": ("max_message_bytes", _int_in(64, MAX_INT)),
    "retention.ms": ("retention_ms", _limit_or_unlimited),
    "retention.bytes": ("retention_bytes", _limit_or_unlimited),
    "cleanup.policy": ("cleanup_policy", _one_of("delete", "compact", "compact,delete")),
    "message.timestamp.type": (
        "message_timestamp_type",
        _one_of("CreateTime", "LogAppendTime"),
    ),
    "delete.retention.ms": ("delete_retention_ms", _int_in(0, MAX_LONG)),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", _float_in(0.0, 1.0)),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", _int_in(0, MAX_LONG)),
    "compression.type": (
        "compression_type",
        _one_of("producer", "none", "gzip", "snappy", "lz4", "zstd"),
    ),
    # At most the replication factor, too: see check_replication.
    "min.insync.replicas": ("min_insync_replicas", _int_in(1, MAX_INT)),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", _bool),
}


def parse_topic_configs(
    overrides: Mapping[str, str], base: TopicConfig | None = None
) -> TopicConfig:
    """Apply string overrides with Kafka's names to `base` (defaults if None).

    Raises InvalidConfigError naming the key for an unknown key or a bad value.
    """
    changes: dict[str, Any] = {}
    for key, raw in overrides.items():
        try:
            field, parse = TOPIC_CONFIGS[key]
        except KeyError:
            known = ", ".join(sorted(TOPIC_CONFIGS))
            raise InvalidConfigError(f"unknown topic config {key!r}; known keys: {known}") from None
        changes[field] = parse(key, str(raw))
    return dataclasses.replace(base or TopicConfig(), **changes)


def config_to_strings(config: TopicConfig) -> dict[str, str]:
    """The effective config with Kafka's names, as the admin API shows it."""
    out: dict[str, str] = {}
    for key, (field, _) in TOPIC_CONFIGS.items():
        value = getattr(config, field)
        if isinstance(value, bool):
            out[key] = "true" if value else "false"  # Kafka's spelling
        else:
            out[key] = "" if value is None else str(value)
    return out


def validate_topic_configs(overrides: Mapping[str, str]) -> dict[str, str]:
    """The overrides with each value in its canonical spelling.

    Raises InvalidConfigError naming the key for an unknown key or a bad value.
    """
    parsed = parse_topic_configs(overrides)
    effective = config_to_strings(parsed)
    return {key: effective[key] for key in overrides}


def check_replication(config: TopicConfig, replication_factor: int, topic: str) -> None:
    """Refuse a config the topic's replicas cannot satisfy: with
    min.insync.replicas above the replication factor, every acks=all write
    would fail with NOT_ENOUGH_REPLICAS for the topic's whole life."""
    if config.min_insync_replicas > replication_factor:
        raise InvalidConfigError(
            f"min.insync.replicas={config.min_insync_replicas} is larger than the "
            f"replication factor {replication_factor} of topic {topic!r}: "
            f"use 1 to {replication_factor}"
        )
