"""`tidelog.v1.Log` for every partition of the cluster.

- Produce and Fetch: one proxy per client stream (produce_proxy,
  fetch_proxy), counted against the stream limits; each stream's initial
  metadata names --max-partitions-per-request
  (`tidelog-max-partitions-per-request`), and a Fetch stream's also
  --max-partitions-per-fetch (`tidelog-max-partitions-per-fetch`), sent
  before its first request is read, so that clients split their requests
  and spread their partitions over streams by them;
- ListOffsets: split by leader, asked of each, answered in request order;
  a partition that cannot be routed gets its typed error; one whose leader
  gave no answer (dropped the call, unavailable, past the deadline) gets
  NOT_LEADER_OR_FOLLOWER naming it and what happened
  (tidelog_server.forwarding.unanswered), one whose leader refused the call
  whole gets that refusal's own typed error, naming the leader
  (errors.broker_call_error); a request over
  the brokers' MAX_LIST_OFFSETS_ENTRIES is refused as they refuse it;
- Metadata: from the etcd view. The gateway names itself as the only broker
  and as the leader of every partition that has a live leader (-1 while it
  has none, so clients wait as they would for a broker): a client pointed at
  the gateway, the SDK unchanged, sends everything through it. Replicas and
  ISR are the brokers' real ids. With allow_auto_topic_creation, unknown
  topics are asked of a broker (which creates them if its
  auto.create.topics.enable allows) and awaited in the view; the next broker
  only when one dropped the call or is unavailable. When none answered, or
  one refused, the topics not created answer UNKNOWN_TOPIC_OR_PARTITION (as
  a broker answers a topic it could not create) naming the broker and what
  happened, or the broker's refusal. A topic named more than once is
  described once, as on the brokers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
from tidelog.errors import (
    MAX_PARTITIONS_METADATA_KEY,
    MAX_PARTITIONS_PER_FETCH_METADATA_KEY,
    PartitionsPerRequestError,
    TidelogError,
)
from tidelog.request_limits import check_list_offsets_entries, distinct
from tidelog.v1 import common_pb2, log_pb2, log_pb2_grpc
from tidelog_server.authorizer import may_auto_create
from tidelog_server.forwarding import may_ask_another
from tidelog_server.stream_refusal import StreamLimitError, refuse_stream_with

from tidelog_gateway.channels import Channels
from tidelog_gateway.cluster_view import ClusterView, invalid_topic_error
from tidelog_gateway.config import GATEWAY_NODE_ID, GatewayConfig
from tidelog_gateway.errors import abort, abort_shutting_down, broker_call_error, error_proto
from tidelog_gateway.fetch_proxy import FetchProxy
from tidelog_gateway.limits import ByteBudget, FetchBudget, StreamCounter
from tidelog_gateway.produce_proxy import ProduceProxy

#: How long a Metadata request waits for topics a broker auto-creates.
AUTO_CREATE_TIMEOUT_S = 5.0


class GatewayLogServicer(log_pb2_grpc.LogServicer):
    def __init__(
        self,
        view: ClusterView,
        channels: Channels,
        config: GatewayConfig,
        streams: StreamCounter,
        draining: asyncio.Event,
    ) -> None:
        self._view = view
        self._channels = channels
        self._config = config
        self._streams = streams
        self._draining = draining
        self._produce_budget = ByteBudget(config.produce_buffer_max_bytes)
        self._fetch_budget = FetchBudget(
            config.fetch_buffer_max_bytes, config.fetch_buffer_max_bytes_per_connection
        )

    @property
    def fetch_budget(self) -> FetchBudget:
        return self._fetch_budget

    async def Produce(
        self,
        request_iterator: AsyncIterator[log_pb2.ProduceRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[log_pb2.ProduceResponse]:
        peer = await _open_stream(self._streams, request_iterator, context)
        try:
            await self._advertise_limit(context)
            proxy = ProduceProxy(
                self._view, self._channels, self._config, self._produce_budget, self._draining
            )
            async with contextlib.aclosing(proxy.run(request_iterator, context)) as responses:
                async for response in responses:
                    yield response
        finally:
            self._streams.release(peer)

    async def Fetch(
        self,
        request_iterator: AsyncIterator[log_pb2.FetchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[log_pb2.FetchResponse]:
        peer = await _open_stream(self._streams, request_iterator, context)
        try:
            await self._advertise_limit(context, fetch=True)
            proxy = FetchProxy(
                self._view,
                self._channels,
                self._config,
                self._fetch_budget,
                peer,
                self._draining,
            )
            try:
                async with contextlib.aclosing(proxy.run(request_iterator)) as responses:
                    async for response in responses:
                        yield response
            except TidelogError as exc:
                await abort(context, exc, "fetching through the gateway")
            if self._draining.is_set():
                await abort_shutting_down(context, "fetch again from your positions")
        finally:
            self._streams.release(peer)

    async def _advertise_limit(
        self, context: grpc.aio.ServicerContext, *, fetch: bool = False
    ) -> None:
        """Name --max-partitions-per-request (and, on a Fetch stream,
        --max-partitions-per-fetch) in the stream's initial metadata, sent
        now, before any request is read: the client learns them while its
        first request is on the way and splits the next ones, and spreads
        its partitions over streams, by them, with no round trip of its own
        (tidelog._partition_limits). A client that sent more at once before
        it knew is refused whole and told the limit again
        (PartitionsPerRequestError, PartitionsPerFetchError)."""
        metadata = [(MAX_PARTITIONS_METADATA_KEY, str(self._config.max_partitions_per_request))]
        if fetch:
            metadata.append(
                (MAX_PARTITIONS_PER_FETCH_METADATA_KEY, str(self._config.max_partitions_per_fetch))
            )
        await context.send_initial_metadata(tuple(metadata))

    async def ListOffsets(
        self, request: log_pb2.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.ListOffsetsResponse:
        limit = self._config.max_partitions_per_request
        if len(request.partitions) > limit:
            await abort(
                context,
                PartitionsPerRequestError(
                    f"ListOffsets names {len(request.partitions)} partitions, over the limit "
                    f"of {limit} (--max-partitions-per-request)",
                    limit,
                ),
                "listing offsets",
            )
        # The brokers' limit too, refused here whole: forwarded, each leader's
        # share could pass or fail apart. Within it, each share does too.
        try:
            check_list_offsets_entries(len(request.partitions))
        except TidelogError as exc:
            await abort(context, exc, "listing offsets")
        response = log_pb2.ListOffsetsResponse()
        by_address: dict[str, list[int]] = {}
        for index, part in enumerate(request.partitions):
            result = response.partitions.add(topic=part.topic, partition=part.partition)
            try:
                address = self._view.leader_address(part.topic, part.partition)
            except TidelogError as exc:
                result.error.CopyFrom(error_proto(exc, "routing ListOffsets"))
                result.offset = -1
                result.timestamp_ms = -1
                continue
            by_address.setdefault(address, []).append(index)

        async def ask(address: str, indexes: list[int]) -> None:
            sub = log_pb2.ListOffsetsRequest(partitions=[request.partitions[i] for i in indexes])
            try:
                answer = await self._channels.log(address).ListOffsets(
                    sub, timeout=self._config.forward_timeout_s
                )
            except grpc.aio.AioRpcError as exc:
                # With no answer of its own, the leader is asked again once
                # the client retries (a read, safe to repeat).
                error = broker_call_error(
                    exc, address, common_pb2.NOT_LEADER_OR_FOLLOWER, "listing offsets"
                )
                for i in indexes:
                    result = response.partitions[i]
                    result.error.CopyFrom(error)
                    result.offset = -1
                    result.timestamp_ms = -1
                return
            for i, result in zip(indexes, answer.partitions, strict=False):
                response.partitions[i].CopyFrom(result)

        await asyncio.gather(*(ask(a, ix) for a, ix in by_address.items()))
        return response

    async def Metadata(
        self, request: log_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.MetadataResponse:
        view = self._view
        if len(request.topics) > self._config.max_partitions_per_request:
            await abort(
                context,
                PartitionsPerRequestError(
                    f"Metadata names {len(request.topics)} topics, over the limit of "
                    f"{self._config.max_partitions_per_request} (--max-partitions-per-request)",
                    self._config.max_partitions_per_request,
                ),
                "describing topics",
            )
        # Each name once (as the brokers do): a topic of thousands of
        # partitions named thousands of times would be described that many
        # times over, on the event loop.
        names = distinct(request.topics)
        # Why the topics to be auto-created were not (the broker asked
        # failed the call, or could not create them): their answer says so,
        # not just "does not exist".
        not_created: dict[str, common_pb2.Error] = {}
        if request.allow_auto_topic_creation:
            missing = [
                n
                for n in names
                if n not in view.topics
                and invalid_topic_error(n) is None
                # Created as the gateway: only what the caller may Create.
                and may_auto_create(n)
            ]
            if missing:
                not_created = await self._auto_create(missing)
        host, port = self._config.advertised
        response = log_pb2.MetadataResponse(responder_id=GATEWAY_NODE_ID)
        response.brokers.add(broker_id=GATEWAY_NODE_ID, host=host, port=port)
        for name in names or sorted(view.topics):
            topic_md = response.topics.add(name=name)
            try:
                topic = view.topic(name)
            except TidelogError as exc:
                failed = not_created.get(name)
                if failed is None:
                    topic_md.error.CopyFrom(error_proto(exc, "describing a topic"))
                else:
                    topic_md.error.CopyFrom(failed)
                continue
            for partition, replicas in enumerate(topic.replicas):
                state = view.state(topic, partition)
                live = view.live_leader(topic, partition) is not None
                topic_md.partitions.add(
                    partition=partition,
                    leader_id=GATEWAY_NODE_ID if live else -1,
                    leader_epoch=0 if state is None else state.leader_epoch,
                    replicas=replicas,
                    isr=() if state is None else state.isr,
                    offline_replicas=view.known.offline_replicas(name, partition, replicas),
                )
        return response

    async def _auto_create(self, names: list[str]) -> dict[str, common_pb2.Error]:
        """Ask a broker for the topics with creation allowed (it creates
        them when its config says so), then wait for them in the view.

        Returns the error of each topic that was not created: when no
        broker answered the call, or one refused it, "does not exist and was
        not auto-created" and why (broker_call_error: UNKNOWN_TOPIC_OR_PARTITION,
        retriable as on a broker that could not create them, naming the
        broker and what happened; or the broker's refusal); when the broker
        answered, the error it gave the topic (a broker that tried and
        could not says why)."""
        request = log_pb2.MetadataRequest(topics=names, allow_auto_topic_creation=True)
        failed = common_pb2.Error(
            code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
            message="no broker is registered in etcd; retry",
        )
        for address in self._view.broker_addresses():
            try:
                stub: Any = self._channels.log(address)
                answer = await stub.Metadata(request, timeout=AUTO_CREATE_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                failed = broker_call_error(
                    exc, address, common_pb2.UNKNOWN_TOPIC_OR_PARTITION, "auto-creating topics"
                )
                if may_ask_another(exc):
                    continue
                # Past the deadline, the broker may still create them: they
                # are not asked of another too. Refused: another would refuse.
                return _not_created(names, failed)
            # Not created (auto-creation off, or the broker could not): the
            # answer says so, no wait.
            refused = {t.name: t.error for t in answer.topics if t.error.code and t.name in names}
            names = [t.name for t in answer.topics if not t.error.code and t.name in names]
            break
        else:
            return _not_created(names, failed)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + AUTO_CREATE_TIMEOUT_S
        while loop.time() < deadline:
            ready = all(
                (t := self._view.topics.get(n)) is not None
                and all(self._view.state(t, p) is not None for p in range(len(t.replicas)))
                for n in names
            )
            if ready:
                break
            await self._view.wait_changed(max(0.0, deadline - loop.time()))
        return refused


def _not_created(names: list[str], failed: common_pb2.Error) -> dict[str, common_pb2.Error]:
    """Each of `names` "does not exist and was not auto-created", for the
    reason `failed` gives, with its code."""
    return {
        name: common_pb2.Error(
            code=failed.code,
            message=f"topic {name!r} does not exist and was not auto-created: {failed.message}",
        )
        for name in names
    }


async def _open_stream(
    streams: StreamCounter,
    request_iterator: AsyncIterator[Any],
    context: grpc.aio.ServicerContext,
) -> str:
    """Count one more stream on the caller's connection, or refuse the call
    (after the client's first request: see tidelog_server.stream_refusal)."""
    peer = context.peer()
    try:
        streams.acquire(peer)
    except StreamLimitError as exc:
        await refuse_stream_with(request_iterator, context, exc)
    return peer
