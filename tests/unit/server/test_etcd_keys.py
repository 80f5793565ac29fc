"""The etcd key layout's parsers and typed records (tidelog_server.etcd)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from tidelog.types import TopicPartition
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import PartitionState

topics = st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True)


@given(prefix=st.sampled_from(["/tidelog", "/t1-x", "/a/b"]), topic=topics, p=st.integers(0, 10**6))
def test_partition_state_keys_parse_back(prefix: str, topic: str, p: int) -> None:
    keys = Keys(prefix)
    key = keys.partition_state(topic, p)
    assert keys.parse_partition_state_key(key) == TopicPartition(topic, p)
    assert key.startswith(keys.all_partition_states)
    assert key.startswith(keys.partition_states(topic))


@given(
    prefix=st.sampled_from(["/tidelog", "/t1-x", "/a/b"]),
    group=st.text(min_size=1, max_size=30),
    tps=st.lists(st.tuples(topics, st.integers(0, 10**6)), max_size=5),
)
def test_a_commits_offset_keys_are_each_partitions_offset_key(
    prefix: str, group: str, tps: list[tuple[str, int]]
) -> None:
    keys = Keys(prefix)
    wanted = [TopicPartition(t, p) for t, p in tps]
    assert keys.offset_keys(group, wanted) == [keys.offset(group, tp) for tp in wanted]
    for key, tp in zip(keys.offset_keys(group, wanted), wanted, strict=True):
        assert keys.parse_offset_key(key) == (group, tp)


def test_other_keys_under_partitions_are_not_states() -> None:
    keys = Keys("/tidelog")
    for key in (
        b"/tidelog/partitions/t/0",
        b"/tidelog/partitions/t/0/other",
        b"/tidelog/partitions/t/x/state",
        b"/tidelog/partitions/t/-1/state",
        b"/tidelog/partitions/t/0/state/more",
    ):
        assert keys.parse_partition_state_key(key) is None, key


@given(
    leader=st.integers(-1, 1000),
    epoch=st.integers(0, 2**31 - 1),
    isr=st.lists(st.integers(0, 1000), max_size=5).map(tuple),
    version=st.integers(1, 10**6),
)
def test_partition_state_round_trips(
    leader: int, epoch: int, isr: tuple[int, ...], version: int
) -> None:
    state = PartitionState(leader, epoch, isr, version)
    assert PartitionState.decode(state.encode()) == state


def test_partition_state_reads_what_earlier_writers_wrote() -> None:
    # Missing fields take their defaults; the field order does not matter.
    assert PartitionState.decode(b'{"isr": [2, 1], "leader": 2}') == PartitionState(2, 0, (2, 1))
    assert PartitionState.decode(b"{}") == PartitionState()
    assert json.loads(PartitionState(1, 3, (1, 2), 4).encode()) == {
        "leader": 1,
        "leader_epoch": 3,
        "isr": [1, 2],
        "version": 4,
    }
