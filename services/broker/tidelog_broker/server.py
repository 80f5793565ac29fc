"""The broker process: opens the storage, serves gRPC, shuts down cleanly.

Serves `tidelog.v1.Log` and `tidelog.v1.Admin`, plus gRPC health checking
(`grpc.health.v1.Health`, overall status under the service name "") and
server reflection, so that generic tools such as grpcurl work.

Shutdown (SIGTERM or SIGINT): health goes NOT_SERVING, new calls are
refused, and the data streams drain (LogServicer.drain): a Produce stream
stops reading, answers every request it has appended, a Fetch stream
finishes the message it is sending, and each ends with UNAVAILABLE and
NOT_LEADER_OR_FOLLOWER in its trailer (tidelog_server.draining), all within
a grace period, after which gRPC cancels what is left. Then the broker
leaves the cluster (below) and stops replicating; every log is flushed and
closed so the next start skips recovery.

Cluster mode (`--etcd`): topics come from etcd (ClusterLink) instead of
topics.json, Admin calls are forwarded to a coordinator, and the broker also
serves `tidelog.v1.Cluster` (DescribeCluster) so that clients bootstrapped
from it find the coordinators. Replication (`tidelog.internal.Replica`) has
a listener of its own, `--internal-port`, advertised in the broker's etcd
registration: it is never served on the client port. On shutdown its
registration is revoked once the client streams have drained (they need
it: see `BrokerServer.stop`), before replication stops, so it leaves the
cluster at once rather than after its session TTL. Replication streams end
without a code: a follower learns where a partition went from etcd, not
from the stream (replica_fetcher).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from tidelog.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    cluster_pb2,
    cluster_pb2_grpc,
    log_pb2,
)
from tidelog_server.authorizer import Interceptor
from tidelog_server.etcd.client import serve_until_signal
from tidelog_server.forwarding import ChannelPool
from tidelog_server.grpc_options import KEEPALIVE_OPTIONS
from tidelog_server.internal import replica_pb2_grpc
from tidelog_server.metrics import MetricsEndpoint, MetricsOptions
from tidelog_server.security import Security
from tidelog_server.security_options import SecurityOptions
from tidelog_server.tls import add_port, channel_security_of

from tidelog_broker.admin_servicer import AdminServicer
from tidelog_broker.cluster_link import ClusterConfig, ClusterLink
from tidelog_broker.cluster_servicers import (
    AdminForwarder,
    BrokerClusterServicer,
    ClusterMetadata,
    add_admin_forwarder,
)
from tidelog_broker.config import BrokerConfig
from tidelog_broker.log_servicer import LogServicer, add_log_servicer
from tidelog_broker.metrics import BrokerMetrics
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.producer_epochs import EtcdEpochs, LocalEpochs
from tidelog_broker.producer_ids import LocalProducerIds, StandaloneClusterServicer
from tidelog_broker.replica_servicer import ReplicaServicer

log = logging.getLogger("tidelog.broker")

# Produce and Fetch streams stay open for as long as their clients live, so
# shutdown cannot wait for them to end: after this grace the server cancels
# them. An append runs without an await, so a cancel never tears one; clients
# see the stream end and reconnect.
SHUTDOWN_GRACE_S = 1.0
#: How long, of that grace, a draining Produce stream waits for the acks=all
#: answers it owes (the others are ready): it then ends with its code and
#: leaves the rest unanswered, to be sent again, rather than have the
#: grace's cancel end it with none.
DRAIN_ANSWER_S = SHUTDOWN_GRACE_S / 2

#: Health service name that is SERVING while this broker is in the ISR of
#: every partition it hosts (cluster mode; `ClusterLink.in_sync`): the Helm
#: chart's readiness probe, so a rolling restart waits for it.
IN_SYNC_HEALTH = "tidelog.broker.InSync"
IN_SYNC_CHECK_INTERVAL_S = 1.0


class BrokerServer:
    """One broker: its PartitionManager behind a grpc.aio server."""

    def __init__(
        self,
        config: BrokerConfig,
        cluster: ClusterConfig | None = None,
        metrics: MetricsOptions | None = None,
    ) -> None:
        self.config = config
        #: Prometheus metrics, with --metrics-port only (metrics.py).
        self.metrics = None if metrics is None else BrokerMetrics(config.broker_id)
        self._metrics_options = metrics
        self.metrics_endpoint: MetricsEndpoint | None = None
        self.manager = PartitionManager(config, cluster_mode=cluster is not None)
        #: Every channel the servicers open (to coordinators, to other
        #: brokers), closed at stop.
        self.channels = ChannelPool(channel_security_of(config.tls))
        self.link = (
            None if cluster is None else ClusterLink(cluster, config, self.manager, self.channels)
        )
        self._server: grpc.aio.Server | None = None
        self._internal_server: grpc.aio.Server | None = None
        #: The internal listener's bound port (cluster mode), once started.
        self.internal_port: int | None = None
        #: Principals, ACLs and quotas (from etcd in cluster mode).
        self.security = Security(
            config.security or SecurityOptions(), config.tls, quotas_enabled=True
        )
        self._health = HealthServicer()
        self._log: LogServicer | None = None
        self._background: list[asyncio.Task[None]] = []
        self.bound_port: int | None = None

    async def start(self) -> None:
        self.manager.open()
        options = [
            ("grpc.max_receive_message_length", self.config.max_request_bytes),
            ("grpc.max_send_message_length", self.config.max_request_bytes),
            # Large messages are the fast path (ARCHITECTURE: batch big).
            ("grpc.http2.max_frame_size", 1024 * 1024 - 1),
            ("grpc.so_reuseport", 0),
            *KEEPALIVE_OPTIONS,
        ]
        metrics = self.metrics
        # Metrics first: they count the calls the security interceptor refuses.
        interceptors: list[Any] = [] if metrics is None else [metrics.rpc.interceptor()]
        interceptors.append(Interceptor(self.security))
        server = grpc.aio.server(options=options, interceptors=interceptors)
        services = [
            log_pb2.DESCRIPTOR.services_by_name["Log"].full_name,
            admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ]
        if self.link is None:
            producer_ids = LocalProducerIds(self.config.data_dir)
            self.manager.highest_producer_epoch = LocalEpochs(producer_ids).highest_epoch
            # No `confirm` needed: the allocator is in this process.
            self._log = LogServicer(self.manager, self.config, metrics=metrics)
            add_log_servicer(self._log, server)
            # (ACL, user and quota RPCs stay UNIMPLEMENTED: they need etcd.)
            admin_pb2_grpc.add_AdminServicer_to_server(
                AdminServicer(self.manager, self.config),  # type: ignore[abstract]
                server,
            )
            # InitProducerId from a local counter (idempotent producers).
            cluster_pb2_grpc.add_ClusterServicer_to_server(
                StandaloneClusterServicer(producer_ids), server
            )
            services.append(cluster_pb2.DESCRIPTOR.services_by_name["Cluster"].full_name)
        else:
            epochs = EtcdEpochs(self.link.client, self.link.keys)
            self.manager.highest_producer_epoch = epochs.highest_epoch
            self._log = LogServicer(
                self.manager, self.config, ClusterMetadata(self.link).metadata, epochs, metrics
            )
            add_log_servicer(self._log, server)
            add_admin_forwarder(AdminForwarder(self.link, self.link.forwarding), server)
            cluster_pb2_grpc.add_ClusterServicer_to_server(
                BrokerClusterServicer(self.link, self.link.forwarding), server
            )
            services.append(cluster_pb2.DESCRIPTOR.services_by_name["Cluster"].full_name)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(tuple(services), server)
        self.bound_port = add_port(server, self.config.listen_address, self.config.tls)
        if self.bound_port == 0:
            raise OSError(f"cannot listen on {self.config.listen_address}")
        if self.link is not None:
            self._internal_server = self._internal_listener(options, interceptors)
            await self._internal_server.start()
            await self.link.start(self.bound_port, self.internal_port)
            await self.security.start(self.link.client, self.link.keys)
        else:
            await self.security.start(None, None)
        await server.start()
        self._server = server
        if metrics is not None and self._metrics_options is not None:
            metrics.watch(self.manager, asyncio.get_running_loop())
            self.metrics_endpoint = MetricsEndpoint(
                metrics.registry, self._metrics_options.host, self._metrics_options.port
            )
        self._background.append(asyncio.create_task(self.manager.logs.run_flush_scheduler()))
        self._background.append(asyncio.create_task(self.manager.logs.run_retention()))
        if self.config.cleaner_enable:
            self._background.append(asyncio.create_task(self.manager.logs.run_cleaner()))
        if self.link is not None:
            self._background.append(asyncio.create_task(self.manager.replicas.run_isr_checks()))
            self._background.append(asyncio.create_task(self._report_in_sync(self.link)))
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set("tidelog.v1.Log", health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "broker %d serving on %s:%d, data in %s",
            self.config.broker_id,
            self.config.host,
            self.bound_port,
            self.config.data_dir,
        )

    async def _report_in_sync(self, link: ClusterLink) -> None:
        serving, not_serving = (
            health_pb2.HealthCheckResponse.SERVING,
            health_pb2.HealthCheckResponse.NOT_SERVING,
        )
        while True:
            # After enter_graceful_shutdown() the servicer ignores this.
            await self._health.set(IN_SYNC_HEALTH, serving if link.in_sync() else not_serving)
            await asyncio.sleep(IN_SYNC_CHECK_INTERVAL_S)

    def _internal_listener(
        self, options: Sequence[tuple[str, int | str]], interceptors: Sequence[Any]
    ) -> grpc.aio.Server:
        """Replication on a port of its own: followers read past the high
        watermark, which no client may, so the Replica service is never on
        the client listener (nor listed by its reflection)."""
        server = grpc.aio.server(options=options, interceptors=interceptors)
        replica_pb2_grpc.add_ReplicaServicer_to_server(
            ReplicaServicer(self.manager.replicas, self.config), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        # With TLS, only holders of a certificate from the cluster's
        # authority may replicate: followers read past the high watermark.
        self.internal_port = add_port(
            server, self.config.internal_listen_address, self.config.tls, require_client_cert=True
        )
        if self.internal_port == 0:
            raise OSError(f"cannot listen on {self.config.internal_listen_address} (internal)")
        return server

    async def stop(self) -> None:
        """Drain (see module doc), then close everything."""
        await self._health.enter_graceful_shutdown()
        # Clients first, while this broker still leads and its followers
        # still replicate: what a Produce stream appended is answered
        # (acks=all ones need the followers), then the streams end with
        # NOT_LEADER_OR_FOLLOWER. Only then does the broker leave the
        # cluster: revoking its registration first would leave its acks=all
        # answers to time out (no follower may fetch from a broker without a
        # live registration).
        if self._log is not None:
            self._log.drain(DRAIN_ANSWER_S)
        if self._server is not None:
            await self._server.stop(SHUTDOWN_GRACE_S)
        if self.link is not None:
            await self.link.stop()
        if self._internal_server is not None:
            await self._internal_server.stop(SHUTDOWN_GRACE_S)
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        # After the server: no call in flight opens a channel any more.
        await self.channels.close()
        for task in self._background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.security.stop()
        self.manager.close()
        log.info("broker %d stopped", self.config.broker_id)


async def serve(
    config: BrokerConfig,
    cluster: ClusterConfig | None = None,
    metrics: MetricsOptions | None = None,
) -> int:
    """Run a broker until SIGTERM or SIGINT (or etcd refuses it): the exit status."""
    broker = BrokerServer(config, cluster, metrics)
    link = broker.link
    return await serve_until_signal(
        broker.start,
        broker.stop,
        None if link is None else link.client,
        "" if cluster is None else cluster.etcd_prefix,
    )
