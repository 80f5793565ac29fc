"""A cluster-mode broker closes, when it stops, every channel it opened to
answer clients: forwarded Admin calls, forwarded InitProducerId, and the
CreateTopics of a Metadata request that auto-creates a topic.

The broker runs in this process (so that its channels can be observed) against
a real etcd and a real coordinator process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest
from tidelog.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    cluster_pb2,
    cluster_pb2_grpc,
    log_pb2,
    log_pb2_grpc,
)
from tidelog_broker.cluster_link import ClusterConfig
from tidelog_broker.config import BrokerConfig
from tidelog_broker.server import BrokerServer

from tests.integration.coordinator.conftest import StartCoordinator
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(60)

DEADLINE_S = 20.0


def test_stop_closes_every_channel_the_broker_opened(
    etcd: EtcdProcess,
    prefix: str,
    coordinators: StartCoordinator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    coordinators()
    opened: list[grpc.aio.Channel] = []
    real_insecure_channel = grpc.aio.insecure_channel

    def recording_channel(target: str, *args: object, **kwargs: object) -> grpc.aio.Channel:
        channel = real_insecure_channel(target, *args, **kwargs)  # type: ignore[arg-type]
        opened.append(channel)
        return channel

    async def scenario() -> None:
        broker = BrokerServer(
            BrokerConfig(
                broker_id=0, port=0, data_dir=tmp_path / "broker", auto_create_topics=True
            ),
            ClusterConfig(etcd.endpoint, prefix),
        )
        await broker.start()
        assert broker.link is not None
        try:
            async with asyncio.timeout(DEADLINE_S):
                await broker.link.registered.wait()
                await broker.link.wait_synced(DEADLINE_S)
                while not broker.link.view.coordinator_addresses():
                    await asyncio.sleep(0.05)
            # The test's own channel is not the broker's: opened before the spy.
            async with real_insecure_channel(f"127.0.0.1:{broker.bound_port}") as client:
                monkeypatch.setattr(grpc.aio, "insecure_channel", recording_channel)
                reply = await cluster_pb2_grpc.ClusterStub(client).InitProducerId(
                    cluster_pb2.InitProducerIdRequest(), timeout=DEADLINE_S
                )
                assert reply.producer_id >= 0
                await admin_pb2_grpc.AdminStub(client).CreateTopics(
                    admin_pb2.CreateTopicsRequest(
                        topics=[admin_pb2.NewTopic(name="made-by-admin", partitions=1)]
                    ),
                    timeout=DEADLINE_S,
                )
                metadata = await log_pb2_grpc.LogStub(client).Metadata(
                    log_pb2.MetadataRequest(
                        topics=["made-by-metadata"], allow_auto_topic_creation=True
                    ),
                    timeout=DEADLINE_S,
                )
                assert metadata.topics[0].error.code == 0, metadata
        finally:
            await broker.stop()

    asyncio.run(scenario())
    assert opened, "the broker opened no channel: the calls were not forwarded"
    still_open = [c for c in opened if c.get_state() != grpc.ChannelConnectivity.SHUTDOWN]
    assert not still_open, f"{len(still_open)} of {len(opened)} channels left open at stop"
