"""The group rules (pure): records and the cache (tidelog_coordinator.group_state),
the next generation and what a member may be pushed (group_coordinator's
next_group_state and pushable_assignment)."""

from __future__ import annotations

import asyncio
import json

from hypothesis import given
from hypothesis import strategies as st
from tidelog.types import TopicPartition
from tidelog_coordinator.group_coordinator import next_group_state, pushable_assignment
from tidelog_coordinator.group_state import (
    GroupCache,
    GroupState,
    GroupView,
    MemberRecord,
    new_member_token,
)
from tidelog_server.etcd import Change, WatchBatch
from tidelog_server.etcd.keys import Keys

KEYS = Keys("/g")


def tp(topic: str, partition: int) -> TopicPartition:
    return TopicPartition(topic, partition)


def member(key: str, topics: tuple[str, ...] = ("t",), **changes: object) -> MemberRecord:
    record = MemberRecord(
        member_key=key,
        member_id=key,
        instance_id="",
        client_id="c",
        topics=topics,
        pattern="",
        assignor="cooperative-sticky",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
    )
    return record.with_(**changes)


class Recorder:
    def __init__(self) -> None:
        self.changed: list[set[str]] = []

    async def __call__(self, group_ids: set[str]) -> None:
        self.changed.append(set(group_ids))


def cache_with(topics: dict[str, int]) -> GroupCache:
    cache = GroupCache(KEYS, Recorder())
    batch = WatchBatch(
        True,
        [
            Change(KEYS.topic(name), json.dumps({"partitions": [{}] * count}).encode(), 1)
            for name, count in topics.items()
        ],
    )
    asyncio.run(cache.apply_topics(batch))
    return cache


# ------------------------------------------------------------ records

tp_sets = st.frozensets(
    st.builds(tp, st.sampled_from(["a", "b.c", "d-e"]), st.integers(0, 1000)), max_size=8
)


@given(
    topics=st.lists(st.sampled_from(["a", "b", "c"]), max_size=3, unique=True),
    epoch=st.integers(0, 2**31),
    assigned=tp_sets,
    owned=tp_sets,
)
def test_a_member_record_reads_back_what_it_wrote(
    topics: list[str],
    epoch: int,
    assigned: frozenset[TopicPartition],
    owned: frozenset[TopicPartition],
) -> None:
    record = member("d:m1", tuple(topics), member_epoch=epoch, assigned=assigned, owned=owned)
    back = MemberRecord.from_kv(
        "d:m1", record.to_json(), lease=7, mod_revision=9, create_revision=3
    )
    assert back == record.with_(lease=7, mod_revision=9, create_revision=3)


@given(target=st.dictionaries(st.sampled_from(["m1", "m2", "m3"]), tp_sets, max_size=3))
def test_a_group_state_reads_back_what_it_wrote(
    target: dict[str, frozenset[TopicPartition]],
) -> None:
    state = GroupState(group_epoch=4, assignor="range", target=target)
    assert GroupState.from_kv(state.to_json(), mod_revision=11) == GroupState(
        4, "range", target, mod_revision=11
    )


def test_a_member_consumes_its_topics_that_exist_or_what_its_pattern_matches() -> None:
    existing = ["orders", "orders-eu", "payments"]
    assert member("m", ("orders", "gone")).subscribed(existing) == {"orders"}
    by_pattern = member("m", (), pattern="orders.*")
    assert by_pattern.subscribed(existing) == {"orders", "orders-eu"}
    # Full match, not search: "rders" alone matches nothing.
    assert member("m", (), pattern="rders").subscribed(existing) == frozenset()
    # A pattern RE2 refuses (written before RE2) subscribes to nothing.
    assert member("m", (), pattern="(?<=x)orders").subscribed(existing) == frozenset()


def test_only_the_members_own_token_acts_as_it() -> None:
    token, digest = new_member_token()
    record = member("m", token_sha256=digest)
    assert record.holds_token(token)
    assert not record.holds_token(new_member_token()[0])
    assert not record.holds_token("")
    # A record from before tokens existed accepts none, not every one.
    assert not member("m").holds_token("")


def test_a_group_is_stable_when_every_member_owns_its_target_at_the_current_epoch() -> None:
    assert GroupView().status() == "Empty"
    state = GroupState(group_epoch=3, target={"m1": frozenset({tp("t", 0)})})
    done = member("m1", owned=frozenset({tp("t", 0)}), member_epoch=3)
    assert GroupView({"m1": done}, state).status() == "Stable"
    assert GroupView({"m1": done.with_(owned=frozenset())}, state).status() == "Reconciling"
    assert GroupView({"m1": done.with_(member_epoch=2)}, state).status() == "Reconciling"


# ------------------------------------------------------------ the cache


def test_the_cache_follows_member_and_state_keys_and_forgets_empty_groups() -> None:
    calls = Recorder()
    cache = GroupCache(KEYS, calls)
    m1 = member("d:m1")
    state = GroupState(1, "range", {"d:m1": frozenset({tp("t", 0)})})
    asyncio.run(
        cache.apply_groups(
            WatchBatch(
                False,
                [
                    Change(KEYS.member("g1", "d:m1"), m1.to_json(), 5, 5, lease=42),
                    Change(KEYS.group_state("g1"), state.to_json(), 6),
                ],
            )
        )
    )
    view = cache.groups["g1"]
    assert view.members["d:m1"] == m1.with_(lease=42, mod_revision=5, create_revision=5)
    assert view.state == GroupState(1, "range", state.target, mod_revision=6)
    assert calls.changed == [{"g1"}]

    asyncio.run(
        cache.apply_groups(
            WatchBatch(
                False,
                [
                    Change(KEYS.member("g1", "d:m1"), None, 7),
                    Change(KEYS.group_state("g1"), None, 8),
                ],
            )
        )
    )
    assert "g1" not in cache.groups
    assert calls.changed[-1] == {"g1"}


def test_a_reset_replaces_every_group_and_reports_the_ones_that_went() -> None:
    calls = Recorder()
    cache = GroupCache(KEYS, calls)
    first = WatchBatch(False, [Change(KEYS.member("old", "d:m"), member("d:m").to_json(), 3)])
    asyncio.run(cache.apply_groups(first))
    fresh = WatchBatch(True, [Change(KEYS.member("new", "d:n"), member("d:n").to_json(), 9)])
    asyncio.run(cache.apply_groups(fresh))
    assert set(cache.groups) == {"new"}
    assert calls.changed[-1] == {"old", "new"}


def test_topic_changes_update_counts_and_pattern_matches() -> None:
    cache = cache_with({"orders": 3})
    by_pattern = member("m", (), pattern="orders.*")
    assert cache.subscribed(by_pattern) == {"orders"}
    batch = WatchBatch(False, [Change(KEYS.topic("orders-eu"), b'{"partitions":[{}]}', 2)])
    asyncio.run(cache.apply_topics(batch))
    assert cache.topics == {"orders": 3, "orders-eu": 1}
    assert cache.subscribed(by_pattern) == {"orders", "orders-eu"}
    asyncio.run(cache.apply_topics(WatchBatch(False, [Change(KEYS.topic("orders"), None, 3)])))
    assert cache.subscribed(by_pattern) == {"orders-eu"}


def _topic_change(name: str, partitions: int | None, revision: int = 5) -> Change:
    value = None if partitions is None else json.dumps({"partitions": [{}] * partitions}).encode()
    return Change(KEYS.topic(name), value, revision)


def test_a_topic_change_reconciles_only_the_groups_that_consume_the_topic() -> None:
    cache = cache_with({"orders": 3, "clicks": 2})
    recorder = Recorder()
    cache._on_group_change = recorder  # type: ignore[method-assign]
    joined = [
        ("by-name", member("a", ("orders",))),
        ("not-yet", member("b", ("payments",))),  # a topic that does not exist yet
        ("by-pattern", member("c", (), pattern="ord.*")),
        ("other", member("d", ("clicks",))),
    ]
    members = [Change(KEYS.member(group, m.member_key), m.to_json(), 3) for group, m in joined]
    asyncio.run(cache.apply_groups(WatchBatch(False, members)))
    recorder.changed.clear()

    asyncio.run(cache.apply_topics(WatchBatch(False, [_topic_change("orders", 6)])))
    assert recorder.changed[-1] == {"by-name", "by-pattern"}
    asyncio.run(cache.apply_topics(WatchBatch(False, [_topic_change("payments", 1)])))
    assert recorder.changed[-1] == {"not-yet"}
    asyncio.run(cache.apply_topics(WatchBatch(False, [_topic_change("orders-eu", 1)])))
    assert recorder.changed[-1] == {"by-pattern"}
    asyncio.run(cache.apply_topics(WatchBatch(False, [_topic_change("clicks", None)])))
    assert recorder.changed[-1] == {"other"}
    # Replicas moved, the partition count the same: no target can change.
    calls = len(recorder.changed)
    asyncio.run(cache.apply_topics(WatchBatch(False, [_topic_change("orders", 6)])))
    assert len(recorder.changed) == calls
    # A new view of every topic (a watch that started again): every group.
    asyncio.run(cache.apply_topics(WatchBatch(True, [_topic_change("orders", 6)])))
    assert recorder.changed[-1] == {"by-name", "not-yet", "by-pattern", "other"}


class _UnlistableTopics(dict):  # type: ignore[type-arg]
    """Topics that may be looked up and changed by name but not walked through."""

    def _walked(self, *args: object) -> None:
        raise AssertionError("every topic was matched again")

    __iter__ = items = keys = values = _walked  # type: ignore[assignment]


def test_a_topic_change_matches_remembered_patterns_against_the_changed_names_only() -> None:
    # Clearing them made the next reconcile match every pattern against every
    # topic again: patterns x topics per CreateTopics.
    cache = cache_with({f"orders-{n}": 1 for n in range(100)} | {"clicks": 1})
    by_pattern = member("m", (), pattern="orders-.*")
    assert len(cache.subscribed(by_pattern)) == 100
    cache.topics = _UnlistableTopics(cache.topics)
    changes = [_topic_change("orders-new", 2), _topic_change("orders-7", None)]
    asyncio.run(cache.apply_topics(WatchBatch(False, [*changes, _topic_change("other", 1)])))
    found = cache.subscribed(by_pattern)
    assert "orders-new" in found and "orders-7" not in found and len(found) == 100


# ------------------------------------------------------------ generations and pushes


def test_a_new_target_is_the_next_generation_and_an_unchanged_one_is_none() -> None:
    cache = cache_with({"t": 4})
    view = GroupView({"m1": member("m1")})
    first = next_group_state(view, cache)
    assert first is not None and first.group_epoch == 1
    assert first.target == {"m1": frozenset(tp("t", p) for p in range(4))}

    view.state = first
    assert next_group_state(view, cache) is None  # same members, same target

    view.put_member("m2", member("m2"))
    second = next_group_state(view, cache)
    assert second is not None and second.group_epoch == 2
    # Sticky: m1 keeps two of its four, m2 gets the other two.
    assert len(second.target["m1"]) == len(second.target["m2"]) == 2
    assert second.target["m1"] < first.target["m1"]

    assert next_group_state(GroupView(), cache) is None  # nobody left: no new state


def test_the_assignor_most_members_ask_for_wins_ties_go_to_the_first_name() -> None:
    cache = cache_with({"t": 2})
    view = GroupView(
        {
            "m1": member("m1", assignor="roundrobin"),
            "m2": member("m2", assignor="range"),
        }
    )
    state = next_group_state(view, cache)
    assert state is not None and state.assignor == "range"
    view.put_member("m3", member("m3", assignor="roundrobin"))
    state = next_group_state(view, cache)
    assert state is not None and state.assignor == "roundrobin"


def test_a_member_is_pushed_its_target_minus_what_others_still_own() -> None:
    p0, p1, p2 = tp("t", 0), tp("t", 1), tp("t", 2)
    state = GroupState(2, "cooperative-sticky", {"m1": frozenset({p0}), "m2": frozenset({p1, p2})})
    view = GroupView(
        {
            # m1 still owns p1, which moves to m2: m2 waits for it.
            "m1": member("m1", owned=frozenset({p0, p1})),
            "m2": member("m2", owned=frozenset()),
        },
        state,
    )
    assert pushable_assignment(view, "m1") == {p0}
    assert pushable_assignment(view, "m2") == {p2}
    view.put_member("m1", view.members["m1"].with_(owned=frozenset({p0})))  # released
    assert pushable_assignment(view, "m2") == {p1, p2}
    assert pushable_assignment(GroupView(view.members, None), "m1") == frozenset()


class _UnlistableMembers(dict):
    """Members that may be looked up by key but not walked through."""

    def _walked(self, *args: object) -> None:
        raise AssertionError("a push walked through every member of the group")

    __iter__ = items = values = keys = _walked  # type: ignore[assignment]


def test_a_push_costs_its_target_not_the_whole_group() -> None:
    # A reconcile pushes to each member on this replica: gathering what the
    # others own at every push cost members x partitions per reconcile.
    p0, p1 = tp("t", 0), tp("t", 1)
    state = GroupState(2, "cooperative-sticky", {"m1": frozenset({p0}), "m2": frozenset({p1})})
    view = GroupView({"m1": member("m1", owned=frozenset({p0, p1})), "m2": member("m2")}, state)
    view.members = _UnlistableMembers(view.members)
    assert pushable_assignment(view, "m1") == {p0}
    assert pushable_assignment(view, "m2") == frozenset()


def test_the_owner_counts_follow_member_changes() -> None:
    p0, p1 = tp("t", 0), tp("t", 1)
    view = GroupView({"m1": member("m1", owned=frozenset({p0, p1}))})
    view.put_member("m2", member("m2", owned=frozenset({p1})))
    assert view.owners == {p0: 1, p1: 2}
    view.put_member("m1", view.members["m1"].with_(owned=frozenset({p0})))
    assert view.owners == {p0: 1, p1: 1}
    view.remove_member("m2")
    view.remove_member("gone")
    assert dict(view.owners) == {p0: 1}
