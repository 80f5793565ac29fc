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

The values are parsed into the typed view the brokers keep too
(`tidelog_server.etcd.cluster_view`); this module adds the watches and
the gateway's routing questions. Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aetcd
from tidelog.errors import (
    InvalidTopicError,
    NotLeaderOrFollowerError,
    TidelogError,
    UnknownTopicOrPartitionError,
)
from tidelog.names import validate_topic_name
from tidelog_server.etcd import Election, PrefixWatcher, WatchBatch, connect
from tidelog_server.etcd import cluster_view as etcd_view
from tidelog_server.etcd.client import EtcdAuth, EtcdTls
from tidelog_server.etcd.cluster_id import ensure_cluster_id
from tidelog_server.etcd.cluster_view import KnownState, KnownTopic
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import CoordinatorRegistration

log = logging.getLogger("tidelog.gateway.cluster")


class ClusterView:
    """The cluster as etcd describes it (see module doc)."""

    def __init__(
        self,
        etcd_endpoint: str,
        prefix: str,
        etcd_tls: EtcdTls | None = None,
        etcd_auth: EtcdAuth | None = None,
    ) -> None:
        self.keys = Keys(prefix)
        self.client: aetcd.Client = connect(etcd_endpoint, etcd_tls, etcd_auth)
        #: The cluster's keys, parsed (brokers, coordinators, topics, states).
        self.known = etcd_view.ClusterView(self.keys)
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
            async with asyncio.timeout(timeout_s):
                await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ------------------------------------------------------------ lookups

    @property
    def topics(self) -> dict[str, KnownTopic]:
        return self.known.topics

    def broker_address(self, broker_id: int) -> str | None:
        return self.known.broker_address(broker_id)

    def topic(self, name: str) -> KnownTopic:
        """The topic, or its typed error (invalid name, unknown topic)."""
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        validate_topic_name(name)
        raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")

    def state(self, topic: KnownTopic, partition: int) -> KnownState | None:
        return self.known.state(topic, partition)

    def live_leader(self, topic: KnownTopic, partition: int) -> str | None:
        """The address of the partition's leader while it is registered; None otherwise."""
        state = self.state(topic, partition)
        if state is None or state.leader < 0:
            return None
        return self.known.broker_address(state.leader)

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
        return leader

    def coordinator_addresses(self) -> list[str]:
        return self.known.coordinator_addresses()

    def broker_addresses(self) -> list[str]:
        return [
            address
            for broker_id in sorted(self.known.brokers)
            if (address := self.known.broker_address(broker_id)) is not None
        ]

    async def controller_id(self) -> str:
        controller = await Election.leader(self.client, self.keys.election)
        return (
            "" if controller is None else CoordinatorRegistration.decode(controller).coordinator_id
        )

    # ------------------------------------------------------------ watches

    async def _on_brokers(self, batch: WatchBatch) -> None:
        self.known.apply_brokers(batch)
        self._notify()

    async def _on_coordinators(self, batch: WatchBatch) -> None:
        self.known.apply_coordinators(batch)
        self._notify()

    async def _on_topics(self, batch: WatchBatch) -> None:
        self.known.apply_topics(batch)
        self._notify()

    async def _on_states(self, batch: WatchBatch) -> None:
        self.known.apply_states(batch)
        self._notify()


def invalid_topic_error(name: str) -> TidelogError | None:
    """INVALID_TOPIC for a name that breaks the naming rule, else None."""
    try:
        validate_topic_name(name)
    except InvalidTopicError as exc:
        return exc
    return None
