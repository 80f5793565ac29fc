"""The gateway process: follows the cluster in etcd, serves gRPC, drains on SIGTERM.

Serves `tidelog.v1.Log`, `Admin`, `Group` and `Cluster` for the whole
cluster, the record-level `tidelog.v1.Records` (records_servicer), gRPC
health checking (overall status under "", SERVING once the etcd view has
listed the cluster) and server reflection, so grpcurl works.

Drain (SIGTERM or SIGINT): health goes NOT_SERVING (a load balancer stops
sending new clients), then every stream is told to finish: Produce streams
stop reading, answer what they forwarded and end with UNAVAILABLE; Fetch
and Heartbeat streams end with UNAVAILABLE at once. The SDK retries each on
a new stream (through another replica behind the same address). After
`drain_timeout_s` whatever is left is cancelled.

Stateless: it holds no offsets, memberships or positions, so any number of
replicas may serve one cluster and a client may move between them.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from tidelog.v1 import (
    admin_pb2,
    cluster_pb2,
    cluster_pb2_grpc,
    group_pb2,
    log_pb2,
    log_pb2_grpc,
    records_pb2,
    records_pb2_grpc,
)
from tidelog_server.authorizer import Interceptor
from tidelog_server.etcd.client import serve_until_signal
from tidelog_server.grpc_options import KEEPALIVE_OPTIONS
from tidelog_server.metrics import MetricsEndpoint, MetricsOptions
from tidelog_server.security import Security
from tidelog_server.tls import add_port, channel_security_of

from tidelog_gateway.channels import Channels
from tidelog_gateway.cluster_view import ClusterView
from tidelog_gateway.config import GatewayConfig
from tidelog_gateway.control_servicers import (
    Forwarder,
    GatewayAdminServicer,
    GatewayClusterServicer,
    GatewayGroupServicer,
    add_admin_servicer,
    add_group_servicer,
)
from tidelog_gateway.limits import StreamCounter
from tidelog_gateway.log_servicer import GatewayLogServicer
from tidelog_gateway.metrics import GatewayMetrics
from tidelog_gateway.records_servicer import RecordsServicer

log = logging.getLogger("tidelog.gateway")

#: How long the start waits for the first listing of the cluster.
SYNC_TIMEOUT_S = 30.0


class GatewayServer:
    def __init__(self, config: GatewayConfig, metrics: MetricsOptions | None = None) -> None:
        self.config = config
        #: Prometheus metrics, with --metrics-port only (metrics.py).
        self.metrics = None if metrics is None else GatewayMetrics()
        self._metrics_options = metrics
        self.metrics_endpoint: MetricsEndpoint | None = None
        self.view = ClusterView(
            config.etcd_endpoint, config.etcd_prefix, config.etcd_tls, config.etcd_auth
        )
        self.channels = Channels(
            config.max_message_bytes,
            config.upstream_connections,
            channel_security_of(config.tls),
        )
        self.streams = StreamCounter(config.max_streams, config.max_streams_per_connection)
        self.draining = asyncio.Event()
        #: Principals, ACLs and quotas: the gateway decides for its clients
        #: (upstream, its calls carry its own identity).
        self.security = Security(config.security, config.tls, quotas_enabled=True)
        self._health = HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._records: RecordsServicer | None = None
        self.bound_port: int | None = None

    async def start(self) -> None:
        config = self.config
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", config.max_message_bytes),
                ("grpc.max_send_message_length", config.max_message_bytes),
                ("grpc.http2.max_frame_size", 1024 * 1024 - 1),
                ("grpc.so_reuseport", 0),
                *KEEPALIVE_OPTIONS,
            ],
            # Metrics first: they count the calls the security interceptor refuses.
            interceptors=[
                *([] if self.metrics is None else [self.metrics.rpc.interceptor()]),
                Interceptor(self.security),
            ],
        )
        forwarder = Forwarder(self.view, self.channels, config)
        log_pb2_grpc.add_LogServicer_to_server(
            GatewayLogServicer(self.view, self.channels, config, self.streams, self.draining),
            server,
        )
        add_admin_servicer(GatewayAdminServicer(forwarder), server)
        add_group_servicer(GatewayGroupServicer(forwarder, self.streams, self.draining), server)
        cluster_pb2_grpc.add_ClusterServicer_to_server(GatewayClusterServicer(forwarder), server)
        self._records = RecordsServicer(self.view, config, self.streams, self.draining)
        records_pb2_grpc.add_RecordsServicer_to_server(self._records, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        services = [
            log_pb2.DESCRIPTOR.services_by_name["Log"].full_name,
            admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
            group_pb2.DESCRIPTOR.services_by_name["Group"].full_name,
            cluster_pb2.DESCRIPTOR.services_by_name["Cluster"].full_name,
            records_pb2.DESCRIPTOR.services_by_name["Records"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ]
        reflection.enable_server_reflection(services, server)
        self.bound_port = add_port(server, config.listen_address, config.tls)
        if self.bound_port == 0:
            raise OSError(f"cannot listen on {config.listen_address}")
        await self._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        self._server = server
        if self.metrics is not None and self._metrics_options is not None:
            self.metrics.watch(self.streams, asyncio.get_running_loop())
            options = self._metrics_options
            self.metrics_endpoint = MetricsEndpoint(
                self.metrics.registry, options.host, options.port
            )
        await self.view.start()
        await self.view.wait_synced(SYNC_TIMEOUT_S)
        await self.security.start(self.view.client, self.view.keys)
        for name in ("", *services[:5]):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "gateway serving on %s for the cluster in etcd %s under %s",
            config.listen_address,
            config.etcd_endpoint,
            config.etcd_prefix,
        )

    async def stop(self) -> None:
        """Drain (see module doc), then close everything."""
        await self._health.enter_graceful_shutdown()
        self.draining.set()
        if self._server is not None:
            await self._server.stop(self.config.drain_timeout_s)
        if self._records is not None:
            await self._records.close()
        await self.security.stop()
        await self.view.stop()
        await self.channels.close()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        log.info("gateway stopped")


async def serve(config: GatewayConfig, metrics: MetricsOptions | None = None) -> int:
    """Run a gateway until SIGTERM or SIGINT (or etcd refuses it): the exit status."""
    gateway = GatewayServer(config, metrics)
    return await serve_until_signal(
        gateway.start, gateway.stop, gateway.view.client, config.etcd_prefix
    )
