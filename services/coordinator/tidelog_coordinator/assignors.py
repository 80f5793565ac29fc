"""Partition assignors: pure functions from (members, subscriptions, partitions) to owners.

Run by the coordinator (assignment is server-side, KIP-848 style); a member
only names the assignor it wants. Every
assignor is deterministic: the same input gives the same output on every
coordinator replica, so replicas racing to write a group's new target
assignment write the same thing and the etcd transaction that compares the
group state's revision only decides who writes it.

- `range`: per topic, consecutive partitions to the subscribed members in
  member-id order (Kafka's RangeAssignor; balanced per topic, not overall).
- `roundrobin`: all partitions in (topic, partition) order dealt in turn to the
  subscribed members (Kafka's RoundRobinAssignor).
- `cooperative-sticky` (default): keeps every partition with its previous
  owner when it can, gives the rest to the least-loaded members, then moves
  as few partitions as possible until loads differ by at most one. With
  cooperative rebalancing, only the partitions that move are revoked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tidelog.group.membership import DEFAULT_ASSIGNOR
from tidelog.types import TopicPartition

#: member key -> partitions it should own.
AssignmentMap = dict[str, frozenset[TopicPartition]]
#: member key -> the topics it subscribes to (patterns already resolved).
Subscriptions = Mapping[str, frozenset[str]]

__all__ = ["ASSIGNORS", "DEFAULT_ASSIGNOR", "assign", "cooperative_sticky_assign"]


def _partitions(
    topics: frozenset[str] | set[str], counts: Mapping[str, int]
) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t in sorted(topics) if t in counts for p in range(counts[t])]


def range_assign(
    subscriptions: Subscriptions,
    partition_counts: Mapping[str, int],
    previous: Mapping[str, frozenset[TopicPartition]] | None = None,
) -> AssignmentMap:
    """Kafka's range assignor; `previous` is ignored."""
    out: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    topics = sorted({t for ts in subscriptions.values() for t in ts if t in partition_counts})
    for topic in topics:
        members = sorted(m for m, ts in subscriptions.items() if topic in ts)
        count = partition_counts[topic]
        per_member, extra = divmod(count, len(members))
        start = 0
        for i, member in enumerate(members):
            n = per_member + (1 if i < extra else 0)
            out[member].update(TopicPartition(topic, p) for p in range(start, start + n))
            start += n
    return {m: frozenset(ps) for m, ps in out.items()}


def roundrobin_assign(
    subscriptions: Subscriptions,
    partition_counts: Mapping[str, int],
    previous: Mapping[str, frozenset[TopicPartition]] | None = None,
) -> AssignmentMap:
    """Kafka's round-robin assignor; `previous` is ignored."""
    out: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    members = sorted(subscriptions)
    if not members:
        return {}
    all_topics = {t for ts in subscriptions.values() for t in ts}
    cursor = 0
    for tp in _partitions(all_topics, partition_counts):
        # Next member in turn that subscribes to the topic (one always does).
        for step in range(len(members)):
            member = members[(cursor + step) % len(members)]
            if tp.topic in subscriptions[member]:
                out[member].add(tp)
                cursor = (cursor + step + 1) % len(members)
                break
    return {m: frozenset(ps) for m, ps in out.items()}


def cooperative_sticky_assign(
    subscriptions: Subscriptions,
    partition_counts: Mapping[str, int],
    previous: Mapping[str, frozenset[TopicPartition]] | None = None,
) -> AssignmentMap:
    """Sticky and balanced: minimal movement from `previous` (the last target)."""
    previous = previous or {}
    members = sorted(subscriptions)
    owned: dict[str, set[TopicPartition]] = {m: set() for m in members}
    all_topics = {t for ts in subscriptions.values() for t in ts}
    valid = set(_partitions(all_topics, partition_counts))
    taken: set[TopicPartition] = set()
    # 1. Keep what each member had, when it still exists and is still subscribed.
    for member in members:
        for tp in sorted(previous.get(member, ())):
            if tp in valid and tp.topic in subscriptions[member] and tp not in taken:
                owned[member].add(tp)
                taken.add(tp)

    def eligible(tp: TopicPartition) -> list[str]:
        return [m for m in members if tp.topic in subscriptions[m]]

    # 2. Give each orphan to the least-loaded eligible member.
    for tp in sorted(valid - taken):
        candidates = eligible(tp)
        target = min(candidates, key=lambda m: (len(owned[m]), m))
        owned[target].add(tp)

    # 3. Move partitions from the most to the least loaded member, one at a
    # time, until no eligible pair differs by more than one. Moving only from
    # a member at the maximum keeps movement minimal. Bounded: each move
    # strictly reduces the sum of squared loads.
    moves_max = len(valid) * max(1, len(members))
    for _ in range(moves_max):
        moved = False
        for donor in sorted(members, key=lambda m: (-len(owned[m]), m)):
            for tp in sorted(owned[donor], reverse=True):
                receivers = [m for m in eligible(tp) if len(owned[m]) < len(owned[donor]) - 1]
                if receivers:
                    receiver = min(receivers, key=lambda m: (len(owned[m]), m))
                    owned[donor].discard(tp)
                    owned[receiver].add(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            break
    return {m: frozenset(ps) for m, ps in owned.items()}


ASSIGNORS: dict[
    str,
    Callable[
        [Subscriptions, Mapping[str, int], Mapping[str, frozenset[TopicPartition]] | None],
        AssignmentMap,
    ],
] = {
    "cooperative-sticky": cooperative_sticky_assign,
    "range": range_assign,
    "roundrobin": roundrobin_assign,
}


def assign(
    assignor: str,
    subscriptions: Subscriptions,
    partition_counts: Mapping[str, int],
    previous: Mapping[str, frozenset[TopicPartition]] | None = None,
) -> AssignmentMap:
    """Run the named assignor. Raises KeyError for an unknown name."""
    return ASSIGNORS[assignor](subscriptions, partition_counts, previous)
