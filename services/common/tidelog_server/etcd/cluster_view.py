"""What a broker or a gateway knows of the cluster from etcd: one typed
view, kept up to date by the watch batches its owner feeds it (a broker's
ClusterLink, the gateway's ClusterView).

- live brokers: a broker is live while its registration key exists; the
  key's create revision identifies the registration (a broker that
  re-registers gets a new one), so replica fetches and ISR expansion are
  bound to it (`registration_of`); its mod revision identifies what the
  registration says, which a broker rewrites in place (its offline logs),
  so an ISR expansion judged on it is fenced by it
  (`registration_mod_revision`);
- live coordinator replicas (where forwarded calls go);
- topics: id, replicas per partition, config overrides, and the create
  revision of the topic key;
- partition states: leader, epoch, ISR, and the mod revision of the state
  key (ISR writes are fenced on it). A state older than its topic key
  belongs to a deleted topic of the same name and is not reported (`state`).

Values are parsed by the records of `tidelog_server.etcd.records`, one
parser per kind of key. A value that does not parse is logged and skipped
(as if the key were absent): one bad key must not stop the watch that
carries every other change. Not thread-safe: one event loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tidelog_server.etcd import WatchBatch
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.offline import offline_replicas
from tidelog_server.etcd.records import (
    BrokerRegistration,
    CoordinatorRegistration,
    PartitionState,
    Reassignment,
    TopicAssignment,
)

log = logging.getLogger("tidelog.cluster_view")

#: What a record's decode raises on a value it cannot read.
_UNREADABLE = (ValueError, KeyError, TypeError, AttributeError)


@dataclass(frozen=True)
class LiveBroker:
    registration: BrokerRegistration
    #: Create revision of the registration key: which registration this is.
    revision: int
    #: Mod revision of the registration key: which of its values this is
    #: (an in-place rewrite, such as a new offline_partitions, changes it).
    mod_revision: int


@dataclass(frozen=True)
class KnownTopic:
    name: str
    topic_id: str
    #: Replica broker ids per partition (index = partition).
    replicas: list[list[int]]
    configs: dict[str, str]
    #: Create revision of the topic key.
    create_revision: int
    #: Reassignments in progress, by partition (`replicas` already holds
    #: every replica of the move: the target and the leaving ones).
    reassignments: dict[int, Reassignment] = field(default_factory=dict)


@dataclass(frozen=True)
class KnownState:
    leader: int
    leader_epoch: int
    isr: list[int]
    #: Mod revision of the state key (ISR writes compare it).
    mod_revision: int


class ClusterView:
    """Live brokers, coordinators, topics and partition states (module doc)."""

    def __init__(self, keys: Keys) -> None:
        self._keys = keys
        self.brokers: dict[int, LiveBroker] = {}
        self.coordinators: dict[str, CoordinatorRegistration] = {}
        self.topics: dict[str, KnownTopic] = {}
        self.states: dict[tuple[str, int], KnownState] = {}

    # ------------------------------------------------------------ watch batches

    def apply_brokers(self, batch: WatchBatch) -> None:
        if batch.reset:
            self.brokers.clear()
        for change in batch.changes:
            broker_id = self._keys.tail(change.key, self._keys.brokers)
            if not broker_id.isdigit():
                continue
            if change.value is None:
                self.brokers.pop(int(broker_id), None)
                continue
            try:
                registration = BrokerRegistration.decode(change.value)
            except _UNREADABLE as exc:
                log.warning("ignoring unreadable registration of broker %s: %s", broker_id, exc)
                self.brokers.pop(int(broker_id), None)
                continue
            self.brokers[int(broker_id)] = LiveBroker(
                registration, change.create_revision, change.mod_revision
            )

    def apply_coordinators(self, batch: WatchBatch) -> None:
        if batch.reset:
            self.coordinators.clear()
        for change in batch.changes:
            name = self._keys.tail(change.key, self._keys.coordinators)
            if change.value is None:
                self.coordinators.pop(name, None)
                continue
            try:
                self.coordinators[name] = CoordinatorRegistration.decode(change.value)
            except _UNREADABLE as exc:
                log.warning("ignoring unreadable registration of coordinator %s: %s", name, exc)
                self.coordinators.pop(name, None)

    def apply_topics(self, batch: WatchBatch) -> None:
        if batch.reset:
            self.topics.clear()
        for change in batch.changes:
            name = self._keys.tail(change.key, self._keys.topics)
            if change.value is None:
                self.topics.pop(name, None)
                continue
            try:
                topic = TopicAssignment.decode(change.value)
            except _UNREADABLE as exc:
                log.warning("ignoring unreadable topic %s: %s", name, exc)
                self.topics.pop(name, None)
                continue
            self.topics[name] = KnownTopic(
                name,
                topic.topic_id,
                [list(replicas) for replicas in topic.replicas],
                dict(topic.configs),
                change.create_revision,
                dict(topic.reassignments),
            )

    def apply_states(self, batch: WatchBatch) -> None:
        if batch.reset:
            self.states.clear()
        for change in batch.changes:
            parsed = self._keys.parse_partition_state_key(change.key)
            if parsed is None:
                continue
            tp = (parsed.topic, parsed.partition)
            if change.value is None:
                self.states.pop(tp, None)
                continue
            try:
                state = PartitionState.decode(change.value)
            except _UNREADABLE as exc:
                log.warning("ignoring unreadable state of %s-%d: %s", *tp, exc)
                self.states.pop(tp, None)
                continue
            self.states[tp] = KnownState(
                state.leader, state.leader_epoch, list(state.isr), change.mod_revision
            )

    # ------------------------------------------------------------ questions

    def state(self, topic: KnownTopic, partition: int) -> KnownState | None:
        """The partition's state, unless it belongs to an older topic of the
        same name (written before this topic was created)."""
        state = self.states.get((topic.name, partition))
        if state is None or state.mod_revision < topic.create_revision:
            return None
        return state

    def out_of_sync(self, broker_id: int) -> list[tuple[str, int]]:
        """Partitions with a replica on `broker_id` that is not in their ISR
        while a live leader could bring it there (a partition without a live
        leader cannot, and must not hold up a rolling restart for ever).
        Empty: losing this broker now leaves every partition's ISR as it is
        minus this broker, which is what a rolling restart may do next."""
        behind = []
        for topic in self.topics.values():
            for partition, replicas in enumerate(topic.replicas):
                if broker_id not in replicas:
                    continue
                state = self.state(topic, partition)
                if state is None or state.leader not in self.brokers:
                    continue
                if broker_id not in state.isr:
                    behind.append((topic.name, partition))
        return behind

    def registration_of(self, broker_id: int) -> int | None:
        """The create revision of a live broker's registration; None when it
        is not registered (never was, or its lease expired)."""
        live = self.brokers.get(broker_id)
        return None if live is None else live.revision

    def registration_mod_revision(self, broker_id: int) -> int | None:
        """The mod revision of a live broker's registration (the value this
        view has of it); None when it is not registered."""
        live = self.brokers.get(broker_id)
        return None if live is None else live.mod_revision

    def lists_offline(self, broker_id: int, topic: str, partition: int) -> bool:
        """Whether live broker `broker_id`'s registration lists its replica
        of `topic`-`partition` as offline (`BrokerRegistration.offline_partitions`)."""
        live = self.brokers.get(broker_id)
        return live is not None and (topic, partition) in live.registration.offline_partitions

    def offline_replicas(self, topic: str, partition: int, replicas: list[int]) -> list[int]:
        """Those of `replicas` that cannot serve, in replica order: what
        Metadata answers as the partition's offline replicas, as Kafka's
        (`tidelog_server.etcd.offline`): a broker that is not live (its
        registration gone with its lease, or never registered), or a live
        broker that lists its log of `topic`-`partition` offline (one whose
        registration predates that field lists none)."""
        return offline_replicas(
            replicas, self.brokers, lambda b: self.lists_offline(b, topic, partition)
        )

    def broker_address(self, broker_id: int) -> str | None:
        live = self.brokers.get(broker_id)
        if live is None or not live.registration.host or not live.registration.port:
            return None
        return live.registration.address

    def broker_internal_address(self, broker_id: int) -> str | None:
        """Where a live broker serves replication (its internal listener)."""
        live = self.brokers.get(broker_id)
        if live is None or not live.registration.host or not live.registration.port:
            return None
        return live.registration.internal_address

    def coordinator_addresses(self) -> list[str]:
        """Live coordinator replicas, in a stable order (forwarding tries them in turn)."""
        return [c.address for _, c in sorted(self.coordinators.items()) if c.host and c.port]
