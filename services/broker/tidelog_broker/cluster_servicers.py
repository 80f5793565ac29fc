"""gRPC services a broker serves only in cluster mode.

- `AdminForwarder` (`tidelog.v1.Admin`): topic administration belongs to the
  coordinator in cluster mode, but clients bootstrap from brokers; each call
  is forwarded unchanged to a live coordinator replica (the next one on
  UNAVAILABLE), and its answer or error is passed back as is. DescribeTopics
  goes to the coordinator with the `tidelog-local` metadata key (its
  placement alone: the broker asks the leaders, not the coordinator too)
  and is then completed with what only brokers know (log offsets, sizes,
  segments): from this broker's logs, and from each other leader, asked with
  that key so that it answers from its own logs instead of forwarding
  again; a partition whose leader cannot tell gets an error naming it and
  -1 figures (tidelog_server.leader_figures).
  DeleteRecords goes to the coordinator too, which asks each partition's
  leader with that key: the leader then deletes in its own logs
  (delete_records).
- `BrokerClusterServicer` (`tidelog.v1.Cluster`): DescribeCluster from the
  broker's etcd view, so that a client given only a broker address learns
  the coordinator endpoints (the consumer's group membership needs them);
  InitProducerId forwarded to a coordinator.
- `ClusterMetadata`: the answer to `tidelog.v1.Log`'s Metadata in cluster
  mode (the LogServicer calls it): every live broker, each partition's
  leader, from the broker's etcd view; unknown topics auto-created on a
  coordinator first when the broker and the request allow it.

Every channel these open (to coordinators, to other brokers) comes from the
broker's one pool, which its stop closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import grpc
import grpc.aio
from tidelog.errors import CoordinatorNotAvailableError, InvalidTopicError, error_from_rpc
from tidelog.names import validate_topic_name
from tidelog.request_limits import distinct
from tidelog.v1 import admin_pb2, admin_pb2_grpc, cluster_pb2, cluster_pb2_grpc, common_pb2, log_pb2
from tidelog_server.authorizer import may_auto_create
from tidelog_server.etcd import Election
from tidelog_server.etcd.records import BrokerRegistration, CoordinatorRegistration
from tidelog_server.forwarding import LOCAL_METADATA, CoordinatorForwarding, is_local
from tidelog_server.leader_figures import (
    ask_over_grpc,
    complete_from_leaders,
    leader_call_timeout,
)

from tidelog_broker.admin_servicer import described_partition
from tidelog_broker.cluster_link import ClusterLink
from tidelog_broker.coordinator_forwarding import FORWARD_TIMEOUT_S, forward_to_coordinator
from tidelog_broker.delete_records import delete_records
from tidelog_broker.error_mapping import abort
from tidelog_broker.producer_ids import ProducerIdForwarder

log = logging.getLogger("tidelog.broker.cluster")

#: How long a Metadata request may wait for a topic it auto-creates.
AUTO_CREATE_TIMEOUT_S = 5.0
#: How long DescribeTopics waits for another leader's figures at most (less
#: when the client's call has less time left: leader_call_timeout); past it,
#: that leader's partitions are described with REQUEST_TIMED_OUT.
LEADER_CALL_TIMEOUT_S = 5.0


class AdminForwarder:
    """Every rpc of `tidelog.v1.Admin`, forwarded to a coordinator."""

    def __init__(self, link: ClusterLink, forwarding: CoordinatorForwarding) -> None:
        self._link = link
        # Channels to coordinators and to other brokers alike: one pool,
        # closed by the broker's stop.
        self._forwarding = forwarding

    def _stub(self, address: str) -> Any:
        return admin_pb2_grpc.AdminStub(self._forwarding.pool.channel(address))

    async def forward(
        self,
        method: str,
        request: Any,
        context: grpc.aio.ServicerContext,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> Any:
        return await forward_to_coordinator(
            self._forwarding,
            lambda channel: getattr(admin_pb2_grpc.AdminStub(channel), method)(
                request, timeout=FORWARD_TIMEOUT_S, metadata=metadata
            ),
            context,
            method,
        )

    async def DeleteRecords(
        self, request: admin_pb2.DeleteRecordsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DeleteRecordsResponse:
        if not is_local(context):
            return await self.forward("DeleteRecords", request, context)
        try:
            return await delete_records(self._link.manager, request)
        except Exception as exc:
            await abort(context, exc, "deleting records")

    async def DescribeTopics(
        self, request: admin_pb2.DescribeTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeTopicsResponse:
        if is_local(context):
            return self._describe_local(request)
        response: admin_pb2.DescribeTopicsResponse = await self.forward(
            "DescribeTopics", request, context, LOCAL_METADATA
        )
        me = self._link.broker.broker_id
        # What is left of the client's time once the coordinator answered.
        timeout = leader_call_timeout(context, LEADER_CALL_TIMEOUT_S)

        def address_of(broker_id: int) -> str | None:
            # Itself even while not (yet) registered: it answers from its logs.
            if broker_id == me:
                return f"{self._link.host}:{self._link.port}"
            return self._link.view.broker_address(broker_id)

        remote = ask_over_grpc(self._stub, timeout)

        async def ask(
            leader: int, address: str, sub: admin_pb2.DescribeTopicsRequest
        ) -> admin_pb2.DescribeTopicsResponse:
            # Itself from its own logs, without a call.
            return self._describe_local(sub) if leader == me else await remote(leader, address, sub)

        await complete_from_leaders(response, address_of, ask)
        return response

    def _describe_local(
        self, request: admin_pb2.DescribeTopicsRequest
    ) -> admin_pb2.DescribeTopicsResponse:
        """The partitions of `request.names` this broker hosts (no error for
        others); an offline log's with its STORAGE_ERROR and -1 figures.
        Each with the leader this broker knows (ReplicaManager.known_leader:
        itself only while it leads, -1 when it knows none), not itself for
        every replica: a client asking one broker learns whether its
        figures are the leader's."""
        response = admin_pb2.DescribeTopicsResponse()
        manager = self._link.manager
        for name in distinct(request.names):
            description = response.topics.add(name=name)
            try:
                views = manager.describe(name)
            except Exception:
                continue
            description.partitions.extend(
                described_partition(
                    view, leader_id=manager.replicas.known_leader(name, view.partition)
                )
                for view in views
            )
        return response


def _forwarding_method(name: str) -> Any:
    async def method(self: AdminForwarder, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.forward(name, request, context)

    method.__name__ = name
    return method


# One forwarding method per rpc of the service, so rpcs added to admin.proto
# are forwarded without touching this file.
for _name in admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods_by_name:
    if not hasattr(AdminForwarder, _name):
        setattr(AdminForwarder, _name, _forwarding_method(_name))


def add_admin_forwarder(forwarder: AdminForwarder, server: grpc.aio.Server) -> None:
    admin_pb2_grpc.add_AdminServicer_to_server(forwarder, server)  # type: ignore[arg-type]


class BrokerClusterServicer(cluster_pb2_grpc.ClusterServicer):
    def __init__(self, link: ClusterLink, forwarding: CoordinatorForwarding) -> None:
        self._link = link
        self._producer_ids = ProducerIdForwarder(forwarding)

    async def InitProducerId(
        self, request: cluster_pb2.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> cluster_pb2.InitProducerIdResponse:
        # Producer ids live in etcd; a coordinator allocates them.
        return await self._producer_ids.forward(request, context)

    async def DescribeCluster(
        self, request: cluster_pb2.DescribeClusterRequest, context: grpc.aio.ServicerContext
    ) -> cluster_pb2.DescribeClusterResponse:
        try:
            return await self._describe_cluster()
        except Exception as exc:
            await abort(
                context,
                CoordinatorNotAvailableError(f"etcd is not reachable from this broker: {exc}"),
                "describing the cluster",
            )

    async def _describe_cluster(self) -> cluster_pb2.DescribeClusterResponse:
        view = self._link.view
        controller = await Election.leader(self._link.client, self._link.keys.election)
        return cluster_pb2.DescribeClusterResponse(
            cluster_id=self._link.cluster_id,
            controller_id=(
                ""
                if controller is None
                else CoordinatorRegistration.decode(controller).coordinator_id
            ),
            brokers=[_broker_info(live.registration) for _, live in sorted(view.brokers.items())],
            coordinators=[
                cluster_pb2.CoordinatorInfo(id=c.coordinator_id or name, host=c.host, port=c.port)
                for name, c in sorted(view.coordinators.items())
            ],
        )


def _broker_info(registration: BrokerRegistration) -> log_pb2.BrokerInfo:
    return log_pb2.BrokerInfo(
        broker_id=registration.broker_id,
        host=registration.host,
        port=registration.port,
        rack=registration.rack,
    )


class ClusterMetadata:
    """Metadata in cluster mode, from the broker's etcd view (module doc)."""

    def __init__(self, link: ClusterLink) -> None:
        self._link = link

    def live_brokers(self) -> dict[int, BrokerRegistration]:
        brokers = {
            broker_id: live.registration for broker_id, live in self._link.view.brokers.items()
        }
        me = self._link.broker.broker_id
        if me not in brokers:
            # Not (yet) registered: still describe ourselves to our clients.
            brokers[me] = BrokerRegistration(me, self._link.host, self._link.port)
        return brokers

    async def metadata(self, request: log_pb2.MetadataRequest) -> log_pb2.MetadataResponse:
        """Every live broker; each partition's leader (-1 while its leader is
        not alive or its state is not written yet). With
        auto.create.topics.enable and a request that allows it, unknown
        topics are created on a coordinator first (as Kafka's brokers do).
        A topic named more than once is described once."""
        view = self._link.view
        # Each name once, in the order given (Kafka's brokers take a set):
        # described once per entry, a topic of thousands of partitions named
        # thousands of times kept the event loop (every other call to this
        # broker) busy for minutes, building tens of millions of entries.
        names = distinct(request.topics)
        invalid = _invalid_names(names)
        # Why topics to be auto-created were not: their answer says so, not
        # just "does not exist".
        not_created: dict[str, common_pb2.Error] = {}
        if request.allow_auto_topic_creation and self._link.broker.auto_create_topics:
            missing = [
                n for n in names if n not in view.topics and n not in invalid and may_auto_create(n)
            ]
            if missing:
                not_created = await self._auto_create(missing)
        response = log_pb2.MetadataResponse(responder_id=self._link.broker.broker_id)
        brokers = self.live_brokers()
        for _, registration in sorted(brokers.items()):
            response.brokers.append(_broker_info(registration))
        for name in names or sorted(view.topics):
            topic_md = response.topics.add(name=name)
            if name in invalid:
                # Not retriable: no such topic can ever exist.
                topic_md.error.code = common_pb2.INVALID_TOPIC
                topic_md.error.message = invalid[name]
                continue
            topic = view.topics.get(name)
            if topic is None:
                failed = not_created.get(name)
                if failed is None:
                    topic_md.error.code = common_pb2.UNKNOWN_TOPIC_OR_PARTITION
                    topic_md.error.message = f"topic {name!r} does not exist"
                else:
                    topic_md.error.code = failed.code
                    topic_md.error.message = (
                        f"topic {name!r} does not exist and was not auto-created: {failed.message}"
                    )
                continue
            for partition, replicas in enumerate(topic.replicas):
                state = view.state(topic, partition)
                leader = -1 if state is None or state.leader not in brokers else state.leader
                topic_md.partitions.add(
                    partition=partition,
                    leader_id=leader,
                    leader_epoch=0 if state is None else state.leader_epoch,
                    replicas=replicas,
                    isr=[] if state is None else state.isr,
                    offline_replicas=view.offline_replicas(name, partition, replicas),
                )
        return response

    async def _auto_create(self, names: list[str]) -> dict[str, common_pb2.Error]:
        """CreateTopics on a coordinator with the broker's defaults, then wait
        (briefly) until the watches have delivered the new topics.

        Returns why topics were not created, by name, as the gateway words
        it (tidelog_gateway.errors.broker_call_error): with no coordinator
        answering, UNKNOWN_TOPIC_OR_PARTITION (retriable, as for a topic
        not there yet) naming the replica and what happened; a
        coordinator's refusal of the whole call, the code it refused with;
        its refusal of a topic, UNKNOWN_TOPIC_OR_PARTITION naming the code
        and its words."""
        request = admin_pb2.CreateTopicsRequest(
            topics=[
                admin_pb2.NewTopic(name=n, partitions=self._link.broker.num_partitions)
                for n in names
            ]
        )
        failed: dict[str, common_pb2.Error] = {}
        try:
            answer: admin_pb2.CreateTopicsResponse = await self._link.forwarding.call(
                lambda channel: admin_pb2_grpc.AdminStub(channel).CreateTopics(
                    request, timeout=AUTO_CREATE_TIMEOUT_S
                ),
                "CreateTopics",
            )
        except CoordinatorNotAvailableError as exc:
            log.info("auto-creating %s failed: %s", names, exc.message)
            return dict.fromkeys(
                names,
                common_pb2.Error(code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION, message=exc.message),
            )
        except grpc.aio.AioRpcError as exc:
            refusal = error_from_rpc(exc, unavailable=CoordinatorNotAvailableError)
            log.info("auto-creating %s failed: %s", names, refusal.message)
            return dict.fromkeys(
                names,
                common_pb2.Error(
                    code=common_pb2.ErrorCode.Value(refusal.code_name),
                    message=f"the coordinator refused CreateTopics ({refusal.code_name}: "
                    f"{refusal.message})",
                ),
            )
        for result in answer.topics:
            # Already created by a concurrent request, say: the wait below
            # finds it. A topic refused (a replication factor over the live
            # brokers, say) stays UNKNOWN_TOPIC_OR_PARTITION, retriable, as
            # before: it may be created once brokers return; the words say why.
            if result.error.code not in (common_pb2.NONE, common_pb2.TOPIC_ALREADY_EXISTS):
                code = common_pb2.ErrorCode.Name(result.error.code)
                failed[result.name] = common_pb2.Error(
                    code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                    message=f"the coordinator refused to create it ({code}: "
                    f"{result.error.message})",
                )
        names = [n for n in names if n not in failed]
        view = self._link.view
        loop = asyncio.get_running_loop()
        deadline = loop.time() + AUTO_CREATE_TIMEOUT_S
        while loop.time() < deadline:
            ready = [
                n
                for n in names
                if (t := view.topics.get(n)) is not None
                and all(view.state(t, p) is not None for p in range(len(t.replicas)))
            ]
            if len(ready) == len(names):
                break
            await asyncio.sleep(0.02)
        return failed


def _invalid_names(names: Iterable[str]) -> dict[str, str]:
    """Names that break the naming rule -> why (INVALID_TOPIC in Metadata)."""
    invalid = {}
    for name in names:
        try:
            validate_topic_name(name)
        except InvalidTopicError as exc:
            invalid[name] = exc.message
    return invalid
