"""What the coordinator knows of consumer groups: records, and a cache fed by a watch.

`MemberRecord` and `GroupState` are the JSON values of the member and state
keys (see keys.py). `GroupCache` mirrors every key under `groups/` and
`topics/` through two PrefixWatchers, so each replica can compute targets and
pushes without reading etcd on every event; anything that fences (commits,
state writes) still compares revisions in etcd, so a stale cache can only
make a transaction fail and be retried, never write something wrong.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from tidelog.errors import InvalidRequestError
from tidelog.types import TopicPartition
from tidelog_server.etcd import WatchBatch
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import TopicAssignment

from tidelog_coordinator.group_limits import compile_pattern


def tps_to_json(tps: Iterable[TopicPartition]) -> list[list[Any]]:
    return [[tp.topic, tp.partition] for tp in sorted(tps)]


def tps_from_json(items: Iterable[Any]) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(str(t), int(p)) for t, p in items)


def new_member_token() -> tuple[str, str]:
    """A fresh member token and the hash of it that etcd keeps."""
    token = secrets.token_urlsafe(32)
    return token, _token_hash(token)


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One live member (the value of its lease-bound member key)."""

    member_key: str
    member_id: str
    instance_id: str
    client_id: str
    topics: tuple[str, ...]
    pattern: str
    assignor: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    #: Epoch of the last assignment sent to the member (commits must carry it).
    member_epoch: int = 0
    #: The last assignment sent.
    assigned: frozenset[TopicPartition] = frozenset()
    #: What the member acknowledged owning.
    owned: frozenset[TopicPartition] = frozenset()
    #: SHA-256 (hex) of the member's token: requests acting as the member
    #: (re-attach, commit, leave) must carry the token (see GroupCoordinator.join).
    token_sha256: str = ""
    # From etcd, not stored in the value:
    lease: int = 0
    mod_revision: int = 0
    create_revision: int = 0

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "member_id": self.member_id,
                "instance_id": self.instance_id,
                "client_id": self.client_id,
                "topics": list(self.topics),
                "pattern": self.pattern,
                "assignor": self.assignor,
                "session_timeout_ms": self.session_timeout_ms,
                "rebalance_timeout_ms": self.rebalance_timeout_ms,
                "member_epoch": self.member_epoch,
                "assigned": tps_to_json(self.assigned),
                "owned": tps_to_json(self.owned),
                "token_sha256": self.token_sha256,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_kv(
        cls, member_key: str, value: bytes, lease: int, mod_revision: int, create_revision: int
    ) -> MemberRecord:
        d = json.loads(value)
        return cls(
            member_key=member_key,
            member_id=d["member_id"],
            instance_id=d.get("instance_id", ""),
            client_id=d.get("client_id", ""),
            topics=tuple(d.get("topics", ())),
            pattern=d.get("pattern", ""),
            assignor=d.get("assignor", ""),
            session_timeout_ms=int(d.get("session_timeout_ms", 0)),
            rebalance_timeout_ms=int(d.get("rebalance_timeout_ms", 0)),
            member_epoch=int(d.get("member_epoch", 0)),
            assigned=tps_from_json(d.get("assigned", ())),
            owned=tps_from_json(d.get("owned", ())),
            token_sha256=d.get("token_sha256", ""),
            lease=lease,
            mod_revision=mod_revision,
            create_revision=create_revision,
        )

    def subscribed(self, topic_names: Collection[str]) -> frozenset[str]:
        """The topics this member consumes among those that exist
        (`topic_names`: a set or a dict of them, looked up by name)."""
        if self.pattern:
            return _pattern_matches(self.pattern, topic_names)
        return frozenset(t for t in self.topics if t in topic_names)

    def consumes_any(self, names: Collection[str]) -> bool:
        """Whether this member consumes (or would consume, once it exists) a
        topic of `names`."""
        if self.pattern:
            return bool(_pattern_matches(self.pattern, names))
        return any(t in names for t in self.topics)

    def holds_token(self, token: str) -> bool:
        """Whether `token` is this member's (constant-time; a record without
        a token, written before tokens existed, accepts none)."""
        return bool(self.token_sha256) and hmac.compare_digest(
            self.token_sha256, _token_hash(token)
        )

    def with_(self, **changes: Any) -> MemberRecord:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class GroupState:
    """The group's generation and target assignment (the state key)."""

    group_epoch: int = 0
    assignor: str = ""
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)
    mod_revision: int = 0

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "group_epoch": self.group_epoch,
                "assignor": self.assignor,
                "target": {m: tps_to_json(tps) for m, tps in sorted(self.target.items())},
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_kv(cls, value: bytes, mod_revision: int) -> GroupState:
        d = json.loads(value)
        return cls(
            group_epoch=int(d["group_epoch"]),
            assignor=d.get("assignor", ""),
            target={m: tps_from_json(v) for m, v in d.get("target", {}).items()},
            mod_revision=mod_revision,
        )


def _pattern_matches(pattern: str, names: Iterable[str]) -> frozenset[str]:
    try:
        regex = compile_pattern(pattern)
    except InvalidRequestError:
        # Joins validate patterns; a record written before RE2 (a
        # Python-only construct) subscribes to nothing until it rejoins.
        return frozenset()
    return frozenset(name for name in names if regex.fullmatch(name))


@dataclass(slots=True)
class GroupView:
    """A group's members and state. Change `members` only through put_member
    and remove_member, which keep `owners` current."""

    members: dict[str, MemberRecord] = field(default_factory=dict)
    state: GroupState | None = None
    #: Partition -> how many members own it (more than one only while it
    #: moves): what a push asks of every partition of a target, kept by each
    #: member change instead of gathered from all members at every push
    #: (members x partitions per reconcile).
    owners: Counter[TopicPartition] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.owners = Counter()
        for member in self.members.values():
            self.owners.update(member.owned)

    def put_member(self, member_key: str, record: MemberRecord) -> None:
        self.remove_member(member_key)
        self.members[member_key] = record
        self.owners.update(record.owned)

    def remove_member(self, member_key: str) -> None:
        old = self.members.pop(member_key, None)
        if old is None:
            return
        for tp in old.owned:
            left = self.owners[tp] - 1
            if left > 0:
                self.owners[tp] = left
            else:
                del self.owners[tp]

    def member_by_id(self, member_id: str) -> MemberRecord | None:
        for member in self.members.values():
            if member.member_id == member_id:
                return member
        return None

    def status(self) -> str:
        """Kafka-like state name: Empty, Reconciling or Stable."""
        if not self.members:
            return "Empty"
        target = self.state.target if self.state else {}
        for key, member in self.members.items():
            if member.owned != target.get(key, frozenset()):
                return "Reconciling"
            if self.state is not None and member.member_epoch != self.state.group_epoch:
                return "Reconciling"
        return "Stable"


#: Distinct patterns whose matches GroupCache remembers at once.
PATTERN_MATCHES_MAX = 10_000


class GroupCache:
    """Groups and topic partition counts as of the last watch events."""

    def __init__(self, keys: Keys, on_group_change: Callable[[set[str]], Awaitable[None]]) -> None:
        self.keys = keys
        self.groups: dict[str, GroupView] = {}
        #: topic -> partition count.
        self.topics: dict[str, int] = {}
        self._on_group_change = on_group_change
        #: pattern -> the topics it matches among `topics`, brought up to
        #: date with the names a topic change names. RE2 is linear, but its
        #: Python binding costs about 2 us a name (10k topics: 20 ms, 25x
        #: Python's `re` on simple patterns), so each distinct pattern is
        #: matched against every topic once, and then against each topic
        #: created or deleted, instead of once per member per reconcile.
        self._matches: dict[str, frozenset[str]] = {}

    def subscribed(self, member: MemberRecord) -> frozenset[str]:
        """The existing topics `member` consumes."""
        if not member.pattern:
            return member.subscribed(self.topics)
        found = self._matches.get(member.pattern)
        if found is None:
            if len(self._matches) >= PATTERN_MATCHES_MAX:
                self._matches.clear()
            found = self._matches[member.pattern] = member.subscribed(self.topics)
        return found

    async def apply_groups(self, batch: WatchBatch) -> None:
        changed: set[str] = set()
        if batch.reset:
            changed.update(self.groups)
            self.groups = {}
        for change in batch.changes:
            parsed = self.keys.parse_group_key(change.key)
            if parsed is None:
                continue
            group_id, kind, member_key = parsed
            view = self.groups.setdefault(group_id, GroupView())
            changed.add(group_id)
            if kind == "state":
                view.state = (
                    None
                    if change.value is None
                    else GroupState.from_kv(change.value, change.mod_revision)
                )
            elif change.value is None:
                view.remove_member(member_key)
            else:
                view.put_member(
                    member_key,
                    MemberRecord.from_kv(
                        member_key,
                        change.value,
                        change.lease,
                        change.mod_revision,
                        change.create_revision,
                    ),
                )
            if not view.members and view.state is None:
                del self.groups[group_id]
        await self._on_group_change(changed)

    async def apply_topics(self, batch: WatchBatch) -> None:
        """Topics created, deleted or given partitions: the groups whose
        members consume one of them are reconciled (partition counts feed
        their targets); the others' targets cannot change. Any topic change
        reaches every coordinator, so marking every group cost a reconcile of
        each, assignor included, per CreateTopics anywhere in the cluster."""
        if batch.reset:
            self.topics = {}
        counted: set[str] = set()
        for change in batch.changes:
            name = self.keys.tail(change.key, self.keys.topics)
            count = None
            if change.value is not None:
                count = len(TopicAssignment.decode(change.value).replicas)
            if self.topics.get(name) != count:
                counted.add(name)
            if count is None:
                self.topics.pop(name, None)
            else:
                self.topics[name] = count
        if batch.reset:
            # What was there before is unknown: everything is matched again.
            self._matches.clear()
            await self._on_group_change(set(self.groups))
            return
        if not counted:
            return  # replicas moved, partition counts the same: no target changes
        self._rematch(counted)
        affected = {
            group_id
            for group_id, view in self.groups.items()
            if any(member.consumes_any(counted) for member in view.members.values())
        }
        await self._on_group_change(affected)

    def _rematch(self, names: set[str]) -> None:
        """Bring the remembered pattern matches up to date with `names`,
        each created or deleted (patterns x names, not patterns x topics)."""
        existing = {name for name in names if name in self.topics}
        gone = names - existing
        for pattern, found in self._matches.items():
            matched = _pattern_matches(pattern, existing)
            if matched or (gone & found):
                self._matches[pattern] = (found - gone) | matched
