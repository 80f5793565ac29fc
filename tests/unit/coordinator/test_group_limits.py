"""The Group service's limits (tidelog_coordinator.group_limits)."""

from __future__ import annotations

import pytest
from tidelog.errors import InvalidRequestError
from tidelog.v1 import group_pb2
from tidelog_coordinator import group_limits
from tidelog_coordinator.group_state import MemberRecord

pytestmark = pytest.mark.timeout(60)


def member(pattern: str) -> MemberRecord:
    return MemberRecord(
        member_key="d:x",
        member_id="x",
        instance_id="",
        client_id="",
        topics=(),
        pattern=pattern,
        assignor="range",
        session_timeout_ms=2000,
        rebalance_timeout_ms=2000,
    )


def test_backtracking_pattern_matches_in_linear_time() -> None:
    # Python's re never returns from this (2^n paths); RE2 answers at once.
    topics = ["a" * 249, "a" * 248 + "b", "t"]
    assert member("(a+)+b").subscribed(topics) == frozenset({"a" * 248 + "b"})
    assert member("(a|aa)*c").subscribed(topics) == frozenset()


def test_pattern_limits_name_the_limit() -> None:
    with pytest.raises(InvalidRequestError, match="at most 1000"):
        group_limits.compile_pattern("a" * 1001)
    with pytest.raises(InvalidRequestError, match="RE2"):
        group_limits.compile_pattern(r"(?=a)a")
    # Within the length limit, a program larger than REGEX_MAX_MEM_BYTES
    # (RE2's default would take it: 90,000 instructions) is refused too.
    with pytest.raises(InvalidRequestError, match="too large"):
        group_limits.compile_pattern("[a-z]{1000}" * 90)


def test_offsets_are_bounded_by_the_documented_maximum() -> None:
    def commit(offset: int) -> list[group_pb2.OffsetCommit]:
        return [group_pb2.OffsetCommit(topic="t", partition=0, offset=offset)]

    group_limits.check_offsets(commit(group_limits.OFFSET_MAX))
    for bad in (group_limits.OFFSET_MAX + 1, 2**63 - 1, -1, -2):
        with pytest.raises(InvalidRequestError, match="out of range"):
            group_limits.check_offsets(commit(bad))


def test_member_token_matches_only_its_own_hash() -> None:
    from tidelog_coordinator.group_state import new_member_token

    token, digest = new_member_token()
    record = member("").with_(token_sha256=digest)
    assert record.holds_token(token)
    assert not record.holds_token("")
    assert not record.holds_token(new_member_token()[0])
    assert not member("").holds_token("")  # a record from before tokens accepts none


def test_pattern_matches_are_remembered_and_follow_topic_changes() -> None:
    import asyncio

    from tidelog_coordinator.group_state import GroupCache
    from tidelog_server.etcd.keys import Keys
    from tidelog_server.etcd.records import TopicAssignment
    from tidelog_server.etcd.watch import Change, WatchBatch

    keys = Keys("/p")

    async def ignore(_: set[str]) -> None:
        return None

    def topic(name: str) -> Change:
        value = TopicAssignment(name, f"id-{name}", ((0,),), {}).encode()
        return Change(keys.topic(name), value, mod_revision=1)

    cache = GroupCache(keys, ignore)
    asyncio.run(cache.apply_topics(WatchBatch(reset=True, changes=[topic("a1"), topic("b1")])))
    first = cache.subscribed(member("a.*"))
    assert first == frozenset({"a1"})
    assert cache.subscribed(member("a.*")) is first  # matched once, then remembered
    assert cache.subscribed(member("")) == frozenset()  # a topic list, not a pattern
    asyncio.run(cache.apply_topics(WatchBatch(reset=False, changes=[topic("a2")])))
    assert cache.subscribed(member("a.*")) == frozenset({"a1", "a2"})
