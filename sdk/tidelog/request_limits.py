"""Limits on the shape of one admin, ListOffsets or Fetch request, shared by
every server that answers it (the coordinator, a broker, the gateway) and by
clients (fail early, or split a request so that it stays within them).

A request over a limit is refused whole, before any of it is carried out,
with INVALID_REQUEST naming the limit: the cost of one call stays bounded
(each topic is an etcd transaction, each partition an etcd key and a
directory on its brokers, each ListOffsets entry a lookup on the broker's
event loop) whatever a client sends. MAX_TIMESTAMPS_PER_PARTITION is the
exception: it refuses only the entries past it, so the rest of the request
is still answered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import Protocol, TypeVar

from tidelog.errors import InvalidRequestError

T = TypeVar("T", bound=Hashable)
S = TypeVar("S")

#: Topics named in one admin request (CreateTopics, DeleteTopics,
#: DescribeTopics, DescribeConfigs, AlterConfigs).
MAX_TOPICS_PER_REQUEST = 1000
#: Partitions of one topic in a CreateTopics request.
MAX_PARTITIONS_PER_TOPIC = 10_000
#: Partitions named in one DeleteRecords, ElectLeaders or partition
#: reassignment request.
MAX_PARTITIONS_PER_REQUEST = 10_000
#: Entries (partition and timestamp) in one ListOffsets request. Each is
#: answered on the broker's event loop: measured on a loaded 2-core machine,
#: 1,000 entries cost ~2 ms of broker CPU for latest/earliest, ~6 ms for
#: unknown partitions and ~18 ms for timestamp lookups in small batches.
#: The SDK, the coordinator's lag metrics and the gateway split their
#: requests at this size (`in_requests_of`).
MAX_LIST_OFFSETS_ENTRIES = 1000
#: Partitions (positions and removals) one FetchRequest of a Fetch stream
#: names. A broker sets no such limit; the gateway's default
#: --max-partitions-per-request is this, and the SDK puts the partitions it
#: places in a session at one time (after a reset, an assignment, a leader
#: change), and those of one produce request, in requests of at most this
#: many, or of the lower limit a server names (tidelog._partition_limits).
MAX_FETCH_PARTITIONS_PER_REQUEST = 10_000
#: Distinct timestamps (timestamp_ms >= 0) one ListOffsets request may look
#: up in one partition: each reads and checks a batch of it (up to
#: max.message.bytes).
#: Entries past it are answered INVALID_REQUEST; a timestamp repeated is
#: looked up once, and latest (-1) and earliest (-2) are not counted.
MAX_TIMESTAMPS_PER_PARTITION = 8


def check_partitions_per_request(count: int, what: str) -> None:
    """Refuse a request naming more than MAX_PARTITIONS_PER_REQUEST partitions."""
    if count > MAX_PARTITIONS_PER_REQUEST:
        raise InvalidRequestError(
            f"{count} partitions in one {what} request: MAX_PARTITIONS_PER_REQUEST is "
            f"{MAX_PARTITIONS_PER_REQUEST}; send them in several requests"
        )


class FetchPositionLike(Protocol):
    """What `check_fetch_positions` reads of a tidelog.v1.FetchPosition."""

    topic: str
    partition: int
    fetch_offset: int
    partition_max_bytes: int


def check_fetch_positions(positions: Iterable[FetchPositionLike]) -> None:
    """Refuse a Fetch request whose positions a stream cannot read from: a
    negative fetch_offset or partition_max_bytes (0: no per-partition
    limit). Checked whole before any of it is applied."""
    for position in positions:
        where = f"{position.topic}-{position.partition}"
        if position.fetch_offset < 0:
            raise InvalidRequestError(
                f"fetch_offset must be >= 0 for {where}, got {position.fetch_offset}"
            )
        if position.partition_max_bytes < 0:
            raise InvalidRequestError(
                f"partition_max_bytes must be >= 0 for {where}, got {position.partition_max_bytes}"
            )


def check_list_offsets_entries(count: int) -> None:
    """Refuse a ListOffsets request of more than MAX_LIST_OFFSETS_ENTRIES entries."""
    if count > MAX_LIST_OFFSETS_ENTRIES:
        raise InvalidRequestError(
            f"{count} entries in one ListOffsets request: MAX_LIST_OFFSETS_ENTRIES is "
            f"{MAX_LIST_OFFSETS_ENTRIES}; send them in several requests"
        )


def too_many_timestamps_error(topic: str, partition: int) -> InvalidRequestError:
    """The error of a ListOffsets entry past MAX_TIMESTAMPS_PER_PARTITION."""
    return InvalidRequestError(
        f"more than {MAX_TIMESTAMPS_PER_PARTITION} distinct timestamps for partition "
        f"{topic[:64]}-{partition} in one ListOffsets request: MAX_TIMESTAMPS_PER_PARTITION is "
        f"{MAX_TIMESTAMPS_PER_PARTITION}; look the others up in another request"
    )


def in_requests_of(items: Sequence[S], size: int) -> Iterator[Sequence[S]]:
    """`items` in consecutive pieces of at most `size`, one per request: how
    a client keeps each request within a count limit (MAX_LIST_OFFSETS_ENTRIES,
    MAX_FETCH_PARTITIONS_PER_REQUEST)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def check_create_topics(topics: Iterable[tuple[str, int]]) -> None:
    """Refuse a CreateTopics request of (name, partitions) pairs over a limit."""
    topics = list(topics)
    if len(topics) > MAX_TOPICS_PER_REQUEST:
        raise InvalidRequestError(
            f"{len(topics)} topics in one CreateTopics request: MAX_TOPICS_PER_REQUEST is "
            f"{MAX_TOPICS_PER_REQUEST}; send them in several requests"
        )
    for name, partitions in topics:
        if partitions > MAX_PARTITIONS_PER_TOPIC:
            raise InvalidRequestError(
                f"{partitions} partitions requested for topic {name[:64]!r}: "
                f"MAX_PARTITIONS_PER_TOPIC is {MAX_PARTITIONS_PER_TOPIC}"
            )


def check_topic_count(count: int, rpc: str) -> None:
    """Refuse an admin request that names more than MAX_TOPICS_PER_REQUEST topics."""
    if count > MAX_TOPICS_PER_REQUEST:
        raise InvalidRequestError(
            f"{count} topics in one {rpc} request: MAX_TOPICS_PER_REQUEST is "
            f"{MAX_TOPICS_PER_REQUEST}; send them in several requests"
        )


def repeated(items: Iterable[T]) -> set[T]:
    """The topic names (or partitions) given more than once in one request.

    Every entry of such an item is refused (`repeated_name_error`,
    `repeated_partition_error`), as Kafka refuses duplicate topics in
    CreateTopics and DeleteTopics: there is no order between two entries of
    one request to honour, and without the rule a request could make a
    server do the same etcd work its whole count limit over.
    """
    return {item for item, count in Counter(items).items() if count > 1}


def distinct(items: Iterable[T]) -> list[T]:
    """`items` with each one once, in the order of its first entry: what a
    describing request (Metadata, DescribeTopics) answers, one description per
    name however often it is given, as Kafka's brokers take a request's topics
    as a set. Described once per entry, one topic of thousands of partitions
    named thousands of times cost tens of millions of partition entries."""
    return list(dict.fromkeys(items))


def repeated_name_error(name: str, rpc: str) -> InvalidRequestError:
    """The error of each entry of a topic that `repeated` found."""
    return InvalidRequestError(
        f"topic {name[:64]!r} is named more than once in one {rpc} request: name each topic once"
    )


def repeated_partition_error(topic: str, partition: int, rpc: str) -> InvalidRequestError:
    """The error of each entry of a partition that `repeated` found."""
    return InvalidRequestError(
        f"partition {topic[:64]}-{partition} is named more than once in one {rpc} request: "
        "name each partition once"
    )
