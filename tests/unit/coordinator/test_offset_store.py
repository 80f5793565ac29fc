"""What a commit accepts (tidelog_coordinator.offset_store): the entry rules
(pure), and the member fencing of a commit against a real etcd."""

from __future__ import annotations

import asyncio
import json

import pytest
from tidelog.errors import (
    IllegalGenerationError,
    InvalidRequestError,
    InvalidTopicError,
    NonEmptyGroupError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
)
from tidelog.types import TopicPartition
from tidelog_coordinator.config import CoordinatorConfig
from tidelog_coordinator.group_coordinator import GroupCoordinator
from tidelog_coordinator.group_limits import OFFSET_MAX, OFFSET_METADATA_MAX_BYTES
from tidelog_coordinator.group_state import MemberRecord, new_member_token
from tidelog_coordinator.offset_store import (
    OffsetEntry,
    OffsetStore,
    offset_value,
    validate_entries,
)
from tidelog_server.etcd import connect
from tidelog_server.etcd.keys import Keys

from tests.support.etcd import EtcdProcess

TOPICS = {"orders": 2}


def entry(
    partition: int = 0, offset: int = 5, metadata: str = "", topic: str = "orders"
) -> OffsetEntry:
    return OffsetEntry(TopicPartition(topic, partition), offset, metadata)


def test_entries_within_the_limits_are_accepted() -> None:
    validate_entries([entry(0, 0), entry(1, OFFSET_MAX, "x" * OFFSET_METADATA_MAX_BYTES)], TOPICS)
    validate_entries([], TOPICS)


@pytest.mark.parametrize(
    ("entries", "error", "says"),
    [
        ([entry(0), entry(0, 7)], InvalidRequestError, "orders-0 appears twice"),
        ([entry(offset=-1)], InvalidRequestError, f"out of range: 0 to {OFFSET_MAX}"),
        ([entry(offset=OFFSET_MAX + 1)], InvalidRequestError, "out of range"),
        (
            [entry(metadata="é" * (OFFSET_METADATA_MAX_BYTES // 2 + 1))],
            InvalidRequestError,
            f"longer than {OFFSET_METADATA_MAX_BYTES} bytes",
        ),
        ([entry(2)], UnknownTopicOrPartitionError, "orders-2 does not exist"),
        ([entry(-1)], UnknownTopicOrPartitionError, "orders--1 does not exist"),
        ([entry(topic="gone")], UnknownTopicOrPartitionError, "gone-0 does not exist"),
        ([entry(topic="bad/name")], InvalidTopicError, "bad/name"),
    ],
)
def test_entries_outside_the_rules_are_refused_with_the_reason(
    entries: list[OffsetEntry], error: type[Exception], says: str
) -> None:
    with pytest.raises(error) as raised:
        validate_entries(entries, TOPICS)
    assert says in str(raised.value)


def test_a_commit_without_a_member_is_refused_before_etcd_is_asked() -> None:
    async def run() -> None:
        # Nothing listens on port 1: reaching etcd would fail differently.
        client = connect("127.0.0.1:1")
        keys = Keys("/none")
        store = OffsetStore(
            client,
            keys,
            CoordinatorConfig(),
            GroupCoordinator(client, keys, lambda: False, lambda: 0),
        )
        with pytest.raises(UnknownMemberIdError, match="AlterOffsets"):
            await store.commit("g", "", 0, "", [entry()])
        await client.close()

    asyncio.run(run())


def test_a_commit_is_fenced_by_the_members_key_token_and_epoch(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    async def run() -> None:
        client = connect(etcd.endpoint)
        keys = Keys(prefix.decode().rstrip("/"))
        groups = GroupCoordinator(client, keys, lambda: False, lambda: 0)
        groups.cache.topics.update(TOPICS)
        store = OffsetStore(client, keys, CoordinatorConfig(), groups)
        try:
            token, digest = new_member_token()
            record = MemberRecord(
                member_key="d:m1",
                member_id="m1",
                instance_id="",
                client_id="c",
                topics=("orders",),
                pattern="",
                assignor="range",
                session_timeout_ms=10_000,
                rebalance_timeout_ms=10_000,
                member_epoch=3,
                token_sha256=digest,
            )
            lease = await client.lease(30)
            await client.put(keys.member("g", "d:m1"), record.to_json(), lease=lease.id)

            with pytest.raises(UnknownMemberIdError, match="not in group"):
                await store.commit("g", "m2", 3, token, [entry()])
            with pytest.raises(UnknownMemberIdError, match="member_token does not match"):
                await store.commit("g", "m1", 3, new_member_token()[0], [entry()])
            with pytest.raises(
                IllegalGenerationError, match="epoch 2 of m1 is stale: current is 3"
            ):
                await store.commit("g", "m1", 2, token, [entry()])
            assert await store.fetch("g", [TopicPartition("orders", 0)]) == [
                OffsetEntry(TopicPartition("orders", 0), -1)
            ]

            await store.commit("g", "m1", 3, token, [entry(0, 42, "meta")])
            (committed,) = await store.fetch("g", [TopicPartition("orders", 0)])
            assert (committed.offset, committed.metadata) == (42, "meta")
            stored = await client.get(keys.offset("g", TopicPartition("orders", 0)))
            assert stored is not None and json.loads(stored.value)["offset"] == 42

            # An administrator changes offsets only of a group without members.
            with pytest.raises(NonEmptyGroupError):
                await store.alter("g", [entry(0, 1)])
            await client.revoke_lease(lease.id)  # the member's session ends
            with pytest.raises(UnknownMemberIdError):
                await store.commit("g", "m1", 3, token, [entry(0, 50)])
            await store.alter("g", [entry(0, 1)])
            (committed,) = await store.fetch("g", [TopicPartition("orders", 0)])
            assert committed.offset == 1
        finally:
            await client.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("offset", "metadata", "commit_time_ms"),
    [
        (0, "", 0),
        (OFFSET_MAX, "x" * OFFSET_METADATA_MAX_BYTES, 1_700_000_000_000),
        (42, 'quote " backslash \\ slash / newline \n tab \t nul \0 del \x7f', 5),
        (7, "é 中文 emoji \U0001f600 lone surrogate \ud800", 9),
    ],
)
def test_an_offsets_value_is_the_bytes_json_wrote(
    offset: int, metadata: str, commit_time_ms: int
) -> None:
    written = json.dumps(
        {"offset": offset, "metadata": metadata, "commit_time_ms": commit_time_ms},
        separators=(",", ":"),
    ).encode()
    assert offset_value(offset, metadata, commit_time_ms) == written
    assert json.loads(offset_value(offset, metadata, commit_time_ms)) == {
        "offset": offset,
        "metadata": metadata,
        "commit_time_ms": commit_time_ms,
    }
