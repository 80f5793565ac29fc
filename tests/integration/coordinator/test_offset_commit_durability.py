"""An acknowledged offset commit is in etcd, even when the coordinator that
acknowledged it (coalescing concurrent commits into shared transactions) is
SIGKILLed right after the acknowledgement."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from tidelog.errors import TidelogError
from tidelog.group import OffsetStoreClient
from tidelog.types import TopicPartition
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from tidelog_server.etcd.keys import Keys

from tests.integration.coordinator.conftest import StartCoordinator
from tests.integration.coordinator.helpers import etcd_client, register_broker
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(120)

COMMITTERS = 32
PARTITIONS = 3
#: Acknowledgements before the kill: enough that commits share transactions.
ACKS_BEFORE_KILL = 400


def test_an_acknowledged_commit_survives_a_coordinator_sigkill_right_after_the_ack(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()
    acked: dict[str, int] = {}
    sent: dict[str, int] = {}

    async def run() -> None:
        async with etcd_client(etcd.endpoint) as client:
            await register_broker(client, prefix, 1)
        async with grpc.aio.insecure_channel(coordinator.address) as channel:
            reply = await admin_pb2_grpc.AdminStub(channel).CreateTopics(
                admin_pb2.CreateTopicsRequest(
                    topics=[admin_pb2.NewTopic(name="t", partitions=PARTITIONS)]
                )
            )
            assert reply.topics[0].error.code == common_pb2.NONE
        # One client each: a client that fails over closes its channel, which
        # would cancel the other committers' calls on it.
        clients = [
            OffsetStoreClient(coordinator.address, request_timeout_ms=5_000)
            for _ in range(COMMITTERS)
        ]
        acks = 0
        killed = asyncio.Event()

        async def commit_loop(i: int) -> None:
            nonlocal acks
            group = f"g{i}"
            offset = 0
            while not killed.is_set():
                offset += 1
                sent[group] = offset
                try:
                    await clients[i].alter(
                        group, {TopicPartition("t", p): offset for p in range(PARTITIONS)}
                    )
                except TidelogError:
                    assert killed.is_set(), "a commit failed before the coordinator was killed"
                    return
                acked[group] = offset
                acks += 1
                if acks >= ACKS_BEFORE_KILL and not killed.is_set():
                    # Right after an acknowledgement, with other commits in flight.
                    coordinator.kill()
                    killed.set()

        try:
            await asyncio.gather(*(commit_loop(i) for i in range(COMMITTERS)))
        finally:
            for c in clients:
                await c.close()

    asyncio.run(run())
    assert len(acked) == COMMITTERS

    async def stored() -> dict[tuple[str, int], int]:
        keys = Keys(prefix)
        async with etcd_client(etcd.endpoint) as client:
            listing = await client.get_prefix(keys.all_offsets)
        out = {}
        for kv in listing:
            parsed = keys.parse_offset_key(kv.key)
            assert parsed is not None
            group, tp = parsed
            out[(group, tp.partition)] = json.loads(kv.value)["offset"]
        return out

    in_etcd = asyncio.run(stored())
    for group, offset in acked.items():
        for p in range(PARTITIONS):
            # At least what was acknowledged; at most what was sent (a commit
            # in flight at the kill may or may not have landed).
            assert offset <= in_etcd[(group, p)] <= sent[group], (group, p)
