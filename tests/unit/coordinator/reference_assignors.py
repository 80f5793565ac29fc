"""The assignors as they were before they were made near-linear, kept only as
test oracles: short and plainly right, but members x partitions (or worse) per
call, so never for the coordinator. The fast ones must give exactly the same
target on every input (replicas running either version agree)."""

from __future__ import annotations

from collections.abc import Mapping

from tidelog.types import TopicPartition

Previous = Mapping[str, frozenset[TopicPartition]] | None


def _partitions(topics: set[str], counts: Mapping[str, int]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t in sorted(topics) if t in counts for p in range(counts[t])]


def range_assign(
    subs: Mapping[str, frozenset[str]], counts: Mapping[str, int], previous: Previous = None
) -> dict[str, frozenset[TopicPartition]]:
    out: dict[str, set[TopicPartition]] = {m: set() for m in subs}
    for topic in sorted({t for ts in subs.values() for t in ts if t in counts}):
        members = sorted(m for m, ts in subs.items() if topic in ts)
        per_member, extra = divmod(counts[topic], len(members))
        start = 0
        for i, member in enumerate(members):
            n = per_member + (1 if i < extra else 0)
            out[member].update(TopicPartition(topic, p) for p in range(start, start + n))
            start += n
    return {m: frozenset(ps) for m, ps in out.items()}


def roundrobin_assign(
    subs: Mapping[str, frozenset[str]], counts: Mapping[str, int], previous: Previous = None
) -> dict[str, frozenset[TopicPartition]]:
    out: dict[str, set[TopicPartition]] = {m: set() for m in subs}
    members = sorted(subs)
    if not members:
        return {}
    cursor = 0
    for tp in _partitions({t for ts in subs.values() for t in ts}, counts):
        for step in range(len(members)):
            member = members[(cursor + step) % len(members)]
            if tp.topic in subs[member]:
                out[member].add(tp)
                cursor = (cursor + step + 1) % len(members)
                break
    return {m: frozenset(ps) for m, ps in out.items()}


def cooperative_sticky_assign(
    subs: Mapping[str, frozenset[str]], counts: Mapping[str, int], previous: Previous = None
) -> dict[str, frozenset[TopicPartition]]:
    previous = previous or {}
    members = sorted(subs)
    owned: dict[str, set[TopicPartition]] = {m: set() for m in members}
    valid = set(_partitions({t for ts in subs.values() for t in ts}, counts))
    taken: set[TopicPartition] = set()
    for member in members:
        for tp in sorted(previous.get(member, ())):
            if tp in valid and tp.topic in subs[member] and tp not in taken:
                owned[member].add(tp)
                taken.add(tp)

    def eligible(tp: TopicPartition) -> list[str]:
        return [m for m in members if tp.topic in subs[m]]

    for tp in sorted(valid - taken):
        owned[min(eligible(tp), key=lambda m: (len(owned[m]), m))].add(tp)
    while True:
        moved = False
        for donor in sorted(members, key=lambda m: (-len(owned[m]), m)):
            for tp in sorted(owned[donor], reverse=True):
                receivers = [m for m in eligible(tp) if len(owned[m]) < len(owned[donor]) - 1]
                if receivers:
                    owned[donor].discard(tp)
                    owned[min(receivers, key=lambda m: (len(owned[m]), m))].add(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return {m: frozenset(ps) for m, ps in owned.items()}


REFERENCE = {
    "cooperative-sticky": cooperative_sticky_assign,
    "range": range_assign,
    "roundrobin": roundrobin_assign,
}
