"""The cluster id and partition states as written to a real etcd.

`ensure_cluster_id` is the one copy the broker and the coordinator share; the
coordinator's MetadataManager writes partition states with the typed record
and reads them back through the one key parser, with the Clock it is given.
"""

from __future__ import annotations

import asyncio
import json

from tidelog_coordinator.config import CoordinatorConfig
from tidelog_coordinator.metadata import MetadataManager
from tidelog_server.clock import ManualClock
from tidelog_server.etcd.cluster_id import ensure_cluster_id
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import PartitionState

from tests.integration.coordinator.helpers import etcd_client
from tests.support.etcd import EtcdProcess


def test_racing_callers_agree_on_one_cluster_id(etcd: EtcdProcess, prefix: str) -> None:
    async def run() -> None:
        keys = Keys(prefix)
        async with etcd_client(etcd.endpoint) as client:
            ids = await asyncio.gather(*(ensure_cluster_id(client, keys) for _ in range(8)))
            assert len(set(ids)) == 1 and len(ids[0]) == 32
            assert await ensure_cluster_id(client, keys) == ids[0]
            stored = await client.get(keys.cluster_id)
            assert stored is not None and stored.value.decode() == ids[0]

    asyncio.run(run())


def test_topic_creation_writes_typed_states_at_the_clocks_time(
    etcd: EtcdProcess, prefix: str
) -> None:
    async def run() -> None:
        keys = Keys(prefix)
        clock = ManualClock(start_ms=1_234_567)
        async with etcd_client(etcd.endpoint) as client:
            for broker_id in (0, 1):
                body = {"id": broker_id, "host": "127.0.0.1", "port": 9000 + broker_id}
                await client.put(keys.broker(broker_id), json.dumps(body).encode())
            # A stray key under partitions/ that is not a state: ignored by readers.
            await client.put(keys.partition_states("orders") + b"0/note", b"not json")
            metadata = MetadataManager(client, keys, CoordinatorConfig(), clock=clock)
            created = await metadata.create_topic("orders", 3, 2, {})

            topic = await client.get(keys.topic("orders"))
            assert topic is not None
            assert json.loads(topic.value)["created_ms"] == 1_234_567
            for p in created.partitions:
                raw = await client.get(keys.partition_state("orders", p.partition))
                assert raw is not None
                assert PartitionState.decode(raw.value) == PartitionState(
                    p.leader, 0, tuple(p.isr), 1
                )
            (described,) = await metadata.describe_topics(["orders"])
            assert not isinstance(described, Exception)
            assert [(p.partition, p.leader, p.isr) for p in described.partitions] == [
                (p.partition, p.leader, p.isr) for p in created.partitions
            ]

    asyncio.run(run())
