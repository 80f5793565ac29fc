"""What the gateway knows of the cluster, followed from etcd.

`ClusterView` lists and then watches four prefixes of the cluster's keys
(tidelog_server.etcd.keys) with resumable watches (`PrefixWatcher`):

- `brokers/ids/`: live brokers and their addresses (a broker is live while
  its lease-bound registration exists);
- `coordinators/`: live coordinator replicas (Admin, Group, Cluster go there);
- `topics/`: each topic's partitions and replicas;
- `partitions/`: each partition's leader, leader epoch and ISR.

So the route of a request is a dict lookup, current within one etcd watch
event of a leader change; a broker that answers NOT_LEADER_OR_FOLLOWER
meanwhile has its error passed to the client, which retries (the SDK does,
after refreshing metadata from the gateway). A partition state written
before its topic was created belongs to an older topic of the same name and
is ignored, as the brokers do.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import aetcd
from tidelog.errors import (
    InvalidTopicError,
    NotLeaderOrFollowerError,
    TidelogError,
    UnknownTopicOrPartitionError,
)
from tidelog.names import validate_topic_name
from tidelog_server.etcd import Election, PrefixWatcher, WatchBatch, connect
from tidelog_server.etcd.cluster_id import ensure_cluster_id
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import PartitionState

log = logging.getLogger("tidelog.gateway.cluster")


@dataclass(frozen=True)
class Broker:
    broker_id: int
    host: str
    port: int
    rack: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Topic:
    name: str
    #: Replica broker ids per partition (index = partition).
    replicas: tuple[tuple[int, ...], ...]
    create_revision: int


@dataclass(frozen=True)
class State:
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    mod_revision: int


class ClusterView:
    """The cluster as etcd describes it (see module doc)."""

    def __init__(self, etcd_endpoint: str, prefix: str) -> None:
        self.keys = Keys(prefix)
        self.client: aetcd.Client = connect(etcd_endpoint)
        self.brokers: dict[int, Broker] = {}
        self.coordinators: dict[str, dict[str, Any]] = {}
        self.topics: dict[str, Topic] = {}
        self.states: dict[tuple[str, int], State] = {}
        self.cluster_id = ""
        #: Set (and replaced) after every applied change: waiters re-check.
        self._changed = asyncio.Event()
        self._watchers = [
            PrefixWatcher(self.client, self.keys.brokers, self._on_brokers, name="brokers"),
            PrefixWatcher(
                self.client, self.keys.coordinators, self._on_coordinators, name="coordinators"
            ),
            PrefixWatcher(self.client, self.keys.topics, self._on_topics, name="topics"),
            PrefixWatcher(
                self.client, self.keys.all_partition_states, self._on_states, name="partitions"
            ),
        ]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(w.run(), name=f"gateway-watch-{w.name}") for w in self._watchers
        ]

    async def wait_synced(self, timeout_s: float) -> None:
        """Until every prefix has been listed once."""
        async with asyncio.timeout(timeout_s):
            for watcher in self._watchers:
                await watcher.synced.wait()
            if not self.cluster_id:
                self.cluster_id = await ensure_cluster_id(self.client, self.keys)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):
            await self.client.close()

    async def wait_changed(self, timeout_s: float) -> None:
        """Until the next change applied from etcd, or the timeout."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ------------------------------------------------------------ lookups

    def topic(self, name: str) -> Topic:
        """The topic, or its typed error (invalid name, unknown topic)."""
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        validate_topic_name(name)
        raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")

    def state(self, topic: Topic, partition: int) -> State | None:
        state = self.states.get((topic.name, partition))
        if state is None or state.mod_revision < topic.create_revision:
            return None
        return state

    def live_leader(self, topic: Topic, partition: int) -> Broker | None:
        """The partition's leader while it is registered; None otherwise."""
        state = self.state(topic, partition)
        if state is None or state.leader < 0:
            return None
        return self.brokers.get(state.leader)

    def leader_address(self, name: str, partition: int) -> str:
        """Where requests for the partition go; raises its typed error."""
        topic = self.topic(name)
        count = len(topic.replicas)
        if not 0 <= partition < count:
            raise UnknownTopicOrPartitionError(
                f"partition {partition} of topic {name!r} does not exist: "
                f"the topic has partitions 0 to {count - 1}"
            )
        leader = self.live_leader(topic, partition)
        if leader is None:
            state = self.state(topic, partition)
            who = (
                "none is elected yet"
                if state is None or state.leader < 0
                else (f"broker {state.leader} is not registered")
            )
            raise NotLeaderOrFollowerError(
                f"{name}-{partition} has no live leader right now ({who}): retry"
            )
        return leader.address

    def coordinator_addresses(self) -> list[str]:
        return [
            f"{c['host']}:{c['port']}"
            for _, c in sorted(self.coordinators.items())
            if c.get("host") and c.get("port")
        ]

    def broker_addresses(self) -> list[str]:
        return [b.address for _, b in sorted(self.brokers.items())]

    async def controller_id(self) -> str:
        controller = await Election.leader(self.client, self.keys.election)
        return "" if controller is None else str(json.loads(controller).get("id", ""))

    # ------------------------------------------------------------ watches

    async def _on_brokers(self, batch: WatchBatch) -> None:
        if batch.reset:
            self.brokers.clear()
        for change in batch.changes:
            broker_id = self.keys.tail(change.key, self.keys.brokers)
            if not broker_id.isdigit():
                continue
            if change.value is None:
                self.brokers.pop(int(broker_id), None)
                continue
            try:
                info = json.loads(change.value)
                self.brokers[int(broker_id)] = Broker(
                    int(broker_id),
                    str(info["host"]),
                    int(info["port"]),
                    str(info.get("rack") or ""),
                )
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring unreadable registration of broker %s: %s", broker_id, exc)
        self._notify()

    async def _on_coordinators(self, batch: WatchBatch) -> None:
        if batch.reset:
            self.coordinators.clear()
        for change in batch.changes:
            name = self.keys.tail(change.key, self.keys.coordinators)
            if change.value is None:
                self.coordinators.pop(name, None)
            else:
                with contextlib.suppress(ValueError):
                    self.coordinators[name] = json.loads(change.value)
        self._notify()

    async def _on_topics(self, batch: WatchBatch) -> None:
        if batch.reset:
            self.topics.clear()
        for change in batch.changes:
            name = self.keys.tail(change.key, self.keys.topics)
            if change.value is None:
                self.topics.pop(name, None)
                continue
            try:
                data = json.loads(change.value)
                partitions = sorted(data["partitions"], key=lambda p: p["partition"])
                self.topics[name] = Topic(
                    name,
                    tuple(tuple(int(r) for r in p["replicas"]) for p in partitions),
                    change.create_revision,
                )
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring unreadable topic %s: %s", name, exc)
        self._notify()

    async def _on_states(self, batch: WatchBatch) -> None:
        if batch.reset:
            self.states.clear()
        for change in batch.changes:
            parsed = self.keys.parse_partition_state_key(change.key)
            if parsed is None:
                continue
            tp = (parsed.topic, parsed.partition)
            if change.value is None:
                self.states.pop(tp, None)
                continue
            try:
                state = PartitionState.decode(change.value)
            except (ValueError, TypeError) as exc:
                log.warning("ignoring unreadable state of %s-%d: %s", *tp, exc)
                continue
            self.states[tp] = State(
                state.leader, state.leader_epoch, tuple(state.isr), change.mod_revision
            )
        self._notify()


def invalid_topic_error(name: str) -> TidelogError | None:
    """INVALID_TOPIC for a name that breaks the naming rule, else None."""
    try:
        validate_topic_name(name)
    except InvalidTopicError as exc:
        return exc
    return None
