"""Property tests of the assignors: disjoint, complete, balanced, sticky."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tidelog.types import TopicPartition
from tidelog_coordinator.assignors import ASSIGNORS, assign, cooperative_sticky_assign

topic_counts = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]), st.integers(1, 12), min_size=1
)
member_names = st.lists(
    st.text("mnopqrst", min_size=1, max_size=3), min_size=1, max_size=7, unique=True
)


def _all(counts: dict[str, int]) -> set[TopicPartition]:
    return {TopicPartition(t, p) for t, n in counts.items() for p in range(n)}


@settings(max_examples=150, deadline=None)
@given(counts=topic_counts, members=member_names, name=st.sampled_from(sorted(ASSIGNORS)))
def test_disjoint_and_complete(counts: dict[str, int], members: list[str], name: str) -> None:
    subs = {m: frozenset(counts) for m in members}
    out = assign(name, subs, counts)
    assert set(out) == set(members)
    seen: set[TopicPartition] = set()
    for parts in out.values():
        assert not parts & seen
        seen |= parts
    assert seen == _all(counts)


@settings(max_examples=150, deadline=None)
@given(
    counts=topic_counts,
    members=member_names,
    name=st.sampled_from(["roundrobin", "cooperative-sticky"]),
)
def test_balanced_within_one(counts: dict[str, int], members: list[str], name: str) -> None:
    out = assign(name, {m: frozenset(counts) for m in members}, counts)
    sizes = [len(v) for v in out.values()]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=200, deadline=None)
@given(
    counts=topic_counts,
    before=member_names,
    after=member_names,
)
def test_sticky_moves_the_minimum(
    counts: dict[str, int], before: list[str], after: list[str]
) -> None:
    topics = frozenset(counts)
    previous = cooperative_sticky_assign({m: topics for m in before}, counts)
    out = cooperative_sticky_assign({m: topics for m in after}, counts, previous)
    sizes = [len(v) for v in out.values()]
    assert max(sizes) - min(sizes) <= 1
    # Minimal movement: a surviving member keeps min(kept, quota) of its
    # partitions, where the biggest holders get the ceil quotas.
    total = len(_all(counts))
    floor, extra = divmod(total, len(after))
    kept = sorted((len(previous.get(m, frozenset())) for m in after), reverse=True)
    quotas = [floor + 1 if i < extra else floor for i in range(len(after))]
    best_kept = sum(min(k, q) for k, q in zip(kept, quotas, strict=True))
    actually_kept = sum(len(out[m] & previous.get(m, frozenset())) for m in after)
    assert actually_kept == best_kept


def test_adding_a_fourth_member_moves_only_its_share() -> None:
    counts = {"t": 24}
    three = {m: frozenset(counts) for m in ("a", "b", "c")}
    previous = cooperative_sticky_assign(three, counts)
    four = {**three, "d": frozenset(counts)}
    out = cooperative_sticky_assign(four, counts, previous)
    assert len(out["d"]) == 6
    for m in "abc":
        assert out[m] <= previous[m] and len(out[m]) == 6


def test_range_is_per_topic_contiguous() -> None:
    out = assign("range", {"a": frozenset({"t"}), "b": frozenset({"t"})}, {"t": 5})
    assert out["a"] == {TopicPartition("t", p) for p in (0, 1, 2)}
    assert out["b"] == {TopicPartition("t", p) for p in (3, 4)}


def test_only_subscribers_get_a_topic() -> None:
    subs = {"a": frozenset({"x"}), "b": frozenset({"y"})}
    for name in ASSIGNORS:
        out = assign(name, subs, {"x": 3, "y": 2})
        assert {tp.topic for tp in out["a"]} == {"x"}
        assert {tp.topic for tp in out["b"]} == {"y"}
