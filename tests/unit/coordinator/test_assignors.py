"""Property tests of the assignors: disjoint, complete, balanced, sticky, the same
target as the plain reference versions, and work that does not grow as
members x partitions."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from types import FrameType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tidelog.types import TopicPartition
from tidelog_coordinator import assignors
from tidelog_coordinator.assignors import ASSIGNORS, assign, cooperative_sticky_assign

from tests.unit.coordinator.reference_assignors import REFERENCE

Subs = dict[str, frozenset[str]]
Previous = Mapping[str, frozenset[TopicPartition]]

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


# ------------------------------------------------ same output as the reference

topic_names = st.sampled_from(["a", "b", "c", "d", "e"])
some_partitions = st.frozensets(
    st.builds(TopicPartition, topic_names, st.integers(0, 13)), max_size=25
)


@st.composite
def group_inputs(draw: st.DrawFn, alike: bool) -> tuple[Subs, dict[str, int], Previous]:
    """Subscriptions (all the same, or each its own), partition counts (some
    topics missing or empty) and a previous target with stale entries:
    members that left, partitions that no longer exist or that two claim."""
    counts = draw(st.dictionaries(topic_names, st.integers(0, 12)))
    members = draw(member_names)
    if alike:
        same = draw(st.frozensets(topic_names, min_size=1))
        subs = {m: same for m in members}
    else:
        subs = {m: draw(st.frozensets(topic_names, max_size=3)) for m in members}
    holders = draw(st.lists(st.sampled_from([*members, "gone"]), max_size=len(members) + 1))
    previous = {m: draw(some_partitions) for m in holders}
    return subs, counts, previous


@settings(max_examples=300, deadline=None)
@given(inputs=group_inputs(alike=True), name=st.sampled_from(sorted(ASSIGNORS)))
def test_same_target_as_the_reference_when_subscriptions_are_alike(
    inputs: tuple[Subs, dict[str, int], Previous], name: str
) -> None:
    subs, counts, previous = inputs
    assert assign(name, subs, counts, previous) == REFERENCE[name](subs, counts, previous)


@settings(max_examples=300, deadline=None)
@given(inputs=group_inputs(alike=False), name=st.sampled_from(sorted(ASSIGNORS)))
def test_same_target_as_the_reference_when_subscriptions_differ(
    inputs: tuple[Subs, dict[str, int], Previous], name: str
) -> None:
    subs, counts, previous = inputs
    assert assign(name, subs, counts, previous) == REFERENCE[name](subs, counts, previous)


def test_balanced_within_one_among_members_that_subscribe_alike() -> None:
    # Three kinds linked by shared topics: each kind ends within one.
    kinds = {"x": frozenset({"x"}), "xy": frozenset({"x", "y"}), "y": frozenset({"y"})}
    subs = {f"{kind}{i}": topics for kind, topics in kinds.items() for i in range(5)}
    previous = {"x0": frozenset(TopicPartition("x", p) for p in range(40))}
    out = cooperative_sticky_assign(subs, {"x": 40, "y": 7}, previous)
    for kind in kinds:
        loads = [len(out[f"{kind}{i}"]) for i in range(5)]
        assert max(loads) - min(loads) <= 1, (kind, loads)
    assert all(tp.topic in subs[m] for m, tps in out.items() for tp in tps)


# ------------------------------------------------ cost: no members x partitions

PARTITIONS = 2_000


def _lines_run(name: str, *args: object) -> int:
    """Python lines executed inside the assignors module by `assign(name,
    *args)`: a count of work that does not depend on the machine's speed or
    load."""
    lines = 0

    def in_module(frame: FrameType, event: str, arg: object) -> Callable[..., object] | None:
        nonlocal lines
        if event == "line":
            lines += 1
        return in_module

    def on_call(frame: FrameType, event: str, arg: object) -> Callable[..., object] | None:
        return in_module if frame.f_code.co_filename == assignors.__file__ else None

    previous_trace = sys.gettrace()
    sys.settrace(on_call)
    try:
        assign(name, *args)  # type: ignore[arg-type]
    finally:
        sys.settrace(previous_trace)
    return lines


def _one_topic(members: int, kinds: int) -> tuple[Subs, dict[str, int]]:
    # kinds=1: all subscribe to "a"; kinds=2: every other member also to "b".
    subs = {f"m{i:03d}": frozenset({"a"} if i % kinds == 0 else {"a", "b"}) for i in range(members)}
    return subs, {"a": PARTITIONS, "b": 40}


def _one_busy_topic_for_one(members: int, kinds: int) -> tuple[Subs, dict[str, int]]:
    # Round robin stepped over every member for each partition of "b".
    subs = {f"m{i:03d}": frozenset({"a"}) for i in range(members - 1)}
    return {**subs, "z": frozenset({"a", "b"})}, {"a": 40, "b": PARTITIONS}


def _many_topics(members: int, kinds: int) -> tuple[Subs, dict[str, int]]:
    # Range scanned every member for each topic: one member subscribes to
    # all topics (a wildcard), each other one to one topic.
    counts = {f"t{i:04d}": 1 for i in range(PARTITIONS)}
    subs = {f"m{i:03d}": frozenset({f"t{i:04d}"}) for i in range(1, members)}
    return {**subs, "m000": frozenset(counts)}, counts


@pytest.mark.parametrize(
    ("name", "shape", "kinds"),
    [
        ("cooperative-sticky", _one_topic, 1),
        ("cooperative-sticky", _one_topic, 2),
        ("roundrobin", _one_busy_topic_for_one, 1),
        ("range", _many_topics, 1),
    ],
)
def test_twice_the_members_is_not_twice_the_work(
    name: str, shape: Callable[[int, int], tuple[Subs, dict[str, int]]], kinds: int
) -> None:
    """With partitions far more than members, the work is mostly per
    partition: doubling the members adds a log factor and the per-member
    part, far from the doubling that members x partitions gives. Counted
    for a group formed from scratch and for one member joining it."""
    work = {}
    for members in (25, 50):
        subs, counts = shape(members, kinds)
        formed = assign(name, subs, counts)
        joined = {**subs, "new": subs[min(subs)]}
        work[members] = (
            _lines_run(name, subs, counts),
            _lines_run(name, joined, counts, formed),
        )
    for from_scratch in (0, 1):
        assert work[50][from_scratch] < 1.4 * work[25][from_scratch], work
