"""A broker alone (no etcd) answers its own offline logs as offline
replicas: Metadata's and DescribeTopics' `offline_replicas` name it for a
partition whose log a storage failure took offline, and only that one;
DescribeTopics gives that partition its STORAGE_ERROR and no figures (-1).

A real BrokerServer in this process over real gRPC. The log goes offline
through the real reset path (a directory where the reset writes its commit
point, as in test_offline_logs_reach_the_controller)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from tidelog.errors import StorageError
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2, log_pb2, log_pb2_grpc
from tidelog_broker.config import BrokerConfig
from tidelog_broker.server import BrokerServer
from tidelog_broker.storage import files
from tidelog_server.atomic_files import TEMP_SUFFIX

TOPIC = "t"
ME = 7
CALL_TIMEOUT_S = 30.0


def test_a_lone_broker_lists_its_offline_log_as_an_offline_replica(tmp_path: Path) -> None:
    async def run() -> None:
        broker = BrokerServer(BrokerConfig(broker_id=ME, port=0, data_dir=tmp_path))
        await broker.start()
        try:
            manager = broker.manager
            manager.logs.create_topic(TOPIC, 2)
            directory = manager.partition_log(TOPIC, 1).directory
            (directory / (files.RESET_OFFSET_FILE + TEMP_SUFFIX)).mkdir()
            with pytest.raises(StorageError, match="offline until the broker restarts"):
                manager.replicas.reset_replica(TOPIC, 1, 5)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.bound_port}") as channel:
                metadata = await log_pb2_grpc.LogStub(channel).Metadata(
                    log_pb2.MetadataRequest(topics=[TOPIC]), timeout=CALL_TIMEOUT_S
                )
                described = await admin_pb2_grpc.AdminStub(channel).DescribeTopics(
                    admin_pb2.DescribeTopicsRequest(names=[TOPIC]), timeout=CALL_TIMEOUT_S
                )
            assert {
                p.partition: list(p.offline_replicas) for p in metadata.topics[0].partitions
            } == {
                0: [],
                1: [ME],
            }
            assert {
                p.partition: list(p.offline_replicas) for p in described.topics[0].partitions
            } == {0: [], 1: [ME]}
            # Its figures, those of a half-done reset, are not given: -1 and
            # the STORAGE_ERROR its reads answer.
            healthy, offline = described.topics[0].partitions
            assert not healthy.HasField("error") and healthy.segment_count == 1, healthy
            assert offline.error.code == common_pb2.STORAGE_ERROR, offline
            assert offline.error.message.startswith(
                f"the log of {TOPIC}-1 on broker {ME} is offline"
            )
            assert (
                offline.log_start_offset,
                offline.log_end_offset,
                offline.high_watermark,
                offline.size_bytes,
                offline.segment_count,
            ) == (-1, -1, -1, -1, -1)
        finally:
            await broker.stop()

    asyncio.run(run())
