"""Replica placement of new topics: a pure function of the live brokers.

Replica j of partition i goes on broker (start + i + j) mod n of the live
brokers sorted by id (the Kafka paper's scheme, as Kafka's AdminUtils does
it), so leaders (replica 0) and followers spread evenly. `start` comes from
the topic name, so that many single-partition topics do not all put their
leader on the lowest broker id, while staying deterministic.

Rack-aware when every broker names a rack: the brokers are listed rack by
rack in turn (a1, b1, c1, a2, b2, ...), and each partition's replicas are
taken from its start position onward, skipping brokers in a rack the
partition already uses while an unused rack remains. So with replication
factor <= number of racks, no partition has two replicas in one rack.

A topic created with an explicit assignment skips placement: its assignment
is checked instead (`check_assignment`). Both then pass `check_capacity`.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tidelog.errors import (
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
)


@dataclass(frozen=True, slots=True)
class BrokerSlot:
    """What placement needs to know of a live broker."""

    broker_id: int
    rack: str = ""


def _rack_alternated(brokers: Sequence[BrokerSlot]) -> list[BrokerSlot]:
    by_rack: dict[str, list[BrokerSlot]] = {}
    for broker in sorted(brokers, key=lambda b: b.broker_id):
        by_rack.setdefault(broker.rack, []).append(broker)
    racks = sorted(by_rack)
    out: list[BrokerSlot] = []
    for i in range(max(len(v) for v in by_rack.values())):
        out.extend(by_rack[r][i] for r in racks if i < len(by_rack[r]))
    return out


def place_replicas(
    topic: str, brokers: Sequence[BrokerSlot], partitions: int, replication_factor: int
) -> list[list[int]]:
    """Broker ids of each partition's replicas, the preferred leader first."""
    n = len(brokers)
    if replication_factor < 1 or replication_factor > n:
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} is not possible with "
            f"{n} live broker{'s' if n != 1 else ''}: use 1 to {n}"
        )
    start = zlib.crc32(topic.encode()) % n
    rack_aware = all(b.rack for b in brokers) and len({b.rack for b in brokers}) > 1
    if not rack_aware:
        ordered = sorted(brokers, key=lambda b: b.broker_id)
        return [
            [ordered[(start + i + j) % n].broker_id for j in range(replication_factor)]
            for i in range(partitions)
        ]
    ordered = _rack_alternated(brokers)
    rack_count = len({b.rack for b in brokers})
    placement: list[list[int]] = []
    for i in range(partitions):
        chosen: list[BrokerSlot] = []
        racks_used: set[str] = set()
        pos = start + i
        while len(chosen) < replication_factor:
            candidate = ordered[pos % n]
            pos += 1
            if candidate in chosen:
                continue
            if candidate.rack in racks_used and len(racks_used) < rack_count:
                continue
            chosen.append(candidate)
            racks_used.add(candidate.rack)
        placement.append([b.broker_id for b in chosen])
    return placement


def check_capacity(
    topic: str,
    placement: Sequence[Sequence[int]],
    hosted: dict[int, int],
    capacity: dict[int, int | None],
) -> None:
    """Refuse a placement that would put more partition replicas on a broker
    than it reports it can host (its `max_partitions`, derived from its
    open-file limit). `hosted`: replicas each broker has now (of every
    topic); `capacity`: each live broker's limit (None: it reports none).

    Raises InvalidPartitionsError naming the first broker over its limit and
    how many replicas the whole cluster still has room for.
    """
    adding: dict[int, int] = {}
    for replicas in placement:
        for broker_id in replicas:
            adding[broker_id] = adding.get(broker_id, 0) + 1
    room = sum(
        max(0, limit - hosted.get(broker_id, 0))
        for broker_id, limit in capacity.items()
        if limit is not None
    )
    for broker_id in sorted(adding):
        limit = capacity.get(broker_id)
        if limit is None:
            continue
        after = hosted.get(broker_id, 0) + adding[broker_id]
        if after > limit:
            total = sum(adding.values())
            raise InvalidPartitionsError(
                f"topic {topic!r} needs {total} partition replicas ({len(placement)} "
                f"partitions); broker {broker_id} would host {after}, over its limit of "
                f"{limit} (max.partitions, from its open-file limit); the cluster has room "
                f"for {room} more replicas: use fewer partitions or add brokers"
            )


def check_assignment(
    topic: str,
    assignment: Sequence[tuple[int, Sequence[int]]],
    partitions: int,
    replication_factor: int,
    live_broker_ids: Collection[int],
    max_partitions: int,
) -> list[list[int]]:
    """An explicit placement (Kafka's replicaAssignment) checked and put in
    partition order: the broker ids of each partition's replicas, the
    preferred leader first.

    `assignment` is (partition, broker ids) pairs as the request carries
    them; `partitions` and `replication_factor` are the request's fields,
    where 0 or -1 means "take it from the assignment". Raises
    InvalidRequestError naming the first thing wrong.
    """
    n = len(assignment)
    if n == 0 or n > max_partitions:
        raise InvalidRequestError(
            f"replica assignment of {topic!r} has {n} partitions: use 1 to {max_partitions}"
        )
    if partitions not in (0, -1) and partitions != n:
        raise InvalidRequestError(
            f"topic {topic!r} asks for {partitions} partitions but its replica assignment "
            f"has {n}: give the same count, or -1 to take it from the assignment"
        )
    by_partition: dict[int, list[int]] = {}
    for partition, replicas in assignment:
        if partition < 0 or partition >= n:
            raise InvalidRequestError(
                f"replica assignment of {topic!r} names partition {partition}: with {n} "
                f"partitions they are numbered 0 to {n - 1}"
            )
        if partition in by_partition:
            raise InvalidRequestError(
                f"replica assignment of {topic!r} gives partition {partition} twice"
            )
        by_partition[partition] = list(replicas)
    # n entries, none repeated, all in 0..n-1: every partition is present.
    factor = replication_factor if replication_factor not in (0, -1) else len(by_partition[0])
    if factor < 1:
        raise InvalidRequestError(
            f"replica assignment of {topic!r}: replication factor {factor}; every "
            f"partition needs at least one replica"
        )
    live = set(live_broker_ids)
    for partition in range(n):
        replicas = by_partition[partition]
        if len(replicas) != factor:
            raise InvalidRequestError(
                f"replica assignment of {topic!r}: partition {partition} has "
                f"{len(replicas)} replicas, expected {factor} "
                + (
                    "(the replication factor asked for)"
                    if replication_factor not in (0, -1)
                    else "(as partition 0): every partition needs the same number"
                )
            )
        if len(set(replicas)) != len(replicas):
            raise InvalidRequestError(
                f"replica assignment of {topic!r}: partition {partition} lists a broker "
                f"twice ({':'.join(map(str, replicas))})"
            )
        unknown = [b for b in replicas if b not in live]
        if unknown:
            raise InvalidRequestError(
                f"replica assignment of {topic!r}: partition {partition} names broker "
                f"{unknown[0]}, which is not a live broker (live: "
                f"{', '.join(map(str, sorted(live))) or 'none'})"
            )
    return [by_partition[p] for p in range(n)]
