"""The coordinator process: etcd follower, gRPC server, lifecycle, clean shutdown.

Serves `tidelog.v1.Admin`, `tidelog.v1.Cluster` and `tidelog.v1.Group`, plus gRPC health checking
(`grpc.health.v1.Health`, status under "") and server reflection.

Start: connect to etcd (lazily; the process starts even while etcd is down
and serves COORDINATOR_NOT_AVAILABLE until it is back), follow `groups/` and
`topics/` with resilient watches, run the replica lifecycle (session,
registration, controller election), then serve.

Shutdown (SIGTERM or SIGINT): health NOT_SERVING, member streams are ended so
their members reconnect elsewhere, the session is revoked (the controller
role moves at once rather than after the TTL), then the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from tidelog.errors import CoordinatorNotAvailableError
from tidelog.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    cluster_pb2,
    cluster_pb2_grpc,
    group_pb2,
    group_pb2_grpc,
)
from tidelog_server.authorizer import Interceptor
from tidelog_server.etcd import Election, PrefixWatcher, connect
from tidelog_server.etcd.keys import Keys
from tidelog_server.grpc_options import KEEPALIVE_OPTIONS
from tidelog_server.metrics import MetricsEndpoint, MetricsOptions
from tidelog_server.security import Security
from tidelog_server.tls import add_port, channel_security_of

from tidelog_coordinator.admin_servicer import (
    AdminServicer,
    ClusterServicer,
    controller_value_id,
)
from tidelog_coordinator.broker_calls import BrokerCalls
from tidelog_coordinator.config import CoordinatorConfig
from tidelog_coordinator.controller import ReplicaLifecycle
from tidelog_coordinator.group_coordinator import GroupCoordinator
from tidelog_coordinator.group_servicer import GroupServicer
from tidelog_coordinator.metadata import MetadataManager
from tidelog_coordinator.metrics import ClusterProbe, CoordinatorMetrics
from tidelog_coordinator.offset_store import OffsetStore

log = logging.getLogger("tidelog.coordinator")

SHUTDOWN_GRACE_S = 2.0


class CoordinatorServer:
    """One coordinator replica."""

    def __init__(self, config: CoordinatorConfig, metrics: MetricsOptions | None = None) -> None:
        self.config = config
        #: Prometheus metrics, with --metrics-port only (metrics.py).
        self.metrics = None if metrics is None else CoordinatorMetrics()
        self._metrics_options = metrics
        self.metrics_endpoint: MetricsEndpoint | None = None
        self.keys = Keys(config.etcd_prefix)
        self.client = connect(config.etcd_endpoint, config.etcd_tls, config.etcd_auth)
        self.metadata = MetadataManager(self.client, self.keys, config)
        #: Channels to brokers (DeleteRecords, reassignment progress).
        self.brokers = BrokerCalls(self.client, self.keys, channel_security_of(config.tls))
        self.lifecycle: ReplicaLifecycle | None = None
        self.groups = GroupCoordinator(
            self.client,
            self.keys,
            is_controller=lambda: self.lifecycle is not None and self.lifecycle.is_controller,
            cache_revision=lambda: self._groups_watcher.revision,
            max_members=config.group_max_members,
        )
        self.offsets = OffsetStore(self.client, self.keys, config, self.groups)
        self._groups_watcher = PrefixWatcher(
            self.client, self.keys.groups, self.groups.cache.apply_groups, name="groups"
        )
        self._topics_watcher = PrefixWatcher(
            self.client, self.keys.topics, self.groups.cache.apply_topics, name="topics"
        )
        self.security = Security(config.security, config.tls)
        self._server: grpc.aio.Server | None = None
        self._group_servicer: GroupServicer | None = None
        self._health = HealthServicer()
        self._tasks: list[asyncio.Task[None]] = []
        self.bound_port = 0

    async def _controller_id(self) -> str:
        return controller_value_id(await Election.leader(self.client, self.keys.election))

    async def start(self) -> None:
        metrics = self.metrics
        # Metrics first: they count the calls the security interceptor refuses.
        interceptors: list[Any] = [] if metrics is None else [metrics.rpc.interceptor()]
        interceptors.append(Interceptor(self.security))
        server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0), *KEEPALIVE_OPTIONS], interceptors=interceptors
        )
        admin_pb2_grpc.add_AdminServicer_to_server(
            AdminServicer(self.metadata, self.brokers), server
        )
        cluster_pb2_grpc.add_ClusterServicer_to_server(
            ClusterServicer(self.metadata, self._controller_id), server
        )
        self._group_servicer = GroupServicer(
            self.groups,
            self.offsets,
            commit_stream_in_flight_max=self.config.commit_stream_in_flight_max,
        )
        group_pb2_grpc.add_GroupServicer_to_server(self._group_servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (
                admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
                cluster_pb2.DESCRIPTOR.services_by_name["Cluster"].full_name,
                group_pb2.DESCRIPTOR.services_by_name["Group"].full_name,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        self.bound_port = add_port(server, self.config.listen_address, self.config.tls)
        if self.bound_port == 0:
            raise OSError(f"cannot listen on {self.config.listen_address}")
        host = self.config.advertised_host or self.config.listen_address.rpartition(":")[0]
        self.lifecycle = ReplicaLifecycle(
            self.client, self.keys, self.config, host, self.bound_port, self.offsets
        )
        self._tasks = [
            asyncio.create_task(self._topics_watcher.run(), name="watch-topics"),
            asyncio.create_task(self._groups_watcher.run(), name="watch-groups"),
            asyncio.create_task(self.lifecycle.run(), name="lifecycle"),
        ]
        if metrics is not None and self._metrics_options is not None:
            lifecycle = self.lifecycle
            self.groups.on_generation = metrics.rebalanced
            metrics.watch(
                asyncio.get_running_loop(), lambda: lifecycle.is_controller, self.groups.cache
            )
            probe = ClusterProbe(
                metrics,
                self.client,
                self.keys,
                self.metadata,
                lambda: lifecycle.is_controller,
                self.config.metrics_interval_ms,
                channel_security_of(self.config.tls),
            )
            self._tasks.append(asyncio.create_task(probe.run(), name="metrics"))
            self.metrics_endpoint = MetricsEndpoint(
                metrics.registry, self._metrics_options.host, self._metrics_options.port
            )
        await self.security.start(self.client, self.keys)
        await server.start()
        self._server = server
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "coordinator %s serving on %s:%d (etcd %s, prefix %s)",
            self.config.coordinator_id,
            host,
            self.bound_port,
            self.config.etcd_endpoint,
            self.keys.prefix,
        )

    async def wait_synced(self) -> None:
        """Until both caches hold a first listing (tests; startup logs)."""
        await self._topics_watcher.synced.wait()
        await self._groups_watcher.synced.wait()

    async def stop(self) -> None:
        await self._health.enter_graceful_shutdown()
        await self.groups.close_all(
            CoordinatorNotAvailableError("the coordinator is shutting down: reconnect")
        )
        if self._group_servicer is not None:
            self._group_servicer.drain_commit_streams()
        if self.lifecycle is not None:
            await self.lifecycle.close()
        if self._server is not None:
            await self._server.stop(SHUTDOWN_GRACE_S)
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        await self.offsets.close()
        await self.security.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.brokers.close()
        await self.client.close()
        log.info("coordinator %s stopped", self.config.coordinator_id)
