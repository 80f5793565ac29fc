"""Helpers for tests of the coordinator's elections against a real etcd: a
cluster's records written directly (brokers, one topic, its partition
states) and an etcd client that counts the calls made through it."""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from tidelog_server.etcd import connect
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import BrokerRegistration, PartitionState, TopicAssignment

BROKERS = (0, 1, 2)


class CountingClient:
    """The etcd client, counting the calls made through it by name."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute) or name == "transactions":
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attribute(*args, **kwargs)

        return counted


def preferred_leaders(partitions: int) -> list[int]:
    """The preferred (first) replica of each partition write_cluster writes."""
    return [BROKERS[p % len(BROKERS)] for p in range(partitions)]


async def write_cluster(
    client: Any, keys: Keys, topic: str, leaders: list[int], live: tuple[int, ...] = BROKERS
) -> None:
    """Brokers `live` registered, and `topic` with one partition per entry
    of `leaders` (its leader), each replicated on all of BROKERS with
    broker p % 3 preferred and every broker in the ISR."""
    for broker in live:
        registration = BrokerRegistration(broker, "127.0.0.1", 9092 + broker)
        await client.put(keys.broker(broker), registration.encode())
    replicas = tuple(
        tuple(BROKERS[(p + i) % len(BROKERS)] for i in range(len(BROKERS)))
        for p in range(len(leaders))
    )
    record = TopicAssignment(topic, uuid.uuid4().hex, replicas, {})
    await client.put(keys.topic(topic), record.encode())
    for p, leader in enumerate(leaders):
        state = PartitionState(leader=leader, leader_epoch=1, isr=BROKERS)
        await client.put(keys.partition_state(topic, p), state.encode())


@contextlib.asynccontextmanager
async def cluster_in_etcd(
    endpoint: str, prefix: bytes, topic: str, leaders: list[int], live: tuple[int, ...] = BROKERS
) -> AsyncIterator[tuple[Any, Keys]]:
    """An etcd client and the keys under `prefix`, with write_cluster's
    records written; the client is closed after."""
    client = connect(endpoint)
    keys = Keys(prefix.decode().rstrip("/"))
    try:
        await write_cluster(client, keys, topic, leaders, live)
        yield client, keys
    finally:
        await client.close()


async def read_states(client: Any, keys: Keys, topic: str, partitions: int) -> list[PartitionState]:
    states = []
    for p in range(partitions):
        got = await client.get(keys.partition_state(topic, p))
        states.append(PartitionState.decode(got.value))
    return states
