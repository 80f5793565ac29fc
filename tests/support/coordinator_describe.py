"""A topic as a coordinator's DescribeTopics answers it over gRPC: the
real AdminServicer on the test's etcd, served on a free loopback port for
the one call (what the describe path shows of torn and eligible leader
replicas, written to etcd by the test)."""

from __future__ import annotations

from functools import partial
from typing import Any

import grpc.aio
from tidelog.v1 import admin_pb2, admin_pb2_grpc
from tidelog_coordinator.admin_servicer import AdminServicer
from tidelog_coordinator.config import CoordinatorConfig
from tidelog_coordinator.metadata import MetadataManager

from tests.support.in_process_server import serving


async def describe_topic(client: Any, keys: Any, topic: str) -> admin_pb2.TopicDescription:
    """`topic` as DescribeTopics answers it (see module doc)."""
    servicer = AdminServicer(MetadataManager(client, keys, CoordinatorConfig()))
    added = partial(admin_pb2_grpc.add_AdminServicer_to_server, servicer)
    async with serving(added) as address, grpc.aio.insecure_channel(address) as channel:
        answer = await admin_pb2_grpc.AdminStub(channel).DescribeTopics(
            admin_pb2.DescribeTopicsRequest(names=[topic]), timeout=30
        )
    (described,) = answer.topics
    return described
