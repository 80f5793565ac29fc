"""Admin operations on existing partitions, over etcd: adding partitions to a
topic, preferred-leader election, and starting, changing, cancelling and
listing replica reassignments (their completion is the controller's:
reassignment_driver).

Every write is a transaction that compares the mod revision of each key it
read (the topic record, the partition state), so it never overwrites a
change made meanwhile (an ISR change by the leader, a leader election by the
controller, another admin call): it re-reads and tries again, a few times.
Any coordinator replica may serve these calls; the compares serialise them
with the controller's own writes.

Safe for concurrent use on one event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aetcd
from tidelog.errors import (
    ElectionNotNeededError,
    InvalidPartitionsError,
    InvalidRequestError,
    NoReassignmentInProgressError,
    PreferredLeaderNotAvailableError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from tidelog.names import validate_topic_name
from tidelog.types import TopicPartition
from tidelog_server.election_rule import LogFigures
from tidelog_server.etcd.records import (
    PartitionState,
    Reassignment,
    TopicAssignment,
)

from tidelog_coordinator import reassignment as rules
from tidelog_coordinator.leader_election import (
    LiveBrokers,
    decide,
    read_live_brokers,
    topic_min_isr,
)
from tidelog_coordinator.metadata import MAX_PARTITIONS, TOPICS_READ_ONE_BY_ONE, MetadataManager
from tidelog_coordinator.placement import BrokerSlot, check_capacity, place_replicas

#: Attempts of one read-compare-write before the call gives up (each failed
#: attempt means a key changed meanwhile). The topic record is written by
#: others too (the controller completing a move, a broker's ISR change), so
#: losing several races in a row is normal while a topic is busy.
WRITE_ATTEMPTS = 12
#: The pause before the second attempt; it doubles each time up to the max,
#: jittered, so that a busy writer does not win every race (at most ~1.5 s
#: in all).
RETRY_PAUSE_MIN_S = 0.005
RETRY_PAUSE_MAX_S = 0.25
#: Partitions of one ElectLeaders call elected at the same time (each one
#: whose leader changes is an etcd transaction).
ELECTION_CONCURRENCY = 32


async def write_attempts(attempts: int = WRITE_ATTEMPTS) -> AsyncIterator[int]:
    """The attempts of one optimistic read-compare-write, with a growing,
    jittered pause between them."""
    pause_s = RETRY_PAUSE_MIN_S
    for attempt in range(attempts):
        if attempt:
            await asyncio.sleep(random.uniform(0, pause_s))
            pause_s = min(pause_s * 2, RETRY_PAUSE_MAX_S)
        yield attempt


@dataclass(frozen=True, slots=True)
class ElectionResult:
    tp: TopicPartition
    leader: int
    error: Exception | None


@dataclass(frozen=True, slots=True)
class OngoingReassignment:
    tp: TopicPartition
    reassignment: Reassignment
    replicas: tuple[int, ...]
    leader: int
    isr: tuple[int, ...]


class PartitionAdmin:
    """CreatePartitions, ElectLeaders, Alter/ListPartitionReassignments."""

    def __init__(self, metadata: MetadataManager) -> None:
        self.metadata = metadata
        self.client: aetcd.Client = metadata.client
        self.keys = metadata.keys

    # ------------------------------------------------------------ reads

    async def _topic(self, name: str) -> tuple[TopicAssignment, Any]:
        validate_topic_name(name)
        got = await self.client.get(self.keys.topic(name))
        if got is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return TopicAssignment.decode(got.value), got

    async def _state(self, tp: TopicPartition) -> tuple[PartitionState, Any]:
        got = await self.client.get(self.keys.partition_state(tp.topic, tp.partition))
        return self._decoded(tp, got)

    @staticmethod
    def _decoded(tp: TopicPartition, got: Any) -> tuple[PartitionState, Any]:
        """A partition state read from etcd (None: not written yet)."""
        if got is None:
            raise UnknownTopicOrPartitionError(
                f"{tp.topic}-{tp.partition} has no state yet (being created): retry"
            )
        return PartitionState.decode(got.value), got

    # ------------------------------------------------------------ partitions

    async def create_partitions(
        self,
        name: str,
        total: int,
        assignment: Sequence[tuple[int, Sequence[int]]],
        validate_only: bool,
    ) -> int:
        """Grow topic `name` to `total` partitions (placed by `assignment`,
        (partition, broker ids) pairs for the new ones, or as a new topic's
        are); returns the count it had. The new partitions' states are
        written with the topic record, their first replica leading."""
        tx = self.client.transactions
        async for _ in write_attempts():
            topic, got = await self._topic(name)
            current = len(topic.replicas)
            if total <= current:
                raise InvalidPartitionsError(
                    f"topic {name!r} has {current} partitions and {total} were asked for: "
                    f"the count can only grow (ask for more than {current})"
                )
            if total > MAX_PARTITIONS:
                raise InvalidPartitionsError(
                    f"{total} partitions requested for {name!r}: use at most {MAX_PARTITIONS}"
                )
            first = topic.reassignments.get(0)
            factor = len(first.target) if first is not None else len(topic.replicas[0])
            brokers = await self.metadata.live_brokers()
            live = [b.broker_id for b in brokers]
            if assignment:
                placement = _check_new_assignment(name, assignment, current, total, factor, live)
            else:
                slots = [BrokerSlot(b.broker_id, b.rack) for b in brokers]
                placement = place_replicas(name, slots, total, factor)[current:]
            check_capacity(
                name,
                placement,
                await self.metadata.hosted_replicas(),
                {b.broker_id: b.max_partitions for b in brokers},
            )
            if validate_only:
                return current
            grown = dataclasses.replace(
                topic,
                replicas=topic.replicas + tuple(tuple(r) for r in placement),
                version=topic.version + 1,
            )
            states = [
                tx.put(
                    self.keys.partition_state(name, current + i),
                    PartitionState(replicas[0], 0, tuple(replicas)).encode(),
                )
                for i, replicas in enumerate(placement)
            ]
            topic_key = self.keys.topic(name)
            chunk = max(1, self.metadata.config.etcd_max_txn_ops - 2)
            ok, responses = await self.client.transaction(
                compare=[tx.mod(topic_key) == got.mod_revision],
                success=[tx.put(topic_key, grown.encode()), *states[:chunk]],
                failure=[],
            )
            if not ok:
                continue  # the topic changed meanwhile: read it again
            written = responses[0].response_put.header.revision
            # More states than one transaction takes (etcd's --max-txn-ops):
            # the rest follow while the topic record is the one written
            # (brokers treat a partition without a state as not ready yet).
            for i in range(chunk, len(states), chunk):
                ok, _ = await self.client.transaction(
                    compare=[tx.mod(topic_key) == written],
                    success=states[i : i + chunk],
                    failure=[],
                )
                if not ok:
                    raise UnknownTopicOrPartitionError(
                        f"topic {name!r} changed while its partitions were being added: "
                        "describe it and retry"
                    )
            return current
        raise RequestTimedOutError(f"topic {name!r} kept changing while adding partitions: retry")

    # ------------------------------------------------------------ elections

    async def elect_preferred(
        self, wanted: Sequence[TopicPartition] | None
    ) -> list[ElectionResult]:
        """Make the preferred replica (the first) lead each partition of
        `wanted` (every partition when None) when it is alive and in the ISR.

        The states are read with one range read per topic named (one in all
        for many topics or every partition), not one read per partition: electing the 10,000
        partitions of one topic must not take 10,000 etcd round trips, most
        of them for partitions whose preferred replica already leads. Only
        the partitions that change are written, ELECTION_CONCURRENCY at a
        time."""
        # A replica whose log is offline is never elected (leader_election).
        brokers = await read_live_brokers(self.client, self.keys)
        registered = brokers.registered
        topics = {
            t.name: t
            for t in (
                TopicAssignment.decode(kv.value)
                for kv in await self.client.get_prefix(self.keys.topics)
            )
        }
        named = {tp.topic for tp in wanted or () if tp.topic in topics}
        if wanted is not None and len(named) <= TOPICS_READ_ONE_BY_ONE:
            prefixes = [self.keys.partition_states(name) for name in sorted(named)]
        else:
            prefixes = [self.keys.all_partition_states]
        if wanted is None:
            wanted = [
                TopicPartition(name, p)
                for name in sorted(topics)
                for p in range(len(topics[name].replicas))
            ]
        states: dict[bytes, Any] = {}
        for prefix in prefixes:
            states.update((kv.key, kv) for kv in await self.client.get_prefix(prefix))
        writers = asyncio.Semaphore(ELECTION_CONCURRENCY)

        async def elect(tp: TopicPartition) -> ElectionResult:
            read = states.get(self.keys.partition_state(tp.topic, tp.partition))
            async with writers:
                offline = brokers.offline_of(tp.topic, tp.partition)
                torn = brokers.torn_of(tp.topic, tp.partition)
                figures = brokers.torn_figures_of(tp.topic, tp.partition)
                return await self._elect_one(
                    tp,
                    topics.get(tp.topic),
                    registered,
                    read,
                    offline,
                    torn,
                    figures,
                    brokers.starting,
                )

        return list(await asyncio.gather(*(elect(tp) for tp in wanted)))

    async def _elect_one(
        self,
        tp: TopicPartition,
        topic: TopicAssignment | None,
        registered: dict[int, int],
        read: Any,
        offline: frozenset[int] = frozenset(),
        torn: frozenset[int] = frozenset(),
        figures: Mapping[int, LogFigures] | None = None,
        starting: frozenset[int] = frozenset(),
    ) -> ElectionResult:
        """One partition's election; `read` is its state as the caller read
        it (None: not there), used for the first attempt only; `offline`:
        the brokers whose replica of it is offline; `starting`: the brokers
        still opening their logs (not live for elections, as the
        controller's: which of their logs are torn is not known yet)."""
        name = f"{tp.topic}-{tp.partition}"
        if topic is None or not 0 <= tp.partition < len(topic.replicas):
            return ElectionResult(
                tp, -1, UnknownTopicOrPartitionError(f"partition {name} does not exist")
            )
        replicas = list(topic.replicas[tp.partition])
        preferred = replicas[0]
        tx = self.client.transactions
        state = PartitionState()
        async for attempt in write_attempts():
            try:
                state, got = self._decoded(tp, read) if attempt == 0 else await self._state(tp)
            except UnknownTopicOrPartitionError as exc:
                return ElectionResult(tp, -1, exc)
            if state.leader == preferred and preferred in registered and preferred not in offline:
                return ElectionResult(
                    tp,
                    state.leader,
                    ElectionNotNeededError(f"{name}: preferred replica {preferred} already leads"),
                )
            restarted = {b for b, rev in registered.items() if rev > got.mod_revision}
            live = set(registered) - starting
            new = decide(
                replicas,
                state,
                live,
                False,
                True,
                restarted,
                offline,
                torn,
                figures,
                topic_min_isr(topic),
            )
            if new is None or new.leader != preferred:
                if preferred not in registered:
                    why = "is not alive"
                elif preferred in starting:
                    why = "is still opening its logs (starting)"
                elif preferred in offline:
                    why = "has its log offline (a storage failure; restart the broker)"
                elif preferred in torn:
                    why = (
                        "may have lost the tail of its log at its restart and has not caught up yet"
                    )
                else:
                    why = f"is not in the ISR {list(state.isr)}"
                return ElectionResult(
                    tp,
                    state.leader,
                    PreferredLeaderNotAvailableError(
                        f"{name}: preferred replica {preferred} {why}; the leader stays "
                        f"{state.leader}"
                    ),
                )
            key = self.keys.partition_state(tp.topic, tp.partition)
            ok, _ = await self.client.transaction(
                compare=[tx.mod(key) == got.mod_revision],
                success=[tx.put(key, new.encode())],
                failure=[],
            )
            if ok:
                return ElectionResult(tp, new.leader, None)
        return ElectionResult(
            tp, state.leader, RequestTimedOutError(f"{name}: its state kept changing: retry")
        )

    # ------------------------------------------------------------ reassignments

    async def alter_reassignment(
        self,
        tp: TopicPartition,
        target: Sequence[int],
        throttle_bytes_per_s: int,
        reads: ReassignmentReads | None = None,
    ) -> None:
        """Start, change (a new target or throttle) or, with an empty
        `target`, cancel the reassignment of one partition. `reads`: what the
        partitions of one request share (see ReassignmentReads)."""
        name = f"{tp.topic}-{tp.partition}"
        if throttle_bytes_per_s < 0:
            raise InvalidRequestError(
                f"throttle {throttle_bytes_per_s} bytes/s is negative: use 0 (no limit) or more"
            )
        reads = ReassignmentReads(self) if reads is None else reads
        tx = self.client.transactions
        async for _ in write_attempts():
            topic, topic_kv = await reads.topic(tp.topic)
            if not 0 <= tp.partition < len(topic.replicas):
                raise UnknownTopicOrPartitionError(
                    f"partition {name} does not exist (topic {tp.topic!r} has "
                    f"{len(topic.replicas)} partitions)"
                )
            live = await reads.live()
            if target:
                rules.check_target(name, target, live)
            ongoing = topic.reassignments.get(tp.partition)
            if not target and ongoing is None:
                raise NoReassignmentInProgressError(f"{name} has no reassignment to cancel")
            new = rules.start(
                topic.replicas[tp.partition],
                ongoing,
                target,
                throttle_bytes_per_s,
                self.metadata.clock.time_ms(),
            )
            if new is None and ongoing is None:
                return  # already has exactly these replicas
            current = set(topic.replicas[tp.partition])
            adding = [b for b in target if b not in current]
            if adding:
                # A broker past its max.partitions would refuse the replica
                # (and the move would never complete): refuse it here.
                hosted, capacity = await reads.capacity()
                check_capacity(name, [adding], hosted, capacity)
            replicas = new.replicas if new is not None else ongoing.original  # type: ignore[union-attr]
            state, state_kv = await self._state(tp)
            # Who may lead is the controller's rule (reassignment_driver's
            # too): not a broker still opening its logs, nor one whose log
            # is offline, nor a torn one while another ISR member may have
            # more.
            brokers = await reads.brokers()
            can_serve = set(live) - brokers.starting - brokers.offline_of(tp.topic, tp.partition)
            torn = brokers.torn_of(tp.topic, tp.partition)
            new_state = rules.state_for_replicas(
                replicas,
                state,
                can_serve,
                torn,
                brokers.torn_figures_of(tp.topic, tp.partition),
                topic_min_isr(topic),
            )
            if new_state is None:
                torn_isr = [b for b in replicas if b in state.isr and b in torn]
                why = (
                    f"; in-sync {torn_isr} may have lost the tail of their logs at a restart "
                    "and lead only once caught up (or once every in-sync replica is back)"
                    if torn_isr
                    else ""
                )
                raise InvalidRequestError(
                    f"{name}: none of the replicas {list(replicas)} may lead now (the ISR is "
                    f"{list(state.isr)}{why}): "
                    + ("wait for one to catch up" if new is None else "choose other replicas")
                )
            reassignments = dict(topic.reassignments)
            if new is None:
                reassignments.pop(tp.partition, None)
            else:
                reassignments[tp.partition] = new
            all_replicas = list(topic.replicas)
            all_replicas[tp.partition] = tuple(replicas)
            altered = dataclasses.replace(
                topic,
                replicas=tuple(all_replicas),
                reassignments=reassignments,
                version=topic.version + 1,
            )
            topic_key = self.keys.topic(tp.topic)
            state_key = self.keys.partition_state(tp.topic, tp.partition)
            success = [tx.put(topic_key, altered.encode())]
            if new_state is not state:
                success.append(tx.put(state_key, new_state.encode()))
            ok, _ = await self.client.transaction(
                compare=[
                    tx.mod(topic_key) == topic_kv.mod_revision,
                    tx.mod(state_key) == state_kv.mod_revision,
                ],
                success=success,
                failure=[],
            )
            # Either way the topic record read is stale now.
            reads.forget_topic(tp.topic)
            if ok:
                reads.moved(topic.replicas[tp.partition], replicas)
                return
        raise RequestTimedOutError(f"{name}: its replicas kept changing: retry")

    async def list_reassignments(
        self, wanted: Sequence[TopicPartition]
    ) -> list[OngoingReassignment]:
        """Reassignments in progress (of `wanted`; all when empty), by partition."""
        wanted_set = set(wanted)
        states: dict[TopicPartition, PartitionState] = {}
        for kv in await self.client.get_prefix(self.keys.all_partition_states):
            tp = self.keys.parse_partition_state_key(kv.key)
            if tp is not None:
                states[tp] = PartitionState.decode(kv.value)
        out = []
        for kv in await self.client.get_prefix(self.keys.topics):
            topic = TopicAssignment.decode(kv.value)
            for partition, reassignment in sorted(topic.reassignments.items()):
                tp = TopicPartition(topic.name, partition)
                if wanted_set and tp not in wanted_set:
                    continue
                state = states.get(tp, PartitionState())
                replicas = (
                    topic.replicas[partition]
                    if partition < len(topic.replicas)
                    else reassignment.replicas
                )
                out.append(OngoingReassignment(tp, reassignment, replicas, state.leader, state.isr))
        return sorted(out, key=lambda r: (r.tp.topic, r.tp.partition))


def _check_new_assignment(
    name: str,
    assignment: Sequence[tuple[int, Sequence[int]]],
    current: int,
    total: int,
    factor: int,
    live: Sequence[int],
) -> list[list[int]]:
    """The replicas of each new partition (current .. total-1), as given,
    checked: one entry per new partition, `factor` live brokers each, none
    twice. InvalidRequestError names the first thing wrong."""
    by_partition: dict[int, list[int]] = {}
    for partition, replicas in assignment:
        if not current <= partition < total or partition in by_partition:
            raise InvalidRequestError(
                f"assignment of {name!r} names partition {partition}: give each new "
                f"partition ({current} to {total - 1}) once"
            )
        by_partition[partition] = list(replicas)
    if len(by_partition) != total - current:
        raise InvalidRequestError(
            f"assignment of {name!r} has {len(by_partition)} partitions: the "
            f"{total - current} new ones ({current} to {total - 1}) need one entry each"
        )
    for partition in range(current, total):
        replicas = by_partition[partition]
        if len(replicas) != factor:
            raise InvalidRequestError(
                f"assignment of {name!r}: partition {partition} has {len(replicas)} replicas; "
                f"the topic's replication factor is {factor}"
            )
        rules.check_target(f"{name}-{partition}", replicas, live)
    return [by_partition[p] for p in range(current, total)]


class ReassignmentReads:
    """The etcd reads that the partitions of one AlterPartitionReassignments
    request share, so that a request naming up to MAX_PARTITIONS_PER_REQUEST
    partitions costs etcd round trips for the partitions it changes, not
    several for every partition it names (a request of 5,000 entries that
    change nothing took ~10,000 round trips, and tens of seconds on a loaded
    machine):

    - the live brokers, read once: the request is checked against the
      cluster as it was when it came (as a request checked just before a
      broker died is);
    - each topic's record, or its absence, until this request writes it or
      a write finds it changed (then it is read again);
    - the replicas each broker hosts and can host, read once and kept up to
      date with this request's own moves.

    One request's, on one event loop."""

    def __init__(self, admin: PartitionAdmin) -> None:
        self._admin = admin
        self._brokers: LiveBrokers | None = None
        self._topics: dict[str, tuple[TopicAssignment, Any] | str] = {}
        self._capacity: tuple[dict[int, int], dict[int, int | None]] | None = None

    async def topic(self, name: str) -> tuple[TopicAssignment, Any]:
        """The topic's record and its key-value (for its mod revision)."""
        read = self._topics.get(name)
        if read is None:
            try:
                read = await self._admin._topic(name)
            except UnknownTopicOrPartitionError as exc:
                read = exc.message
            self._topics[name] = read
        if isinstance(read, str):
            raise UnknownTopicOrPartitionError(read)
        return read

    def forget_topic(self, name: str) -> None:
        self._topics.pop(name, None)

    async def live(self) -> dict[int, int]:
        """Live broker id -> create revision of its registration."""
        return (await self.brokers()).registered

    async def brokers(self) -> LiveBrokers:
        """The broker registrations, as one read shows them (what an
        election reads: offline and torn logs, starting brokers)."""
        if self._brokers is None:
            self._brokers = await read_live_brokers(self._admin.client, self._admin.keys)
        return self._brokers

    async def capacity(self) -> tuple[dict[int, int], dict[int, int | None]]:
        """(replicas each broker hosts, each live broker's max_partitions)."""
        if self._capacity is None:
            metadata = self._admin.metadata
            brokers = await metadata.live_brokers()
            self._capacity = (
                await metadata.hosted_replicas(),
                {b.broker_id: b.max_partitions for b in brokers},
            )
        return self._capacity

    def moved(self, before: Sequence[int], after: Sequence[int]) -> None:
        """A partition this request changed from replicas `before` to `after`."""
        if self._capacity is None:
            return
        hosted = self._capacity[0]
        for broker_id in set(after) - set(before):
            hosted[broker_id] = hosted.get(broker_id, 0) + 1
        for broker_id in set(before) - set(after):
            hosted[broker_id] = hosted.get(broker_id, 0) - 1
