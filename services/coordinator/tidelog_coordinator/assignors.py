"""Partition assignors: pure functions from (members, subscriptions, partitions) to owners.

Run by the coordinator (assignment is server-side, KIP-848 style); a member
only names the assignor it wants. Every
assignor is deterministic: the same input gives the same output on every
coordinator replica, so replicas racing to write a group's new target
assignment write the same thing and the etcd transaction that compares the
group state's revision only decides who writes it. So nothing here depends
on the iteration order of a set or on hashing: members, topics and partitions
are always taken in sorted order where the order can change the result.

- `range`: per topic, consecutive partitions to the subscribed members in
  member-id order (Kafka's RangeAssignor; balanced per topic, not overall).
- `roundrobin`: all partitions in (topic, partition) order dealt in turn to the
  subscribed members (Kafka's RoundRobinAssignor).
- `cooperative-sticky` (default): keeps every partition with its previous
  owner when it can, gives the rest to the least-loaded members, then moves
  as few partitions as possible until loads differ by at most one. With
  cooperative rebalancing, only the partitions that move are revoked.

They run on the coordinator's event loop on every change of a group, and a
client controls both the members (up to --group-max-members) and the
partitions, so each costs about (members + partitions) x log(members) plus
the size of the subscriptions, never members x partitions (see
`cooperative_sticky_assign` for its one slower case).
"""

from __future__ import annotations

import bisect
import heapq
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


def _subscribers(
    members: list[str], subscriptions: Subscriptions, partition_counts: Mapping[str, int]
) -> dict[str, list[int]]:
    """Topic -> the positions in `members` (sorted) of its subscribers, ascending.

    One pass over the subscriptions instead of one pass over the members per
    topic. A subscription's iteration order does not matter: each list gets
    its positions in member order."""
    subscribers: dict[str, list[int]] = {}
    for position, member in enumerate(members):
        for topic in subscriptions[member]:
            if topic in partition_counts:
                subscribers.setdefault(topic, []).append(position)
    return subscribers


def range_assign(
    subscriptions: Subscriptions,
    partition_counts: Mapping[str, int],
    previous: Mapping[str, frozenset[TopicPartition]] | None = None,
) -> AssignmentMap:
    """Kafka's range assignor; `previous` is ignored."""
    members = sorted(subscriptions)
    out: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    subscribers = _subscribers(members, subscriptions, partition_counts)
    for topic in sorted(subscribers):
        positions = subscribers[topic]
        count = partition_counts[topic]
        per_member, extra = divmod(count, len(positions))
        start = 0
        for i, position in enumerate(positions):
            n = per_member + (1 if i < extra else 0)
            out[members[position]].update(TopicPartition(topic, p) for p in range(start, start + n))
            start += n
    return {m: frozenset(ps) for m, ps in out.items()}


def roundrobin_assign(
    subscriptions: Subscriptions,
    partition_counts: Mapping[str, int],
    previous: Mapping[str, frozenset[TopicPartition]] | None = None,
) -> AssignmentMap:
    """Kafka's round-robin assignor; `previous` is ignored."""
    members = sorted(subscriptions)
    out: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    if not members:
        return {}
    subscribers = _subscribers(members, subscriptions, partition_counts)
    cursor = 0
    for tp in _partitions(set(subscribers), partition_counts):
        # The next member in turn that subscribes to the topic (one always
        # does), found by bisection: stepping over the members who do not
        # subscribe cost up to members x partitions.
        positions = subscribers[tp.topic]
        found = bisect.bisect_left(positions, cursor)
        position = positions[found] if found < len(positions) else positions[0]
        out[members[position]].add(tp)
        cursor = (position + 1) % len(members)
    return {m: frozenset(ps) for m, ps in out.items()}


def cooperative_sticky_assign(
    subscriptions: Subscriptions,
    partition_counts: Mapping[str, int],
    previous: Mapping[str, frozenset[TopicPartition]] | None = None,
) -> AssignmentMap:
    """Sticky and balanced: minimal movement from `previous` (the last target).

    1. Each member keeps what it had, when the partition still exists and the
       member still subscribes to its topic (a partition two members claim
       stays with the first by member id).
    2. Each other partition, in (topic, partition) order, goes to the
       least-loaded eligible member (ties: the first by member id).
    3. While some member holds a partition that an eligible member with at
       least two fewer could take, the first such member in (most loaded,
       member id) order gives its last such partition to the least-loaded
       eligible member. So members with the same subscriptions end within one
       of each other, and only partitions of members at the top move.

    Members interact only through the topics they share, so each connected
    set of members (linked by shared topics) is balanced alone; the moves of
    step 3 in one set never change another's. When all members of a set
    subscribe to the same topics (the common case), steps 2 and 3 take
    O((members + partitions) x log(members)): every partition may go to
    anyone, so a heap of loads answers "least loaded" and "most loaded", and
    a receiver never gives again, so at most one move per partition. When
    their subscriptions differ, step 3 looks for the first member that can
    give, in load order, at each move: O((skipped + 1) x (log(members) +
    topics it holds x subscription sets per topic)) per move, where skipped
    counts the more loaded members that could give nothing; each move lowers
    the sum of the squared loads, so there are finitely many, and in practice
    about one per partition that moves. A shape that makes every move skip
    most members costs up to about members x topics per member x moves (0.8 s
    for 1,000 members, 500 of them skipped by each of ~1,500 moves, where the
    old loop took minutes); step 2 stays O(subscriptions + partitions x
    log(members)).
    """
    previous = previous or {}
    members = sorted(subscriptions)
    # Topics without partitions cannot change the result: leave them out, so
    # that members differing only in those still count as subscribing alike.
    subscribed = {
        m: frozenset(t for t in subscriptions[m] if partition_counts.get(t, 0) > 0) for m in members
    }
    # Every assignable partition, in (topic, partition) order; partitions are
    # handled as their positions in this list, which sort the same way.
    order: list[TopicPartition] = []
    first_of: dict[str, int] = {}
    for topic in sorted({t for ts in subscribed.values() for t in ts}):
        first_of[topic] = len(order)
        order.extend(TopicPartition(topic, p) for p in range(partition_counts[topic]))
    position_of = {tp: i for i, tp in enumerate(order)}

    # 1. Keep what each member had, when it still exists and is still subscribed.
    kept: dict[str, list[int]] = {m: [] for m in members}
    taken: set[int] = set()
    for member in members:
        for tp in sorted(previous.get(member, ())):
            position = position_of.get(tp)
            if position is not None and tp.topic in subscribed[member] and position not in taken:
                kept[member].append(position)
                taken.add(position)

    owned: dict[str, list[int]] = {m: [] for m in members}
    for component in _connected_members(members, subscribed):
        orphans = [
            i
            for topic in sorted({t for m in component for t in subscribed[m]})
            for i in range(first_of[topic], first_of[topic] + partition_counts[topic])
            if i not in taken
        ]
        if len({subscribed[m] for m in component}) == 1:
            owned.update(_balance_alike(component, kept, orphans))
        else:
            owned.update(_balance_mixed(component, subscribed, kept, orphans, order))
    return {m: frozenset(order[i] for i in owned[m]) for m in members}


def _connected_members(
    members: list[str], subscribed: Mapping[str, frozenset[str]]
) -> list[list[str]]:
    """The members in sets linked by shared topics, each set sorted, the sets
    in the order of their first member; members with no topic are left out."""
    parent: dict[str, str] = {}

    def root(topic: str) -> str:
        while parent[topic] != topic:
            parent[topic] = parent[parent[topic]]
            topic = parent[topic]
        return topic

    for member in members:
        for topic in subscribed[member]:
            parent.setdefault(topic, topic)
        linked = sorted(subscribed[member])
        for topic in linked[1:]:
            # Whichever root wins, the sets are the same: only which topic
            # names a set depends on it, and names are only looked up.
            a, b = root(linked[0]), root(topic)
            if a != b:
                parent[b] = a
    components: dict[str, list[str]] = {}
    for member in members:
        if subscribed[member]:
            components.setdefault(root(min(subscribed[member])), []).append(member)
    return list(components.values())


def _balance_alike(
    members: list[str], kept: Mapping[str, list[int]], orphans: list[int]
) -> dict[str, list[int]]:
    """Steps 2 and 3 for members that all subscribe to the same topics.

    Any partition may go to any of them, so step 2's receiver is the least
    loaded member overall and step 3's giver the most loaded one; one heap
    each (entries made stale by a later load are skipped). A member that
    received in step 3 was at the minimum load, which never falls, so it
    never gives again: at most one move per partition. Returns member ->
    positions held."""
    held = {m: [-i for i in kept[m]] for m in members}
    for heap in held.values():
        heapq.heapify(heap)
    lightest = [(len(held[m]), m) for m in members]
    heapq.heapify(lightest)
    # 2. Each orphan to the least-loaded member.
    for position in orphans:
        load, member = lightest[0]
        heapq.heapreplace(lightest, (load + 1, member))
        heapq.heappush(held[member], -position)
    # 3. The most loaded gives its last partition to the least loaded until
    # they are within one.
    heaviest = [(-len(held[m]), m) for m in members]
    heapq.heapify(heaviest)
    while True:
        while -heaviest[0][0] != len(held[heaviest[0][1]]):
            heapq.heappop(heaviest)
        while lightest[0][0] != len(held[lightest[0][1]]):
            heapq.heappop(lightest)
        giver, receiver = heaviest[0][1], lightest[0][1]
        if len(held[receiver]) >= len(held[giver]) - 1:
            break
        heapq.heappush(held[receiver], heapq.heappop(held[giver]))
        for member in (giver, receiver):
            heapq.heappush(heaviest, (-len(held[member]), member))
            heapq.heappush(lightest, (len(held[member]), member))
    return {m: [-i for i in heap] for m, heap in held.items()}


def _balance_mixed(
    members: list[str],
    subscribed: Mapping[str, frozenset[str]],
    kept: Mapping[str, list[int]],
    orphans: list[int],
    order: list[TopicPartition],
) -> dict[str, list[int]]:
    """Steps 2 and 3 for linked members whose subscriptions differ.

    Members with the same subscriptions form a kind, with one heap of loads;
    the least-loaded subscriber of a topic is the best of its kinds' heaps.
    Returns member -> positions held."""
    load = {m: len(kept[m]) for m in members}
    # member -> topic -> max-heap of the negated positions it holds there.
    held: dict[str, dict[str, list[int]]] = {m: {} for m in members}
    for member in members:
        for position in kept[member]:
            held[member].setdefault(order[position].topic, []).append(-position)
        for heap in held[member].values():
            heapq.heapify(heap)

    kinds: dict[frozenset[str], list[str]] = {}
    for member in members:
        kinds.setdefault(subscribed[member], []).append(member)
    kind_of = {m: subscribed[m] for m in members}
    kinds_of_topic: dict[str, list[frozenset[str]]] = {}
    for kind in kinds:
        for topic in kind:
            kinds_of_topic.setdefault(topic, []).append(kind)

    def take(member: str, position: int) -> None:
        heapq.heappush(held[member].setdefault(order[position].topic, []), -position)
        load[member] += 1

    # 2. Each orphan to the least-loaded subscriber of its topic; one heap per
    # topic, over its subscribers only.
    index = 0
    while index < len(orphans):
        topic = order[orphans[index]].topic
        subscribers = [(load[m], m) for kind in kinds_of_topic[topic] for m in kinds[kind]]
        heapq.heapify(subscribers)
        while index < len(orphans) and order[orphans[index]].topic == topic:
            least, member = subscribers[0]
            heapq.heapreplace(subscribers, (least + 1, member))
            take(member, orphans[index])
            index += 1

    # 3. Moves, as in the docstring of cooperative_sticky_assign.
    heaviest = [(-load[m], m) for m in members]
    heapq.heapify(heaviest)
    lightest_of_kind = {
        kind: [(load[m], m) for m in kind_members] for kind, kind_members in kinds.items()
    }
    for by_load in lightest_of_kind.values():
        heapq.heapify(by_load)

    def lightest_in(kind: frozenset[str]) -> tuple[int, str]:
        heap = lightest_of_kind[kind]
        while heap[0][0] != load[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0]

    while True:
        # The least-loaded subscriber of each topic, computed once per move.
        lightest_of_topic: dict[str, tuple[int, str]] = {}
        skipped: list[tuple[int, str]] = []
        seen: set[str] = set()
        move: tuple[str, str, str] | None = None
        while heaviest and move is None:
            entry = heapq.heappop(heaviest)
            giver_load, giver = -entry[0], entry[1]
            if giver_load != load[giver] or giver in seen:
                continue  # stale, or a second entry for the same load
            if giver_load < 2:
                skipped.append(entry)
                break  # nobody can take from this one or any after it
            skipped.append(entry)
            seen.add(giver)
            for topic in sorted(kind_of[giver], reverse=True):
                if not held[giver].get(topic):
                    continue
                if topic not in lightest_of_topic:
                    lightest_of_topic[topic] = min(lightest_in(k) for k in kinds_of_topic[topic])
                receiver_load, receiver = lightest_of_topic[topic]
                if receiver_load < giver_load - 1:
                    move = (giver, topic, receiver)
                    break
        for entry in skipped:
            heapq.heappush(heaviest, entry)
        if move is None:
            break
        giver, topic, receiver = move
        take(receiver, -heapq.heappop(held[giver][topic]))
        load[giver] -= 1
        for member in (giver, receiver):
            heapq.heappush(heaviest, (-load[member], member))
            heapq.heappush(lightest_of_kind[kind_of[member]], (load[member], member))
    return {m: [-i for heap in held[m].values() for i in heap] for m in members}


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
