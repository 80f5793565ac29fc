"""Cluster metadata in etcd: brokers, coordinator replicas, topics and partitions.

`MetadataManager` does the work of the Admin service (the servicer validates
the request shape and maps errors): it reads live brokers, places replicas,
and writes each new topic and the initial state of its partitions with
transactions that compare the topic key's create revision, so two replicas
creating the same topic at once cannot both succeed, and a topic deleted and
re-created meanwhile is never written into by the older request.

Any replica may create topics: placement is a pure function of the brokers
registered at the time, and the compare on the topic key serialises
creations, so routing them through the controller would add a hop and a
failure mode without making anything safer. The controller keeps the duties
that need a single actor over time (offset expiry now, leader election in
issue 5).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import aetcd
from tidelog.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from tidelog.names import validate_topic_name
from tidelog.request_limits import MAX_PARTITIONS_PER_TOPIC
from tidelog.types import TopicPartition
from tidelog_server.clock import SYSTEM_CLOCK, Clock
from tidelog_server.etcd.cluster_id import ensure_cluster_id
from tidelog_server.etcd.keys import Keys, prefix_end
from tidelog_server.etcd.records import BrokerRegistration, PartitionState, TopicAssignment
from tidelog_server.topic_configs import (
    TOPIC_CONFIGS,
    check_replication,
    config_to_strings,
    parse_topic_configs,
    validate_topic_configs,
)

from tidelog_coordinator.config import CoordinatorConfig
from tidelog_coordinator.leader_election import read_live_brokers
from tidelog_coordinator.placement import (
    BrokerSlot,
    check_assignment,
    check_capacity,
    place_replicas,
)

#: Attempts of an AlterConfigs read-modify-write before giving up (each
#: failure means the topic key changed meanwhile; we re-read and try again).
ALTER_CONFIGS_ATTEMPTS = 5

#: An admin request naming more topics than this reads every topic record
#: with one range read, not one read per topic (TopicReads), and ElectLeaders
#: reads every partition state at once, not each topic's.
TOPICS_READ_ONE_BY_ONE = 16

#: Upper bound on partitions per topic, shared with the request check that
#: refuses a whole CreateTopics before any topic is created.
MAX_PARTITIONS = MAX_PARTITIONS_PER_TOPIC


@dataclass(frozen=True, slots=True)
class BrokerRecord:
    broker_id: int
    host: str
    port: int
    rack: str = ""
    #: Partition replicas the broker can host (None: it reports no limit).
    max_partitions: int | None = None


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    partition: int
    replicas: list[int]
    leader: int
    leader_epoch: int
    isr: list[int]
    #: A reassignment in progress: the replicas being added and those leaving.
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()
    #: Replicas that cannot serve, as Kafka's offline replicas: their broker
    #: is not registered, or its registration lists their log offline
    #: (LiveBrokers.offline_replicas).
    offline: tuple[int, ...] = ()
    #: Replicas whose log may have lost its tail at their restart (a crash)
    #: and has neither caught up nor led since (LiveBrokers.torn_replicas): why a partition waits
    #: leaderless for another ISR member.
    torn: tuple[int, ...] = ()
    #: The state's eligible leader replicas (PartitionState.elr, KIP-966):
    #: removed from the ISR below min.insync.replicas, still electable.
    elr: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    topic_id: str
    partitions: list[PartitionRecord]
    #: Overrides only; effective configs add the defaults.
    configs: dict[str, str]


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


class TopicReads:
    """The topic records that one admin request (DeleteTopics, DescribeConfigs,
    AlterConfigs) reads, shared by its entries.

    A request naming at most TOPICS_READ_ONE_BY_ONE topics reads each one's
    key; a bigger one reads every topic record with one range read on first
    use. So a request of MAX_TOPICS_PER_REQUEST names, most of them topics
    that do not exist, costs one etcd read, not a thousand. A record may be
    older than the request's write to it: the writes compare revisions, and
    one that finds the key changed reads it again itself.
    """

    def __init__(self, metadata: MetadataManager, names: Collection[str]) -> None:
        self._client = metadata.client
        self._keys = metadata.keys
        self._one_by_one = len(names) <= TOPICS_READ_ONE_BY_ONE
        self._listing: dict[str, aetcd.KeyValue] | None = None

    async def record(self, name: str) -> aetcd.KeyValue | None:
        """The topic's key-value (its value and mod revision), or None when
        there is no such topic."""
        if self._one_by_one:
            return await self._client.get(self._keys.topic(name))
        if self._listing is None:
            listing = await self._client.get_prefix(self._keys.topics)
            self._listing = {self._keys.tail(kv.key, self._keys.topics): kv for kv in listing}
        return self._listing.get(name)


class MetadataManager:
    """Topic and cluster admin over etcd. Safe for concurrent use on one loop."""

    def __init__(
        self,
        client: aetcd.Client,
        keys: Keys,
        config: CoordinatorConfig,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.client = client
        self.keys = keys
        self.config = config
        self.clock = clock

    # ------------------------------------------------------------ cluster

    async def ensure_cluster_id(self) -> str:
        """The cluster id, created on first use."""
        return await ensure_cluster_id(self.client, self.keys)

    async def live_brokers(self) -> list[BrokerRecord]:
        listing = await self.client.get_prefix(self.keys.brokers)
        brokers = []
        for kv in listing:
            registration = BrokerRegistration.decode(kv.value)
            brokers.append(
                BrokerRecord(
                    registration.broker_id,
                    registration.host,
                    registration.port,
                    registration.rack,
                    registration.max_partitions,
                )
            )
        return sorted(brokers, key=lambda b: b.broker_id)

    async def hosted_replicas(self) -> dict[int, int]:
        """Partition replicas assigned to each broker, over every topic."""
        hosted: dict[int, int] = {}
        for kv in await self.client.get_prefix(self.keys.topics):
            for replicas in TopicAssignment.decode(kv.value).replicas:
                for broker_id in replicas:
                    hosted[broker_id] = hosted.get(broker_id, 0) + 1
        return hosted

    async def coordinators(self) -> list[dict[str, Any]]:
        listing = await self.client.get_prefix(self.keys.coordinators)
        return sorted((json.loads(kv.value) for kv in listing), key=lambda c: c["id"])

    # ------------------------------------------------------------ topics

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: dict[str, str],
        validate_only: bool = False,
        replica_assignment: Sequence[tuple[int, Sequence[int]]] = (),
    ) -> TopicRecord:
        """Validate, place and (unless validate_only) write one topic.

        With `replica_assignment` ((partition, broker ids) pairs) that
        placement is used, once checked, instead of the coordinator's."""
        validate_topic_name(name)
        if replica_assignment:
            return await self._create_assigned(
                name, partitions, replication_factor, configs, validate_only, replica_assignment
            )
        partitions = partitions or self.config.default_partitions
        if partitions < 1 or partitions > MAX_PARTITIONS:
            raise InvalidPartitionsError(
                f"{partitions} partitions requested for {name!r}: use 1 to {MAX_PARTITIONS}"
            )
        if replication_factor < 0:
            raise InvalidPartitionsError(f"replication factor {replication_factor} is negative")
        replication_factor = replication_factor or self.config.default_replication_factor
        overrides = validate_topic_configs(configs)
        check_replication(parse_topic_configs(overrides), replication_factor, name)
        brokers = await self.live_brokers()
        slots = [BrokerSlot(b.broker_id, b.rack) for b in brokers]
        placement = place_replicas(name, slots, partitions, replication_factor)
        return await self._create_placed(name, placement, brokers, overrides, validate_only)

    async def _create_assigned(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: dict[str, str],
        validate_only: bool,
        replica_assignment: Sequence[tuple[int, Sequence[int]]],
    ) -> TopicRecord:
        brokers = await self.live_brokers()
        placement = check_assignment(
            name,
            replica_assignment,
            partitions,
            replication_factor,
            [b.broker_id for b in brokers],
            MAX_PARTITIONS,
        )
        overrides = validate_topic_configs(configs)
        check_replication(parse_topic_configs(overrides), len(placement[0]), name)
        return await self._create_placed(name, placement, brokers, overrides, validate_only)

    async def _create_placed(
        self,
        name: str,
        placement: list[list[int]],
        brokers: list[BrokerRecord],
        overrides: dict[str, str],
        validate_only: bool,
    ) -> TopicRecord:
        """Check capacity, then (unless validate_only) write the topic; the
        first replica of each partition is its leader."""
        check_capacity(
            name,
            placement,
            await self.hosted_replicas(),
            {b.broker_id: b.max_partitions for b in brokers},
        )
        record = TopicRecord(
            name=name,
            topic_id=uuid.uuid4().hex,
            partitions=[
                PartitionRecord(i, replicas, replicas[0], 0, list(replicas))
                for i, replicas in enumerate(placement)
            ],
            configs=overrides,
        )
        if await self.client.get(self.keys.topic(name)) is not None:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        if not validate_only:
            await self._write_topic(record)
        return record

    async def _write_topic(self, record: TopicRecord) -> None:
        tx = self.client.transactions
        topic_value = TopicAssignment(
            record.name,
            record.topic_id,
            tuple(tuple(p.replicas) for p in sorted(record.partitions, key=lambda p: p.partition)),
            record.configs,
            version=1,
            created_ms=self.clock.time_ms(),
        ).encode()
        states = [
            tx.put(
                self.keys.partition_state(record.name, p.partition),
                PartitionState(p.leader, 0, tuple(p.isr)).encode(),
            )
            for p in record.partitions
        ]
        topic_key = self.keys.topic(record.name)
        chunk = max(1, self.config.etcd_max_txn_ops - 2)
        # etcd caps operations per transaction (--max-txn-ops): the first
        # transaction creates the topic key (if absent) with as many partition
        # states as fit; later ones add the rest only while the topic key is
        # still the one we created. Brokers treat a partition without a state
        # key as not ready yet.
        ok, responses = await self.client.transaction(
            compare=[tx.create(topic_key) == 0],
            success=[tx.put(topic_key, topic_value), *states[:chunk]],
            failure=[],
        )
        if not ok:
            raise TopicAlreadyExistsError(f"topic {record.name!r} already exists")
        created = responses[0].response_put.header.revision
        for i in range(chunk, len(states), chunk):
            ok, _ = await self.client.transaction(
                compare=[tx.create(topic_key) == created], success=states[i : i + chunk], failure=[]
            )
            if not ok:
                raise UnknownTopicOrPartitionError(
                    f"topic {record.name!r} was deleted while being created"
                )

    async def delete_topic(self, name: str, reads: TopicReads | None = None) -> None:
        """Delete the topic and its partition states in one transaction
        (none when `reads` shows that there is no such topic)."""
        validate_topic_name(name)
        if reads is not None and await reads.record(name) is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        tx = self.client.transactions
        topic_key = self.keys.topic(name)
        states = self.keys.partition_states(name)
        ok, _ = await self.client.transaction(
            compare=[tx.version(topic_key) > 0],
            success=[tx.delete(topic_key), tx.delete(states, prefix_end(states))],
            failure=[],
        )
        if not ok:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")

    async def topic_names(self) -> list[str]:
        listing = await self.client.get_prefix(self.keys.topics, keys_only=True)
        return sorted(self.keys.tail(kv.key, self.keys.topics) for kv in listing)

    async def describe_topics(self, names: Sequence[str]) -> list[TopicRecord | Exception]:
        """Each named topic (every topic when `names` is empty), or its error."""
        listing = await self.client.get_prefix(self.keys.topics)
        topics = {t.name: t for t in (TopicAssignment.decode(kv.value) for kv in listing)}
        wanted = list(names) or sorted(topics)
        states: dict[TopicPartition, PartitionState] = {}
        for kv in await self.client.get_prefix(self.keys.all_partition_states):
            tp = self.keys.parse_partition_state_key(kv.key)
            if tp is not None:
                states[tp] = PartitionState.decode(kv.value)
        # What the controller reads too (leader_election.read_live_brokers),
        # once for every partition described.
        brokers = await read_live_brokers(self.client, self.keys)
        out: list[TopicRecord | Exception] = []
        for name in wanted:
            topic = topics.get(name)
            if topic is None:
                out.append(UnknownTopicOrPartitionError(f"topic {name!r} does not exist"))
                continue
            parts_out = []
            for partition, replicas in enumerate(topic.replicas):
                state = states.get(TopicPartition(name, partition), PartitionState())
                moving = topic.reassignments.get(partition)
                parts_out.append(
                    PartitionRecord(
                        partition,
                        list(replicas),
                        state.leader,
                        state.leader_epoch,
                        list(state.isr),
                        moving.adding if moving is not None else (),
                        moving.removing if moving is not None else (),
                        brokers.offline_replicas(name, partition, replicas),
                        brokers.torn_replicas(name, partition, replicas),
                        state.elr,
                    )
                )
            out.append(TopicRecord(name, topic.topic_id, parts_out, dict(topic.configs)))
        return out

    @staticmethod
    def effective_configs(overrides: dict[str, str]) -> dict[str, str]:
        return config_to_strings(parse_topic_configs(overrides))

    # ------------------------------------------------------------ configs

    async def describe_configs(
        self, name: str, reads: TopicReads | None = None
    ) -> list[tuple[str, str, bool]]:
        """Every topic config of `name`: (key, effective value, is an override),
        sorted by key. The coordinator has no broker config file: a value is
        either the topic's override or Tidelog's default."""
        validate_topic_name(name)
        reads = reads or TopicReads(self, [name])
        got = await reads.record(name)
        if got is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        overrides = dict(TopicAssignment.decode(got.value).configs)
        effective = self.effective_configs(overrides)
        return [(key, effective[key], key in overrides) for key in sorted(effective)]

    async def alter_configs(
        self,
        name: str,
        set_configs: dict[str, str],
        delete_configs: Sequence[str],
        validate_only: bool = False,
        reads: TopicReads | None = None,
    ) -> dict[str, str]:
        """Set and remove overrides of one topic (incrementally) and return the
        new overrides. Validated with `tidelog_server.topic_configs`; written with a
        transaction comparing the topic key's mod revision, so a concurrent
        change (or a delete and re-create) is never overwritten: we re-read
        and apply again. Brokers see the new value through their watch."""
        validate_topic_name(name)
        for key in delete_configs:
            if key not in TOPIC_CONFIGS:
                known = ", ".join(sorted(TOPIC_CONFIGS))
                raise InvalidConfigError(f"unknown topic config {key!r}; known keys: {known}")
        canonical = validate_topic_configs(set_configs)
        tx = self.client.transactions
        topic_key = self.keys.topic(name)
        for attempt in range(ALTER_CONFIGS_ATTEMPTS):
            if attempt == 0 and reads is not None:
                got = await reads.record(name)
            else:
                got = await self.client.get(topic_key)
            if got is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            topic = TopicAssignment.decode(got.value)
            overrides = dict(topic.configs)
            overrides.update(canonical)
            for key in delete_configs:
                overrides.pop(key, None)
            # The combination must hold too, with the topic's replicas.
            replication_factor = min((len(r) for r in topic.replicas), default=1)
            check_replication(parse_topic_configs(overrides), replication_factor, name)
            if validate_only:
                return overrides
            altered = dataclasses.replace(topic, configs=overrides, version=topic.version + 1)
            ok, _ = await self.client.transaction(
                compare=[tx.mod(topic_key) == got.mod_revision],
                success=[tx.put(topic_key, altered.encode())],
                failure=[],
            )
            if ok:
                return overrides
        raise InvalidConfigError(
            f"topic {name!r} kept changing while its configs were altered: try again"
        )
