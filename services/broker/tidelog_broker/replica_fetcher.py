"""Follower side of replication: one ReplicaFetcher per leader broker.

A fetcher keeps one `Replica.ReplicaFetch` stream open to its leader and runs
it in lock step: send a request naming every partition followed on that
leader (fetch offset = this log's end, the epoch known from etcd, the epoch
of the log's last batch), read the answer, apply it, repeat. Applying means:
append the batches as they are (`PartitionLog.append_replicated`, keeping
the leader's offsets), take the leader's HW (capped at our log end) and its
log start offset (records it deleted go here too), or,
when the leader reports a diverging epoch, truncate the divergent suffix and
fetch again. When our log ends below the leader's log start offset (the
leader answers OFFSET_OUT_OF_RANGE: retention deleted what we still need),
the log is reset to an empty one at the leader's log start and fetched again
at once. A partition whose answer is another error (the leader moved, an
epoch mismatch) waits a short backoff before it is asked for again; etcd's
watch meanwhile tells the ClusterLink where it went. A partition whose log
a storage failure took offline (a reset that failed part-way: the lookup
answers StorageError) is not fetched at all, as Kafka's fetcher drops the
partitions of a failed log directory: the leader sees no progress from this
replica and shrinks the ISR without it.

A fetcher fetches only while this broker holds its etcd registration
(`registered`): a process whose lease expired (frozen, cut off, or a
previous incarnation whose id a new process has taken) must not report its
log end offset as that replica's progress; the leader refuses such fetches
too, and the fetcher starts again once the broker has registered anew.

An answer is applied only while the partition is still followed, in the same
epoch as when it was asked for and while the ReplicaManager still has it
as a follower: a late answer from a deposed leader never reaches a log this
broker now leads.

Not thread-safe: runs on the broker's event loop; ReplicaFetchers owns them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
from tidelog.errors import StorageError, TidelogError
from tidelog.v1 import common_pb2
from tidelog_server.internal import replica_pb2, replica_pb2_grpc
from tidelog_server.log_flood import RateLimitedLog
from tidelog_server.tls import channel_security_of

from tidelog_broker.config import BrokerConfig
from tidelog_broker.log_manager import TopicPartitionKey
from tidelog_broker.replica_manager import ReplicaManager
from tidelog_broker.replica_state import Role

log = logging.getLogger("tidelog.broker.replication")
# Errors that loops repeat (per partition, per pass) log once per interval.
flood = RateLimitedLog(log)

#: Pause before asking again for a partition whose answer was an error.
ERROR_BACKOFF_S = 0.1
#: Pause before looking again at a partition whose log is offline.
OFFLINE_BACKOFF_S = 1.0
#: Pause before reconnecting a broken stream.
RECONNECT_BACKOFF_S = 0.1
#: Pause between looks at our registration while we are not registered.
UNREGISTERED_BACKOFF_S = 0.1


class ReplicaFetcher:
    """Replicates the partitions this broker follows on one leader broker."""

    def __init__(
        self,
        leader_id: int,
        manager: ReplicaManager,
        config: BrokerConfig,
        address_of: Callable[[int], str | None],
        registered: Callable[[], bool] = lambda: True,
    ) -> None:
        self.leader_id = leader_id
        self._manager = manager
        self._config = config
        self._address_of = address_of
        self._registered = registered
        #: Followed partitions -> the leader epoch etcd gave for them.
        self.partitions: dict[TopicPartitionKey, int] = {}
        self._retry_at: dict[TopicPartitionKey, float] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"replica-fetcher-{self.leader_id}")

    def set_partitions(self, partitions: dict[TopicPartitionKey, int]) -> None:
        if partitions != self.partitions:
            self.partitions = dict(partitions)
            self._changed.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        options = [
            ("grpc.max_receive_message_length", self._config.max_request_bytes),
            ("grpc.max_send_message_length", self._config.max_request_bytes),
            ("grpc.http2.max_frame_size", 1024 * 1024 - 1),
        ]
        while True:
            address = self._address_of(self.leader_id)
            if address is None or not self.partitions:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await self._changed.wait()
                continue
            try:
                # With TLS, the leader's internal listener asks for this
                # broker's certificate (channel_security_of presents it).
                channel_security = channel_security_of(self._config.tls)
                async with channel_security.aio_channel(address, options=options) as channel:
                    stub: Any = replica_pb2_grpc.ReplicaStub(channel)
                    call = stub.ReplicaFetch()
                    await self._fetch_loop(call, address)
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.info(
                    "replica fetch from broker %d at %s: %s", self.leader_id, address, exc.code()
                )
            except Exception:
                flood.exception("replica fetch from broker %d failed", self.leader_id)
            await asyncio.sleep(RECONNECT_BACKOFF_S)

    async def _fetch_loop(self, call: Any, address: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._address_of(self.leader_id) != address:
                call.cancel()
                return  # the leader moved (restarted elsewhere)
            now = loop.time()
            asked = {k: e for k, e in self.partitions.items() if self._retry_at.get(k, 0) <= now}
            if not asked:
                wake = min((self._retry_at.get(k, now) for k in self.partitions), default=now)
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.01, wake - now) if self.partitions else 0.5):
                        await self._changed.wait()
                if not self.partitions:
                    call.cancel()
                    return
                continue
            if not self._registered():
                await asyncio.sleep(UNREGISTERED_BACKOFF_S)  # see module doc
                continue
            request = self._request(asked, now)
            await call.write(request)
            response = await call.read()
            if response is grpc.aio.EOF:  # type: ignore[attr-defined]
                return
            self._apply(response, asked)

    def _request(
        self, asked: dict[TopicPartitionKey, int], now: float
    ) -> replica_pb2.ReplicaFetchRequest:
        """The next fetch of the `asked` partitions (partition -> leader
        epoch), each from its log end; those without a log here are left
        out, and those whose log is offline are also left alone a while."""
        request = replica_pb2.ReplicaFetchRequest(
            replica_id=self._config.broker_id,
            max_wait_ms=self._config.replica_fetch_wait_max_ms,
            max_bytes=self._config.replica_fetch_max_bytes,
        )
        for (topic, partition), epoch in asked.items():
            try:
                partition_log = self._manager.partition_log(topic, partition)
            except StorageError as exc:
                # Offline (a reset failed part-way): not fetched, so its
                # half-reset end never counts as this replica's progress
                # and the leader drops it from the ISR; looked up again
                # now and then (a new log replaces it if it is hosted anew).
                flood.warning("not replicating %s-%d: %s", topic, partition, exc)
                self._retry_at[(topic, partition)] = now + OFFLINE_BACKOFF_S
                continue
            except TidelogError:
                continue
            request.partitions.add(
                topic=topic,
                partition=partition,
                fetch_offset=partition_log.log_end_offset,
                current_leader_epoch=epoch,
                last_fetched_epoch=partition_log.leader_epochs.latest_epoch,
            )
        return request

    def _apply(
        self, response: replica_pb2.ReplicaFetchResponse, asked: dict[TopicPartitionKey, int]
    ) -> None:
        now = asyncio.get_running_loop().time()
        for data in response.partitions:
            key = (data.topic, data.partition)
            epoch = asked.get(key)
            replication = self._manager.replication(data.topic, data.partition)
            if (
                epoch is None
                or self.partitions.get(key) != epoch
                or replication is None
                or replication.role is not Role.FOLLOWER
                or replication.leader_epoch != epoch
            ):
                continue  # no longer ours to apply (see module doc)
            if data.error.code == common_pb2.OFFSET_OUT_OF_RANGE and self._behind_leader_start(
                key, data.log_start_offset
            ):
                continue
            if data.error.code != common_pb2.NONE:
                log.debug(
                    "replicating %s-%d from broker %d: %s",
                    data.topic,
                    data.partition,
                    self.leader_id,
                    data.error.message,
                )
                self._retry_at[key] = now + ERROR_BACKOFF_S
                continue
            self._retry_at.pop(key, None)
            try:
                if data.HasField("diverging_epoch"):
                    self._truncate(key, data.diverging_epoch)
                    continue
                self._manager.append_replicated(
                    data.topic,
                    data.partition,
                    data.records,
                    data.high_watermark,
                    data.log_end_offset if data.HasField("log_end_offset") else None,
                )
                self._manager.follow_log_start(data.topic, data.partition, data.log_start_offset)
            except (TidelogError, ValueError) as exc:
                flood.warning(
                    "replicating %s-%d from broker %d failed: %s",
                    data.topic,
                    data.partition,
                    self.leader_id,
                    exc,
                )
                self._retry_at[key] = now + ERROR_BACKOFF_S

    def _behind_leader_start(self, key: TopicPartitionKey, leader_log_start: int) -> bool:
        """Our log ends below the leader's log start (retention deleted what
        we still need): restart it empty there and refetch at once. False
        (nothing done) otherwise, or when the reset failed."""
        topic, partition = key
        try:
            if leader_log_start <= self._manager.partition_log(topic, partition).log_end_offset:
                return False
            self._manager.reset_replica(topic, partition, leader_log_start)
        except TidelogError as exc:
            flood.warning(
                "resetting %s-%d to the log start %d of broker %d failed: %s",
                topic,
                partition,
                leader_log_start,
                self.leader_id,
                exc,
            )
            return False
        self._retry_at.pop(key, None)
        return True

    def _truncate(self, key: TopicPartitionKey, diverging: replica_pb2.DivergingEpoch) -> None:
        """Cut our log where it leaves the leader's (KIP-320): at the leader's
        end of the diverging epoch, or earlier where our own epoch ended."""
        topic, partition = key
        partition_log = self._manager.partition_log(topic, partition)
        offset = diverging.end_offset
        if diverging.epoch >= 0:
            own_epoch, own_end = partition_log.leader_epochs.end_offset_for_epoch(
                diverging.epoch, partition_log.log_end_offset
            )
            if own_epoch >= 0:
                offset = min(offset, own_end)
        offset = max(0, min(offset, partition_log.log_end_offset))
        self._manager.truncate_replica(topic, partition, offset)


class ReplicaFetchers:
    """The fetchers of this broker, one per leader it follows partitions on."""

    def __init__(
        self,
        manager: ReplicaManager,
        config: BrokerConfig,
        address_of: Callable[[int], str | None],
        registered: Callable[[], bool] = lambda: True,
    ) -> None:
        self._manager = manager
        self._config = config
        self._address_of = address_of
        self._registered = registered
        self._fetchers: dict[int, ReplicaFetcher] = {}

    def assign(self, followed: dict[int, dict[TopicPartitionKey, int]]) -> None:
        """Follow exactly these partitions: leader id -> {partition: epoch}."""
        for leader_id, partitions in followed.items():
            fetcher = self._fetchers.get(leader_id)
            if fetcher is None:
                fetcher = ReplicaFetcher(
                    leader_id, self._manager, self._config, self._address_of, self._registered
                )
                self._fetchers[leader_id] = fetcher
                fetcher.start()
            fetcher.set_partitions(partitions)
        for leader_id, fetcher in self._fetchers.items():
            if leader_id not in followed:
                fetcher.set_partitions({})

    async def close(self) -> None:
        for fetcher in self._fetchers.values():
            await fetcher.close()
        self._fetchers.clear()
