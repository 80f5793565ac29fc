"""The source's options: Spark's Kafka source's names, parsed and checked once.

Spark hands a data source its options as a case-insensitive mapping of
strings (`dict(options)` would lower-case the keys, so lookups go to the
original mapping). Everything is checked on the driver when a query starts:
an unknown option, two ways of choosing topics, malformed JSON offsets or a
bad number raise `SourceOptionError` naming the option, as Spark's Kafka
source does (Spark fails the query with it).

The servers option is Tidelog's `tidelog.bootstrap.servers`; Kafka's
`kafka.bootstrap.servers` is accepted as an alias so that a job moves from
Kafka by changing the format name. Without either, the SDK's default
($TIDELOG_BOOTSTRAP, else 127.0.0.1:9392).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SERVERS = "tidelog.bootstrap.servers"
SERVERS_ALIAS = "kafka.bootstrap.servers"

#: Kafka's offset sentinels in JSON offsets.
EARLIEST = -2
LATEST = -1

# Options that select topics: exactly one of them.
_STRATEGIES = ("subscribe", "subscribePattern", "assign")

_READ_OPTIONS = (
    SERVERS,
    SERVERS_ALIAS,
    *_STRATEGIES,
    "startingOffsets",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsets",
    "endingTimestamp",
    "endingOffsetsByTimestamp",
    "maxOffsetsPerTrigger",
    "minPartitions",
    "failOnDataLoss",
    "includeHeaders",
    "kafkaConsumer.pollTimeoutMs",
)
#: Longest subscribePattern accepted (a pattern is matched against every topic).
MAX_PATTERN_LENGTH = 1000
#: Most topics or partitions one option may name.
MAX_PARTITIONS = 100_000


class SourceOptionError(ValueError):
    """An option of the tidelog source is unknown, missing or malformed; the
    message names it."""


def get(options: Mapping[str, str], name: str) -> str | None:
    """`options[name]`, looked up case-insensitively, or None."""
    value = options.get(name)
    if value is None:
        lowered = name.lower()
        for key, candidate in options.items():
            if key.lower() == lowered:
                return candidate
    return value


def servers(options: Mapping[str, str]) -> str | None:
    """The bootstrap servers: `tidelog.bootstrap.servers`, or Kafka's name for
    it; None for the SDK's default. Both given and different: an error."""
    own = get(options, SERVERS)
    alias = get(options, SERVERS_ALIAS)
    if own is not None and alias is not None and own != alias:
        raise SourceOptionError(
            f"both {SERVERS!r} ({own}) and its alias {SERVERS_ALIAS!r} ({alias}) are set: give one"
        )
    value = own if own is not None else alias
    if value is not None and not value.strip():
        raise SourceOptionError(f"option {SERVERS!r} is empty")
    return value


# ---------------------------------------------------------------- parsed options


#: A per-partition position: (topic, partition) -> offset (or EARLIEST/LATEST).
PartitionOffsets = dict[tuple[str, int], int]


@dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts or ends: `kind` "earliest", "latest", "offsets"
    (`offsets`: JSON per partition with -2/-1), "timestamp" (one time for
    every partition) or "timestamps" (per partition)."""

    kind: str
    offsets: PartitionOffsets | None = None
    timestamp: int | None = None
    timestamps: PartitionOffsets | None = None


@dataclass(frozen=True)
class SourceOptions:
    servers: str | None
    #: "subscribe", "subscribePattern" or "assign".
    strategy: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, int], ...] = ()
    starting: OffsetSpec = OffsetSpec("latest")
    ending: OffsetSpec = OffsetSpec("latest")
    #: "error" or "latest": a partition with no record at or after the time.
    by_timestamp_strategy: str = "error"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = 120_000

    def matches(self, topic: str) -> bool:
        """Whether a topic is read (for subscribe and subscribePattern)."""
        if self.strategy == "subscribe":
            return topic in self.topics
        if self.strategy == "subscribePattern":
            assert self.pattern is not None
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.assigned)


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = get(options, name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise SourceOptionError(f"option {name!r} must be 'true' or 'false', got {value!r}")
    return lowered == "true"


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    value = get(options, name)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        raise SourceOptionError(
            f"option {name!r} must be a positive integer, got {value!r}"
        ) from None
    if number <= 0:
        raise SourceOptionError(f"option {name!r} must be a positive integer, got {value!r}")
    return number


def _json(name: str, value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise SourceOptionError(f"option {name!r} is not valid JSON ({exc}): {value!r}") from None


def _partition_numbers(name: str, topic: str, raw: Any) -> int:
    try:
        partition = int(raw)
    except (TypeError, ValueError):
        raise SourceOptionError(
            f"option {name!r}: partition {raw!r} of topic {topic!r} is not an integer"
        ) from None
    if partition < 0:
        raise SourceOptionError(f"option {name!r}: partition {partition} of {topic!r} is negative")
    return partition


def parse_partition_values(
    name: str, value: str, allowed_negative: tuple[int, ...]
) -> PartitionOffsets:
    """`{"topic": {"0": 23, "1": -1}}` as (topic, partition) -> number; the
    negative numbers allowed are `allowed_negative` (-2 earliest, -1 latest)."""
    parsed = _json(name, value)
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise SourceOptionError(
            f"option {name!r} must be a JSON object of topics to objects of partitions to "
            f'numbers, like {{"topicA":{{"0":23,"1":-1}}}}; got {value!r}'
        )
    out: PartitionOffsets = {}
    for topic, partitions in parsed.items():
        for raw_partition, number in partitions.items():
            partition = _partition_numbers(name, topic, raw_partition)
            if not isinstance(number, int) or isinstance(number, bool):
                raise SourceOptionError(
                    f"option {name!r}: {topic}-{partition} has {number!r}, not an integer"
                )
            if number < 0 and number not in allowed_negative:
                allowed = ", ".join(str(n) for n in allowed_negative) or "none"
                raise SourceOptionError(
                    f"option {name!r}: {topic}-{partition} has {number}; negative values "
                    f"allowed here: {allowed}"
                )
            out[(topic, partition)] = number
    if len(out) > MAX_PARTITIONS:
        raise SourceOptionError(f"option {name!r} names more than {MAX_PARTITIONS} partitions")
    return out


def _offset_spec(options: Mapping[str, str], prefix: str, default: str) -> OffsetSpec:
    """startingOffsets/startingTimestamp/startingOffsetsByTimestamp (or the
    ending ones): at most one given; the timestamp ones win, as in Kafka."""
    offsets_name = f"{prefix}Offsets"
    timestamp_name = f"{prefix}Timestamp"
    by_timestamp_name = f"{prefix}OffsetsByTimestamp"
    given = [
        n for n in (offsets_name, timestamp_name, by_timestamp_name) if get(options, n) is not None
    ]
    if len(given) > 1:
        raise SourceOptionError(
            f"options {' and '.join(map(repr, given))} cannot be combined: give one"
        )
    ending = prefix == "ending"
    timestamp = get(options, timestamp_name)
    if timestamp is not None:
        try:
            ms = int(timestamp.strip())
        except ValueError:
            ms = -1
        if ms < 0:
            raise SourceOptionError(
                f"option {timestamp_name!r} must be a time in ms since the epoch (>= 0), "
                f"got {timestamp!r}"
            )
        return OffsetSpec("timestamp", timestamp=ms)
    by_timestamp = get(options, by_timestamp_name)
    if by_timestamp is not None:
        return OffsetSpec(
            "timestamps", timestamps=parse_partition_values(by_timestamp_name, by_timestamp, ())
        )
    value = get(options, offsets_name)
    if value is None:
        return OffsetSpec(default)
    lowered = value.strip().lower()
    if lowered == "latest":
        return OffsetSpec("latest")
    if lowered == "earliest":
        if ending:
            raise SourceOptionError(
                f"option {offsets_name!r} cannot be 'earliest' (nothing would be read)"
            )
        return OffsetSpec("earliest")
    allowed = (LATEST,) if ending else (EARLIEST, LATEST)
    return OffsetSpec("offsets", offsets=parse_partition_values(offsets_name, value, allowed))


def _strategy(
    options: Mapping[str, str],
) -> tuple[str, tuple[str, ...], str | None, tuple[tuple[str, int], ...]]:
    given = [name for name in _STRATEGIES if get(options, name) is not None]
    if not given:
        raise SourceOptionError(
            "one of the options 'subscribe', 'subscribePattern' or 'assign' must say which "
            "topics to read"
        )
    if len(given) > 1:
        raise SourceOptionError(
            f"options {' and '.join(map(repr, given))} cannot be combined: give only one of "
            "'subscribe', 'subscribePattern', 'assign'"
        )
    name = given[0]
    value = get(options, name)
    assert value is not None
    if name == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
        if not topics:
            raise SourceOptionError(f"option 'subscribe' names no topic: {value!r}")
        if len(topics) > MAX_PARTITIONS:
            raise SourceOptionError(f"option 'subscribe' names more than {MAX_PARTITIONS} topics")
        return name, topics, None, ()
    if name == "subscribePattern":
        if not value.strip():
            raise SourceOptionError("option 'subscribePattern' is empty")
        if len(value) > MAX_PATTERN_LENGTH:
            raise SourceOptionError(
                f"option 'subscribePattern' is longer than {MAX_PATTERN_LENGTH} characters"
            )
        try:
            re.compile(value)
        except re.error as exc:
            raise SourceOptionError(
                f"option 'subscribePattern' is not a valid regular expression: {exc}"
            ) from None
        return name, (), value, ()
    parsed = _json(name, value)
    if (
        not isinstance(parsed, dict)
        or not parsed
        or not all(isinstance(v, list) for v in parsed.values())
    ):
        raise SourceOptionError(
            f"option 'assign' must be a JSON object of topics to partition lists, like "
            f'{{"topicA":[0,1],"topicB":[2,4]}}; got {value!r}'
        )
    assigned = tuple(
        dict.fromkeys(
            (topic, _partition_numbers(name, topic, p)) for topic, ps in parsed.items() for p in ps
        )
    )
    if not assigned:
        raise SourceOptionError(f"option 'assign' names no partition: {value!r}")
    if len(assigned) > MAX_PARTITIONS:
        raise SourceOptionError(f"option 'assign' names more than {MAX_PARTITIONS} partitions")
    return name, (), None, assigned


def check_known(options: Mapping[str, str], known: tuple[str, ...]) -> None:
    lowered = {name.lower() for name in known}
    for key in options:
        if key.lower() not in lowered:
            raise SourceOptionError(
                f"unknown option {key!r} for the tidelog source; known options: {', '.join(known)}"
            )


def parse(options: Mapping[str, str], streaming: bool) -> SourceOptions:
    """Check and parse a reader's options (see the module doc).
    Streaming: starting defaults to latest and ending options are refused;
    a batch read starts at earliest and ends at latest by default."""
    check_known(options, _READ_OPTIONS)
    strategy, topics, pattern, assigned = _strategy(options)
    if streaming:
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if get(options, name) is not None:
                raise SourceOptionError(
                    f"option {name!r} is for batch reads (spark.read), not streams"
                )
    elif get(options, "maxOffsetsPerTrigger") is not None:
        raise SourceOptionError("option 'maxOffsetsPerTrigger' is for streams, not batch reads")
    by_strategy = (get(options, "startingOffsetsByTimestampStrategy") or "error").strip().lower()
    if by_strategy not in ("error", "latest"):
        raise SourceOptionError(
            "option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest', got "
            f"{by_strategy!r}"
        )
    return SourceOptions(
        servers=servers(options),
        strategy=strategy,
        topics=topics,
        pattern=pattern,
        assigned=assigned,
        starting=_offset_spec(options, "starting", "latest" if streaming else "earliest"),
        ending=OffsetSpec("latest") if streaming else _offset_spec(options, "ending", "latest"),
        by_timestamp_strategy=by_strategy,
        max_offsets_per_trigger=_positive_int(options, "maxOffsetsPerTrigger"),
        min_partitions=_positive_int(options, "minPartitions"),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        include_headers=_bool(options, "includeHeaders", False),
        poll_timeout_ms=_positive_int(options, "kafkaConsumer.pollTimeoutMs") or 120_000,
    )
