"""`Admin`, `Group` and `Cluster` through the gateway: forwarded to a
coordinator replica.

- Unary calls go to the live coordinator replicas (from the etcd view) in
  turn while they are UNAVAILABLE or cancel the call on their side (too
  many calls waiting, or stopping); any other failure is passed back as the
  coordinator said it (status, details, the `tidelog-error-code` trailer).
  With none answering, or one past the forwarding deadline, the call ends
  with COORDINATOR_NOT_AVAILABLE (UNAVAILABLE) naming the replica and what
  happened (tidelog_server.forwarding.unanswered).
- Admin DescribeTopics goes to the coordinator with the `tidelog-local`
  metadata key (its placement alone: the gateway asks the leaders, not the
  coordinator too), and is then completed with what only the leaders know
  (log offsets, sizes, segments), asked of each leader with that key within
  the forwarding deadline (or the client's remaining time, when shorter),
  as a broker completes it: a partition whose leader cannot tell gets an
  error naming it and -1 figures (tidelog_server.leader_figures).
- Group Heartbeat, a member's stream, is relayed both ways to one
  coordinator replica; when that replica fails before answering, the first
  request (a join or a re-attach) is sent to the next one. When it fails
  later, the client's stream ends with COORDINATOR_NOT_AVAILABLE
  (UNAVAILABLE, with the error code in the trailer, as the unary calls)
  naming the replica and what happened, and the member re-attaches
  (through the gateway, to a replica that answers): the membership lives in
  etcd, not here. With no replica answering the first request, it ends so
  too, ending "; retry" as the unary calls do. While the gateway stops
  (draining), each stream ends likewise: "the gateway is shutting down:
  re-attach through another gateway".
- Cluster DescribeCluster names the gateway as the only broker and the only
  coordinator, so that a client bootstrapped from it sends Group calls to it
  too; InitProducerId is forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio
from tidelog.errors import CoordinatorNotAvailableError
from tidelog.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    cluster_pb2,
    cluster_pb2_grpc,
    group_pb2,
    group_pb2_grpc,
    log_pb2,
)
from tidelog_server.forwarding import (
    LOCAL_METADATA,
    ask_coordinators,
    may_ask_another,
    pass_back,
    unanswered,
)
from tidelog_server.leader_figures import (
    ask_over_grpc,
    complete_from_leaders,
    leader_call_timeout,
)
from tidelog_server.stream_refusal import refuse_stream

from tidelog_gateway.channels import Channels
from tidelog_gateway.cluster_view import ClusterView
from tidelog_gateway.config import GATEWAY_NODE_ID, GatewayConfig
from tidelog_gateway.errors import abort
from tidelog_gateway.limits import StreamCounter
from tidelog_gateway.log_servicer import _open_stream

T = TypeVar("T")


class Forwarder:
    """Unary calls on the first coordinator replica that answers."""

    def __init__(self, view: ClusterView, channels: Channels, config: GatewayConfig) -> None:
        self.view = view
        self.channels = channels
        self.config = config

    async def call(
        self,
        invoke: Callable[[str], Awaitable[T]],
        context: grpc.aio.ServicerContext,
        what: str,
    ) -> T:
        """`invoke(address)` on the first coordinator replica that answers
        (tidelog_server.forwarding.ask_coordinators); its failure, or
        COORDINATOR_NOT_AVAILABLE, ends the client's call."""
        try:
            return await ask_coordinators(self.view.coordinator_addresses(), invoke, what)
        except grpc.aio.AioRpcError as exc:
            await pass_back(context, exc)
        except CoordinatorNotAvailableError as exc:
            await abort(context, exc, f"forwarding {what}")


def _forwarding(service: str, method: str) -> Any:
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        forwarder: Forwarder = self.forwarder
        timeout = forwarder.config.forward_timeout_s
        stub_of = getattr(forwarder.channels, service)
        return await forwarder.call(
            lambda address: getattr(stub_of(address), method)(request, timeout=timeout),
            context,
            method,
        )

    handler.__name__ = method
    return handler


class GatewayAdminServicer:
    """`tidelog.v1.Admin`: every rpc forwarded (methods added below), and
    DescribeTopics completed from the leaders."""

    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder

    async def DescribeTopics(
        self, request: admin_pb2.DescribeTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeTopicsResponse:
        forwarder = self.forwarder
        timeout = forwarder.config.forward_timeout_s
        response: admin_pb2.DescribeTopicsResponse = await forwarder.call(
            lambda address: forwarder.channels.admin(address).DescribeTopics(
                request, timeout=timeout, metadata=LOCAL_METADATA
            ),
            context,
            "DescribeTopics",
        )
        # Within what is left of the client's time once the coordinator answered.
        ask = ask_over_grpc(forwarder.channels.admin, leader_call_timeout(context, timeout))
        await complete_from_leaders(response, forwarder.view.broker_address, ask)
        return response


class GatewayGroupServicer:
    """`tidelog.v1.Group`: Heartbeat relayed, the unary rpcs forwarded
    (methods added below)."""

    def __init__(
        self, forwarder: Forwarder, streams: StreamCounter, draining: asyncio.Event
    ) -> None:
        self.forwarder = forwarder
        self._streams = streams
        self._draining = draining

    async def Heartbeat(
        self,
        request_iterator: AsyncIterator[group_pb2.GroupHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[group_pb2.GroupHeartbeatResponse]:
        peer = await _open_stream(self._streams, request_iterator, context)
        try:
            async with contextlib.aclosing(self._relay(request_iterator, context)) as answers:
                async for answer in answers:
                    yield answer
        finally:
            self._streams.release(peer)

    async def CommitOffsetsStream(
        self,
        request_iterator: AsyncIterator[group_pb2.CommitOffsetsStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[group_pb2.CommitOffsetsStreamResponse]:
        # Not relayed: the SDK falls back to CommitOffsets (forwarded below)
        # on UNIMPLEMENTED, which it gets only if its first write is read
        # first (tidelog_server.stream_refusal).
        await refuse_stream(
            request_iterator,
            context,
            grpc.StatusCode.UNIMPLEMENTED,
            "the gateway does not relay CommitOffsetsStream: use CommitOffsets",
        )
        yield group_pb2.CommitOffsetsStreamResponse()  # pragma: no cover (a generator)

    async def _relay(
        self,
        request_iterator: AsyncIterator[group_pb2.GroupHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncGenerator[group_pb2.GroupHeartbeatResponse, None]:
        requests = aiter(request_iterator)
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            return
        last = "no coordinator is registered in etcd"
        for address in self.forwarder.view.coordinator_addresses():
            call = self.forwarder.channels.group_streams(address).Heartbeat()
            answered = False
            pump = asyncio.ensure_future(_pump(first, requests, call))
            drained = asyncio.ensure_future(self._draining.wait())
            try:
                while True:
                    read = asyncio.ensure_future(call.read())
                    await asyncio.wait((read, drained), return_when=asyncio.FIRST_COMPLETED)
                    if not read.done():
                        read.cancel()
                        # As the gateway ends its Produce and Fetch streams
                        # when it stops ("the gateway is shutting down: ..."),
                        # with the code the relay's other ends carry: the
                        # membership lives in etcd, another gateway (or a
                        # coordinator) takes the member back.
                        await abort(
                            context,
                            CoordinatorNotAvailableError(
                                "the gateway is shutting down: re-attach through another gateway"
                            ),
                            "relaying a heartbeat",
                        )
                    answer = read.result()
                    if answer is grpc.aio.EOF:  # type: ignore[attr-defined]
                        return
                    answered = True
                    yield answer
            except grpc.aio.AioRpcError as exc:
                # A stream the coordinator's side cancelled (stopping, or
                # too many calls waiting for it) is one that went away.
                reason = unanswered(exc, f"coordinator {address}")
                if reason is None:
                    await pass_back(context, exc)
                if not answered and may_ask_another(exc):
                    last = reason
                    continue
                # With the error code the forwarded unary calls carry, so
                # that any client can tell "find the coordinator again"
                # from the gateway's own failure.
                await abort(
                    context,
                    CoordinatorNotAvailableError(
                        f"cannot relay the heartbeat to a coordinator: {reason}; re-attach"
                    ),
                    "relaying a heartbeat",
                )
            finally:
                drained.cancel()
                pump.cancel()
                call.cancel()
        await abort(
            context,
            CoordinatorNotAvailableError(
                f"cannot relay the heartbeat to a coordinator: {last}; retry"
            ),
            "relaying a heartbeat",
        )


async def _pump(
    first: group_pb2.GroupHeartbeatRequest,
    requests: AsyncIterator[group_pb2.GroupHeartbeatRequest],
    call: Any,
) -> None:
    """Client requests to the coordinator's stream."""
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
        await call.write(first)
        async for request in requests:
            await call.write(request)
        await call.done_writing()


# One forwarding method per unary rpc of each service, so that rpcs added to
# the protos are forwarded without touching this file.
for _name in admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods_by_name:
    if _name not in GatewayAdminServicer.__dict__:
        setattr(GatewayAdminServicer, _name, _forwarding("admin", _name))
for _name, _method in group_pb2.DESCRIPTOR.services_by_name["Group"].methods_by_name.items():
    if _name not in GatewayGroupServicer.__dict__ and not _method.client_streaming:
        setattr(GatewayGroupServicer, _name, _forwarding("group", _name))


def add_admin_servicer(servicer: GatewayAdminServicer, server: grpc.aio.Server) -> None:
    admin_pb2_grpc.add_AdminServicer_to_server(servicer, server)  # type: ignore[arg-type]


def add_group_servicer(servicer: GatewayGroupServicer, server: grpc.aio.Server) -> None:
    group_pb2_grpc.add_GroupServicer_to_server(servicer, server)  # type: ignore[arg-type]


class GatewayClusterServicer(cluster_pb2_grpc.ClusterServicer):
    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder

    async def InitProducerId(
        self, request: cluster_pb2.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> cluster_pb2.InitProducerIdResponse:
        forwarder = self.forwarder
        timeout = forwarder.config.forward_timeout_s
        response: cluster_pb2.InitProducerIdResponse = await forwarder.call(
            lambda address: forwarder.channels.cluster(address).InitProducerId(
                request, timeout=timeout
            ),
            context,
            "InitProducerId",
        )
        return response

    async def DescribeCluster(
        self, request: cluster_pb2.DescribeClusterRequest, context: grpc.aio.ServicerContext
    ) -> cluster_pb2.DescribeClusterResponse:
        view = self.forwarder.view
        try:
            controller = await view.controller_id()
        except Exception as exc:
            await abort(
                context,
                CoordinatorNotAvailableError(f"etcd is not reachable from the gateway: {exc}"),
                "describing the cluster",
            )
        host, port = self.forwarder.config.advertised
        response = cluster_pb2.DescribeClusterResponse(
            cluster_id=view.cluster_id, controller_id=controller
        )
        response.brokers.append(log_pb2.BrokerInfo(broker_id=GATEWAY_NODE_ID, host=host, port=port))
        if view.coordinator_addresses():
            # Only while some coordinator is live: otherwise the client's
            # own "no coordinator" error is the truthful answer.
            response.coordinators.add(id="gateway", host=host, port=port)
        return response
