"""Consumer group membership: sessions, target assignments, and pushing them.

The protocol is KIP-848's, with etcd as the group's memory:

- A member's session is its member key bound to its own etcd lease (TTL =
  session timeout). The replica serving the member's Heartbeat stream
  refreshes the lease on each request; when the member dies its requests
  stop, the lease expires, etcd deletes the key, and every replica's watch
  sees it.
- The group's target assignment (and its generation, `group_epoch`) is in the
  group state key. Any replica that serves members of the group, and the
  controller, recompute it whenever members, subscriptions or topics change.
  Assignors are deterministic, so racing replicas compute the same target;
  the write compares the state key's mod revision, so exactly one lands per
  generation and the others see it through the watch.
- Cooperative, incremental handover: a member is pushed its target minus the
  partitions another member still owns. Owners that must give a partition
  up are pushed an assignment without it, release it, and acknowledge; that
  acknowledgement (owned partitions in the member key) reaches the other
  replicas through the watch, and the new owner is pushed the partition.
  Partitions that do not move are never revoked.
- Before pushing an assignment, the serving replica writes its epoch into
  the member key (comparing the key's mod revision), so a commit on any
  replica can check the member's epoch in etcd (fencing).
- A member id is public (DescribeGroup shows it), so it proves nothing. The
  join that creates a member answers, on that stream only, a random member
  token; the member key keeps its SHA-256. Everything that acts as an
  existing member from outside its stream (re-attaching after a reconnect,
  committing, leaving) must carry the token, so another client that read the
  id can neither take over the session nor remove the member. Requests
  inside a stream are bound to it already. A static member restarting with
  its group_instance_id still takes over its key as before (that is what a
  static name is for), under a new id and a new token.

`GroupCoordinator` is not thread-safe: one event loop. Per stream, pushes
and acknowledgements are serialised by the stream's lock.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import aetcd
from tidelog.errors import (
    InvalidRequestError,
    TidelogError,
    UnknownMemberIdError,
)
from tidelog.types import TopicPartition
from tidelog.v1 import common_pb2, group_pb2
from tidelog_server.etcd import is_unavailable
from tidelog_server.etcd.keys import Keys, dynamic_member_key, static_member_key

from tidelog_coordinator.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, assign
from tidelog_coordinator.errors import error_proto
from tidelog_coordinator.group_limits import GROUP_MAX_MEMBERS, check_heartbeat, validate_group_id
from tidelog_coordinator.group_state import (
    GroupCache,
    GroupState,
    GroupView,
    MemberRecord,
    new_member_token,
)

log = logging.getLogger("tidelog.coordinator.groups")

SESSION_TIMEOUT_MIN_MS = 2_000  # etcd's shortest dependable lease
SESSION_TIMEOUT_MAX_MS = 30 * 60_000
SESSION_TIMEOUT_DEFAULT_MS = 45_000
REBALANCE_TIMEOUT_DEFAULT_MS = 60_000
HEARTBEAT_INTERVAL_MAX_MS = 5_000
#: Attempts of a compare-and-put on a member key before giving up (each
#: failure means the key changed meanwhile; we re-read and try again).
MEMBER_UPDATE_ATTEMPTS = 5
REBALANCE_TIMEOUT_MAX_MS = 30 * 60_000


def tp_protos(tps: frozenset[TopicPartition]) -> list[common_pb2.TopicPartition]:
    return [common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(tps)]


def next_group_state(view: GroupView, cache: GroupCache) -> GroupState | None:
    """The group's next state, or None when its target does not change (pure).

    The assignor most members ask for wins (ties: the name that sorts first);
    with the same assignor, the previous target of members still present is
    the starting point (sticky). A new target is a new generation: the group
    epoch goes up by one, and only then."""
    if not view.members:
        return None
    subscriptions = {k: cache.subscribed(m) for k, m in view.members.items()}
    votes = collections.Counter(m.assignor for m in view.members.values())
    assignor = min(votes, key=lambda a: (-votes[a], a))
    counts = {t: cache.topics[t] for subs in subscriptions.values() for t in subs}
    state = view.state
    previous = {}
    if state is not None and state.assignor == assignor:
        previous = {k: v for k, v in state.target.items() if k in view.members}
    target = assign(assignor, subscriptions, counts, previous)
    if state is not None and state.assignor == assignor and state.target == target:
        return None
    epoch = (state.group_epoch if state else 0) + 1
    return GroupState(group_epoch=epoch, assignor=assignor, target=target)


def pushable_assignment(view: GroupView, member_key: str) -> frozenset[TopicPartition]:
    """What a member may be given now: its target minus the partitions
    another member still owns (they move once released; pure). Costs the
    size of its target, whatever the size of the group."""
    if view.state is None:
        return frozenset()
    target = view.state.target.get(member_key, frozenset())
    member = view.members.get(member_key)
    own = member.owned if member is not None else frozenset()
    return frozenset(tp for tp in target if view.owners[tp] == (1 if tp in own else 0))


@dataclass(eq=False)
class MemberStream:
    """One member's Heartbeat stream on this replica."""

    group_id: str
    member_key: str
    member_id: str
    lease_id: int
    rebalance_timeout_ms: int
    heartbeat_interval_ms: int
    #: Revision at which the member key was written on join: the cache must
    #: reach it before a missing key means "session gone".
    join_revision: int
    #: Responses to send; None ends the stream.
    outbox: asyncio.Queue[group_pb2.GroupHeartbeatResponse | None] = field(
        default_factory=asyncio.Queue
    )
    last_pushed: tuple[int, frozenset[TopicPartition]] | None = None
    #: Monotonic deadline for releasing partitions it must give up.
    revoke_deadline: float | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False

    def close(self, error: TidelogError | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        if error is not None:
            self.outbox.put_nowait(
                group_pb2.GroupHeartbeatResponse(
                    error=error_proto(error, "serving the group session"),
                    member_id=self.member_id,
                )
            )
        self.outbox.put_nowait(None)


class GroupCoordinator:
    """Joins, heartbeats, leaves, target computation and pushes."""

    def __init__(
        self,
        client: aetcd.Client,
        keys: Keys,
        is_controller: Callable[[], bool],
        cache_revision: Callable[[], int],
        max_members: int = GROUP_MAX_MEMBERS,
    ) -> None:
        self.client = client
        self.keys = keys
        self.cache = GroupCache(keys, self._on_groups_changed)
        self.is_controller = is_controller
        self.cache_revision = cache_revision
        self.max_members = max_members
        #: group id -> member key -> stream served here.
        self.local: dict[str, dict[str, MemberStream]] = {}
        self._dirty: set[str] = set()
        self._drainer: asyncio.Task[None] | None = None
        #: Called with a group id when this replica wrote its new generation
        #: (metrics count rebalances).
        self.on_generation: Callable[[str], None] = lambda _group_id: None

    # ------------------------------------------------------------ join / leave

    async def join(self, req: group_pb2.GroupHeartbeatRequest) -> MemberStream:
        """Admit a member (new, re-attaching, or a restarted static instance)."""
        check_heartbeat(req)
        group_id = validate_group_id(req.group_id)
        session_ms = req.session_timeout_ms or SESSION_TIMEOUT_DEFAULT_MS
        if not SESSION_TIMEOUT_MIN_MS <= session_ms <= SESSION_TIMEOUT_MAX_MS:
            raise InvalidRequestError(
                f"session_timeout_ms={session_ms} is out of range: use "
                f"{SESSION_TIMEOUT_MIN_MS} to {SESSION_TIMEOUT_MAX_MS}"
            )
        rebalance_ms = req.rebalance_timeout_ms or REBALANCE_TIMEOUT_DEFAULT_MS
        if not 1 <= rebalance_ms <= REBALANCE_TIMEOUT_MAX_MS:
            raise InvalidRequestError(
                f"rebalance_timeout_ms={rebalance_ms} is out of range: use 1 to "
                f"{REBALANCE_TIMEOUT_MAX_MS}"
            )
        assignor = req.assignor or DEFAULT_ASSIGNOR
        if assignor not in ASSIGNORS:
            raise InvalidRequestError(
                f"unknown assignor {assignor!r}: use one of {', '.join(sorted(ASSIGNORS))}"
            )
        if not req.subscribed_topic_regex and not req.subscribed_topics:
            raise InvalidRequestError("subscribe to at least one topic or a topic pattern")
        ttl_s = max(2, math.ceil(session_ms / 1000))
        instance_id = req.group_instance_id
        if instance_id:
            member_key = static_member_key(instance_id)
        elif req.member_id:
            member_key = dynamic_member_key(req.member_id)
        else:
            member_key = dynamic_member_key(uuid.uuid4().hex)
        key = self.keys.member(group_id, member_key)
        fresh = MemberRecord(
            member_key=member_key,
            member_id=member_key[2:] if not instance_id else uuid.uuid4().hex,
            instance_id=instance_id,
            client_id=req.client_id,
            topics=tuple(sorted(set(req.subscribed_topics))),
            pattern=req.subscribed_topic_regex,
            assignor=assignor,
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
        )
        tx = self.client.transactions
        token = ""  # answered only when this join creates the member
        existing = await self._read_member(group_id, member_key)
        if existing is not None and req.member_id and existing.member_id == req.member_id:
            if not existing.holds_token(req.member_token):
                raise UnknownMemberIdError(
                    f"member {req.member_id} of group {group_id!r}: the member_token does "
                    "not match (only the client that created a member can re-attach)"
                )
            # Re-attach (after a reconnect to this replica): same lease, same
            # state; only the subscription may have changed.
            record = existing.with_(
                topics=fresh.topics,
                pattern=fresh.pattern,
                assignor=assignor,
                client_id=fresh.client_id,
                rebalance_timeout_ms=rebalance_ms,
            )
            lease_id = existing.lease
            ok, responses = await self.client.transaction(
                compare=[tx.mod(key) == existing.mod_revision],
                success=[tx.put(key, record.to_json(), lease=lease_id)],
                failure=[],
            )
            if not ok:
                raise UnknownMemberIdError("the member changed while re-attaching: join again")
            await self.client.refresh_lease(lease_id)
        elif req.member_id and not instance_id:
            raise UnknownMemberIdError(
                f"member {req.member_id} of group {group_id!r} is unknown (its session "
                "expired): join again as a new member"
            )
        else:
            if existing is None:
                self._check_room(group_id)
            lease = await self.client.lease(ttl_s)
            lease_id = lease.id
            token, token_sha256 = new_member_token()
            if existing is not None:
                # A static instance restarted: it takes over the old key (and so
                # the old target, with no rebalance) under a new member id and
                # token, which fences the previous process.
                record = fresh.with_(member_epoch=existing.member_epoch, token_sha256=token_sha256)
                compare = [tx.mod(key) == existing.mod_revision]
            else:
                record = fresh.with_(token_sha256=token_sha256)
                compare = [tx.create(key) == 0]
            ok, responses = await self.client.transaction(
                compare=compare, success=[tx.put(key, record.to_json(), lease=lease_id)], failure=[]
            )
            if not ok:
                await self._revoke_quietly(lease_id)
                raise UnknownMemberIdError("another member joined with the same id: join again")
            if existing is not None:
                await self._revoke_quietly(existing.lease)
        revision = responses[0].response_put.header.revision
        interval_ms = max(200, min(HEARTBEAT_INTERVAL_MAX_MS, session_ms // 3))
        stream = MemberStream(
            group_id=group_id,
            member_key=member_key,
            member_id=record.member_id,
            lease_id=lease_id,
            rebalance_timeout_ms=rebalance_ms,
            heartbeat_interval_ms=interval_ms,
            join_revision=revision,
        )
        previous = self.local.setdefault(group_id, {}).get(member_key)
        if previous is not None:
            previous.close(UnknownMemberIdError("another stream took over this member"))
        self.local[group_id][member_key] = stream
        log.info("member %s (%s) joined group %r", record.member_id, member_key, group_id)
        stream.outbox.put_nowait(
            group_pb2.GroupHeartbeatResponse(
                member_id=record.member_id,
                member_epoch=record.member_epoch,
                heartbeat_interval_ms=interval_ms,
                member_token=token,
            )
        )
        self._mark_dirty({group_id})
        return stream

    def _check_room(self, group_id: str) -> None:
        members = len(self.cache.groups.get(group_id, GroupView()).members)
        if members >= self.max_members:
            raise InvalidRequestError(
                f"group {group_id!r} has {members} members: at most {self.max_members} "
                "(--group-max-members)"
            )

    async def heartbeat(self, stream: MemberStream, req: group_pb2.GroupHeartbeatRequest) -> None:
        """Keep the session alive; record an acknowledgement."""
        check_heartbeat(req)
        if req.member_id and req.member_id != stream.member_id:
            # The stream is bound to the member it joined as.
            raise InvalidRequestError("member_id differs from the member this stream joined as")
        reply = await self.client.refresh_lease(stream.lease_id)
        if reply is None or reply.TTL <= 0:
            stream.close(UnknownMemberIdError("the member's session expired: join again"))
            return
        if req.HasField("ack"):
            owned = frozenset(TopicPartition(tp.topic, tp.partition) for tp in req.ack.owned)
            # A member owns only what it was assigned (or owned and has not
            # released yet): claiming other partitions would keep them from
            # their real owners.
            async with stream.lock:
                await self._update_member(
                    stream, lambda rec: rec.with_(owned=owned & (rec.assigned | rec.owned))
                )
        if stream.revoke_deadline is not None and time.monotonic() > stream.revoke_deadline:
            log.warning(
                "member %s of %r did not release partitions within %d ms: removing it",
                stream.member_id,
                stream.group_id,
                stream.rebalance_timeout_ms,
            )
            record = await self._find_member(stream.group_id, stream.member_id)
            if record is not None:
                await self._remove(stream.group_id, record)
            stream.close(
                UnknownMemberIdError(
                    "removed from the group: partitions were not released within "
                    "rebalance_timeout_ms"
                )
            )

    def detach(self, stream: MemberStream) -> None:
        """The stream ended. The lease is left to expire: the member may come
        back (reconnect, static restart) within its session timeout."""
        streams = self.local.get(stream.group_id, {})
        if streams.get(stream.member_key) is stream:
            del streams[stream.member_key]
            if not streams:
                del self.local[stream.group_id]
        stream.close()

    async def leave(self, group_id: str, member_id: str, member_token: str) -> None:
        """A member leaves now; only with its token (see the module doc)."""
        validate_group_id(group_id)
        record = await self._find_member(group_id, member_id)
        if record is None:
            raise UnknownMemberIdError(f"member {member_id} is not in group {group_id!r}")
        if not record.holds_token(member_token):
            raise UnknownMemberIdError(
                f"member {member_id} of group {group_id!r}: the member_token does not match"
            )
        await self._remove(group_id, record)

    async def _remove(self, group_id: str, record: MemberRecord) -> None:
        """Remove a member now: its key is deleted and its lease revoked."""
        member_id = record.member_id
        tx = self.client.transactions
        key = self.keys.member(group_id, record.member_key)
        await self.client.transaction(
            compare=[tx.mod(key) == record.mod_revision], success=[tx.delete(key)], failure=[]
        )
        await self._revoke_quietly(record.lease)
        local = self.local.get(group_id, {}).get(record.member_key)
        if local is not None and local.member_id == member_id:
            local.close()
        log.info("member %s left group %r", member_id, group_id)

    # ------------------------------------------------------------ reconcile

    async def _on_groups_changed(self, group_ids: set[str]) -> None:
        self._mark_dirty(group_ids)

    def _mark_dirty(self, group_ids: set[str]) -> None:
        # Coalesce: a watch batch names each changed group once, and the
        # batches that arrive before the drainer runs cost one reconcile per
        # group, not one per batch.
        self._dirty |= group_ids
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name="group-reconcile")

    async def _drain(self) -> None:
        await asyncio.sleep(0)
        while self._dirty:
            group_id = self._dirty.pop()
            try:
                await self._reconcile(group_id)
            except Exception as exc:
                # Retried on the next change of the group (every write we or
                # anyone makes produces one) or the next heartbeat.
                level = logging.INFO if is_unavailable(exc) else logging.ERROR
                log.log(
                    level,
                    "reconciling group %r failed: %s",
                    group_id,
                    exc,
                    exc_info=level > logging.INFO,
                )

    async def _reconcile(self, group_id: str) -> None:
        view = self.cache.groups.get(group_id, GroupView())
        streams = self.local.get(group_id, {})
        if not streams and not self.is_controller():
            return
        new_state = next_group_state(view, self.cache)
        if new_state is not None:
            await self._write_state(group_id, view.state, new_state)
            return  # the watch event of the write brings us back here
        for stream in list(streams.values()):
            async with stream.lock:
                await self._push(stream, view)

    async def _write_state(self, group_id: str, old: GroupState | None, new: GroupState) -> None:
        tx = self.client.transactions
        key = self.keys.group_state(group_id)
        compare = tx.create(key) == 0 if old is None else tx.mod(key) == old.mod_revision
        ok, _ = await self.client.transaction(
            compare=[compare], success=[tx.put(key, new.to_json())], failure=[]
        )
        if ok:
            log.info("group %r: generation %d (%s)", group_id, new.group_epoch, new.assignor)
            self.on_generation(group_id)

    async def _push(self, stream: MemberStream, view: GroupView) -> None:
        if stream.closed:
            return
        member = view.members.get(stream.member_key)
        if member is None:
            if self.cache_revision() >= stream.join_revision:
                stream.close(UnknownMemberIdError("the member's session expired: join again"))
            return
        if member.member_id != stream.member_id:
            stream.close(
                UnknownMemberIdError("another instance with the same group_instance_id joined")
            )
            return
        if view.state is None:
            return
        assignment = pushable_assignment(view, stream.member_key)
        epoch = view.state.group_epoch
        if member.owned - assignment:
            if stream.revoke_deadline is None:
                stream.revoke_deadline = time.monotonic() + stream.rebalance_timeout_ms / 1000
        else:
            stream.revoke_deadline = None
        if stream.last_pushed == (epoch, assignment):
            return
        written = await self._update_member(
            stream, lambda rec: rec.with_(member_epoch=epoch, assigned=assignment)
        )
        if not written:
            return
        stream.last_pushed = (epoch, assignment)
        stream.outbox.put_nowait(
            group_pb2.GroupHeartbeatResponse(
                member_id=stream.member_id,
                member_epoch=epoch,
                heartbeat_interval_ms=stream.heartbeat_interval_ms,
                assignment=group_pb2.Assignment(partitions=tp_protos(assignment)),
                group_epoch=epoch,
            )
        )

    # ------------------------------------------------------------ etcd helpers

    async def _update_member(
        self, stream: MemberStream, change: Callable[[MemberRecord], MemberRecord]
    ) -> bool:
        """Compare-and-put `change(record)` on the member key; False if fenced."""
        tx = self.client.transactions
        key = self.keys.member(stream.group_id, stream.member_key)
        record = self.cache.groups.get(stream.group_id, GroupView()).members.get(stream.member_key)
        for _ in range(MEMBER_UPDATE_ATTEMPTS):
            if record is None or record.member_id != stream.member_id:
                record = await self._read_member(stream.group_id, stream.member_key)
                if record is None or record.member_id != stream.member_id:
                    stream.close(UnknownMemberIdError("the member's session ended: join again"))
                    return False
            new = change(record)
            if new == record:
                return True
            ok, _ = await self.client.transaction(
                compare=[tx.mod(key) == record.mod_revision],
                success=[tx.put(key, new.to_json(), lease=stream.lease_id)],
                failure=[],
            )
            if ok:
                return True
            record = None  # changed meanwhile: read it again
        return False

    async def _read_member(self, group_id: str, member_key: str) -> MemberRecord | None:
        got = await self.client.get(self.keys.member(group_id, member_key))
        if got is None:
            return None
        return MemberRecord.from_kv(
            member_key, got.value, got.lease, got.mod_revision, got.create_revision
        )

    async def _find_member(self, group_id: str, member_id: str) -> MemberRecord | None:
        """The member with this id, read from etcd (the cache may lag)."""
        prefix = self.keys.members(group_id)
        for kv in await self.client.get_prefix(prefix):
            record = MemberRecord.from_kv(
                self.keys.tail(kv.key, prefix),
                kv.value,
                kv.lease,
                kv.mod_revision,
                kv.create_revision,
            )
            if record.member_id == member_id:
                return record
        return None

    async def _revoke_quietly(self, lease_id: int) -> None:
        try:
            await self.client.revoke_lease(lease_id)
        except Exception as exc:
            # It then expires by itself within the session timeout.
            log.info("revoking lease %x failed: %s", lease_id, exc)

    async def close_all(self, error: TidelogError) -> None:
        """End every stream (shutdown): members reconnect to another replica."""
        for streams in list(self.local.values()):
            for stream in list(streams.values()):
                stream.close(error)
