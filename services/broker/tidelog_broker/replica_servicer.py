"""Leader side of replication (`tidelog.internal.Replica`): answers the
ReplicaFetch streams of followers.

Each request names every partition the follower follows on this broker with
its log end offset (the fetch offset). The leader records that progress
(ReplicaManager.on_follower_fetch: follower LEO, HW, ISR expansion), checks
the follower's epoch against the partition's epoch history, and answers with
the batches past the fetch offset, as stored. With nothing new (no data, no
HW the follower has not seen) it long-polls on the partitions' append
waiters, which appends and HW moves both wake, for at most max_wait_ms.

Who may fetch: followers read past the high watermark, so a partition is
served only to a replica id assigned to it and registered live in etcd
(`ReplicaManager.follower_registration`); any other id gets
NOT_LEADER_OR_FOLLOWER for that partition, with no records, and its fetch
offset is not taken as progress. One stream speaks for one replica id.
This binds a fetch to a live registration, not to a proven identity.
The service is served only on the broker's internal listener (server.py),
never on the client port; with TLS, that listener requires a certificate
from the cluster's authority; without it, a process that can reach the
internal port can still pose as a live follower: keep it off the clients'
network.

Replicas being added by a reassignment started with a throttle get at most
the broker's replication throttle (replica_throttle): with the bucket empty,
their partitions are answered without records (and the long-poll waits on).

Not thread-safe: runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc
from tidelog.errors import FencedLeaderEpochError, NotLeaderOrFollowerError, TidelogError
from tidelog_server.internal import replica_pb2, replica_pb2_grpc

from tidelog_broker.config import BrokerConfig
from tidelog_broker.error_mapping import error_proto
from tidelog_broker.log_manager import TopicPartitionKey
from tidelog_broker.replica_manager import ReplicaManager
from tidelog_broker.storage.leader_epoch import UNDEFINED, LeaderEpochCache

log = logging.getLogger("tidelog.broker.replication")

#: Upper bound of a follower's max_wait_ms: a held request also delays its
#: stream's other partitions joining.
MAX_WAIT_CAP_MS = 5_000
#: Upper bound of a follower's max_bytes (one gRPC message).
MAX_BYTES_CAP = 32 * 1024 * 1024


class ReplicaServicer(replica_pb2_grpc.ReplicaServicer):
    """Serves followers' fetches from the partitions this broker leads."""

    def __init__(self, manager: ReplicaManager, config: BrokerConfig) -> None:
        self._manager = manager
        self._config = config

    async def ReplicaFetch(
        self,
        request_iterator: AsyncIterator[replica_pb2.ReplicaFetchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[replica_pb2.ReplicaFetchResponse]:
        # The HW last sent to this follower per partition: a new one is news.
        sent_hw: dict[TopicPartitionKey, int] = {}
        replica_id: int | None = None
        async for request in request_iterator:
            if replica_id is None:
                replica_id = request.replica_id
            elif request.replica_id != replica_id:
                # One follower per stream: the progress a stream reports, and
                # the HWs it was sent, belong to one replica.
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"this ReplicaFetch stream fetches for replica {replica_id}, "
                    f"not {request.replica_id}: open one stream per replica",
                )
            yield await self._answer(request, sent_hw)

    async def _answer(
        self, request: replica_pb2.ReplicaFetchRequest, sent_hw: dict[TopicPartitionKey, int]
    ) -> replica_pb2.ReplicaFetchResponse:
        loop = asyncio.get_running_loop()
        max_wait_ms = min(
            request.max_wait_ms or self._config.replica_fetch_wait_max_ms, MAX_WAIT_CAP_MS
        )
        max_bytes = min(request.max_bytes or self._config.replica_fetch_max_bytes, MAX_BYTES_CAP)
        deadline = loop.time() + max_wait_ms / 1000
        # Progress is recorded once per request; the long-poll only re-reads.
        for part in request.partitions:
            with contextlib.suppress(TidelogError):  # answered per partition by _collect
                self._manager.on_follower_fetch(
                    part.topic, part.partition, request.replica_id, part.fetch_offset
                )
        keys = [(p.topic, p.partition) for p in request.partitions]
        while True:
            response, news = self._collect(request, max_bytes, sent_hw)
            remaining = deadline - loop.time()
            if news or remaining <= 0 or not keys:
                break
            await self._manager.wait_for_append(keys, remaining)
        for data in response.partitions:
            sent_hw[(data.topic, data.partition)] = data.high_watermark
        return response

    def _collect(
        self,
        request: replica_pb2.ReplicaFetchRequest,
        max_bytes: int,
        sent_hw: dict[TopicPartitionKey, int],
    ) -> tuple[replica_pb2.ReplicaFetchResponse, bool]:
        response = replica_pb2.ReplicaFetchResponse()
        news = False
        budget = max_bytes
        for part in request.partitions:
            data = response.partitions.add(topic=part.topic, partition=part.partition)
            key = (part.topic, part.partition)
            try:
                partition_log = self._manager.partition_log(part.topic, part.partition)
                replication = self._manager.replication(part.topic, part.partition)
                if (
                    replication is None
                    or not replication.is_leader
                    or not self._manager.lease_valid()
                ):
                    raise NotLeaderOrFollowerError(
                        f"broker {self._config.broker_id} does not lead "
                        f"{part.topic}-{part.partition}"
                    )
                # Before anything is read: only a live assigned replica may.
                self._manager.follower_registration(replication, request.replica_id)
                if part.current_leader_epoch < replication.leader_epoch:
                    raise FencedLeaderEpochError(
                        f"{part.topic}-{part.partition}: follower epoch "
                        f"{part.current_leader_epoch} is older than {replication.leader_epoch}"
                    )
                if part.current_leader_epoch > replication.leader_epoch:
                    raise NotLeaderOrFollowerError(
                        f"{part.topic}-{part.partition}: epoch {part.current_leader_epoch} is "
                        f"newer than this leader's {replication.leader_epoch}"
                    )
                log_end_offset = partition_log.log_end_offset
                high_watermark = self._manager.high_watermark(partition_log)
                data.high_watermark = high_watermark
                data.log_start_offset = partition_log.log_start_offset
                diverging = self._diverging(part, partition_log.leader_epochs, log_end_offset)
                if diverging is not None:
                    data.diverging_epoch.epoch, data.diverging_epoch.end_offset = diverging
                    news = True
                    continue
                data.log_end_offset = log_end_offset
                if sent_hw.get(key) != high_watermark:
                    news = True
                throttled = self._manager.throttle.applies(key, request.replica_id)
                allowed = min(budget, self._manager.throttle.allowance()) if throttled else budget
                if part.fetch_offset < log_end_offset and allowed > 0:
                    result = partition_log.read(part.fetch_offset, allowed)
                    if result.records:
                        data.records = bytes(result.records)  # protobuf takes bytes
                        budget -= len(result.records)
                        news = True
                        if throttled:
                            self._manager.throttle.consume(len(result.records))
                replication.on_answer(request.replica_id, log_end_offset)
            except TidelogError as exc:
                data.error.CopyFrom(error_proto(exc, f"replicating {part.topic}-{part.partition}"))
                news = True
        return response, news

    @staticmethod
    def _diverging(
        part: replica_pb2.ReplicaFetchPartition, epochs: LeaderEpochCache, log_end_offset: int
    ) -> tuple[int, int] | None:
        """(epoch, end_offset) where the follower's log leaves ours, or None."""
        if part.last_fetched_epoch < 0:
            if part.fetch_offset > log_end_offset:
                return -1, log_end_offset
            return None
        epoch, end_offset = epochs.end_offset_for_epoch(part.last_fetched_epoch, log_end_offset)
        if (epoch, end_offset) == UNDEFINED:
            # Every epoch we know is newer than the follower's last one: it
            # keeps nothing past where our history starts.
            entries = epochs.entries
            start = entries[0][1] if entries else log_end_offset
            return (-1, start) if part.fetch_offset > start else None
        if epoch != part.last_fetched_epoch or end_offset < part.fetch_offset:
            return epoch, end_offset
        return None
