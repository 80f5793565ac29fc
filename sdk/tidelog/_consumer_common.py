"""What `Consumer` and `AsyncConsumer` share outside groups: building the
config, checking partition arguments, and `HandedOut`, the records given to
iteration (`for record in consumer`, `getone()`, `async for`).

Iteration takes records from the subscription in chunks but returns them one
at a time, so the subscription's positions run ahead of what the caller has
seen. `HandedOut` remembers the chunk and the last record returned, so that
commit() (see `_consumer_group`) commits exactly what was returned: a process
that commits after each record and dies loses nothing it had fetched ahead.

Not thread-safe: the calling side only, but for `HandedOut.interrupt()`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import Any

from tidelog.config import ConsumerConfig
from tidelog.errors import IllegalStateError
from tidelog.group import OffsetAndMetadata
from tidelog.types import ConsumerRecord, OffsetAndTimestamp, TopicPartition

#: Records one internal poll takes for iteration outside a group: large, so
#: that the per-poll cost is spread over many records. (In a group, a poll per
#: max_poll_records keeps max_poll_interval_ms meaningful and rebalances prompt.)
ITERATION_CHUNK = 10_000


def make_config(
    topics: tuple[str, ...],
    bootstrap_servers: str | Sequence[str] | None,
    options: dict[str, Any],
) -> ConsumerConfig:
    config = ConsumerConfig(bootstrap_servers=bootstrap_servers, **options)
    if topics and config.group_id is None:
        raise IllegalStateError(
            f"subscribing to {', '.join(topics)} needs a group_id; without a group, "
            "create the consumer without topics and call assign()"
        )
    return config


def check_partitions(partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
    out = []
    for tp in partitions:
        if not isinstance(tp, tuple) or len(tp) != 2:
            raise TypeError(f"expected a TopicPartition, got {tp!r}")
        out.append(TopicPartition(*tp))
    return out


def offsets_and_times(
    found: dict[TopicPartition, tuple[int, int]],
) -> dict[TopicPartition, OffsetAndTimestamp | None]:
    return {
        tp: None if offset < 0 else OffsetAndTimestamp(offset, timestamp)
        for tp, (offset, timestamp) in found.items()
    }


def _offset(record: ConsumerRecord) -> int:
    return record.offset


class HandedOut:
    """The chunk iteration is returning, partition by partition in the
    chunk's order, and the last record it returned (see module doc).

    The consumers read `records` and set `last` themselves on the per-record
    path (an attribute store, nothing more)."""

    __slots__ = ("chunk", "last", "records")

    def __init__(self) -> None:
        self.records: Iterator[ConsumerRecord] = iter(())
        self.chunk: dict[TopicPartition, list[ConsumerRecord]] | None = None
        self.last: ConsumerRecord | None = None

    def reset(self) -> None:
        """Forget the chunk (seek, assign, leaving the group, or all returned)."""
        self.records = iter(())
        self.chunk = None
        self.last = None

    def take(self, polled: dict[TopicPartition, list[ConsumerRecord]]) -> ConsumerRecord:
        """Start returning `polled` (not empty); returns its first record."""
        # A local: interrupt() may replace self.records at any moment.
        records = chain.from_iterable(polled.values())
        self.records = records
        self.chunk = polled
        record = next(records)
        self.last = record
        return record

    def interrupt(self) -> None:
        """Make iteration leave the chunk for its slow path (a poll) at its
        next record, from any thread: one attribute store, so the per-record
        path checks no flag. The records not returned are not lost: the poll
        gives back `chunk` past `last` (give_back) before anything else."""
        self.records = iter(())

    def give_back(self) -> dict[TopicPartition, list[ConsumerRecord]]:
        """The chunk's records not returned yet, by partition, and forget the
        chunk: getmany()/poll() and reads of named partitions put them back
        into the subscription (`SubscriptionState.unread`) so that none is
        skipped or returned out of order."""
        chunk, last = self.chunk, self.last
        self.reset()
        if not chunk:
            return {}
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        reached = last is None
        for tp, records in chunk.items():
            if not reached and last is not None and tp == (last.topic, last.partition):
                reached = True
                rest = records[bisect_right(records, last.offset, key=_offset) :]
                if rest:
                    out[tp] = rest
            elif reached:
                out[tp] = records
        return out

    def adjust(self, positions: dict[TopicPartition, OffsetAndMetadata]) -> None:
        """Move `positions` (the subscription's: past the whole chunk) back to
        what was returned: partitions before `last`'s were returned whole (their
        positions hold), `last`'s up to it, the ones after not at all."""
        chunk, last = self.chunk, self.last
        if not chunk:
            return
        reached = last is None
        for tp, records in chunk.items():
            # Only the partitions asked about are moved, but `last`'s is found
            # even when not asked about (a commit of revoked partitions only).
            if not reached and last is not None and tp == (last.topic, last.partition):
                reached = True
                if tp in positions:
                    positions[tp] = OffsetAndMetadata(last.offset + 1)
            elif reached and tp in positions:
                positions[tp] = OffsetAndMetadata(records[0].offset)
