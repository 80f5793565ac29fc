"""Calls from the coordinator to brokers, for the admin answers that only
brokers can give: deleting records (each partition's leader moves its log
start offset), the progress of reassignments (log end offsets and sizes
of the leader and of each adding replica), and the log figures of a
DescribeTopics a client asked the coordinator directly
(tidelog_server.leader_figures, as a broker and the gateway complete it).

Each call carries the `tidelog-local` metadata key, so that the broker
answers from its own logs instead of forwarding the call back here. Channels
come from one pool per coordinator, closed when it stops. Brokers' addresses
are read from etcd at each call (a broker that restarted elsewhere is found).

Safe for concurrent use on one event loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aetcd
import grpc
import grpc.aio
from tidelog.errors import NotLeaderOrFollowerError, error_from_rpc
from tidelog.security import PLAINTEXT, ChannelSecurity
from tidelog.types import TopicPartition
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import BrokerRegistration, PartitionState
from tidelog_server.forwarding import LOCAL_METADATA, ChannelPool
from tidelog_server.leader_figures import ask_over_grpc, complete_from_leaders

#: Deadline of one call to a broker.
BROKER_CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class LocalLog:
    """What a broker reports of its own replica of a partition."""

    log_start_offset: int
    log_end_offset: int
    size_bytes: int
    #: The broker's STORAGE_ERROR while this replica's log is offline (the
    #: figures are then -1, unknown); None while it serves.
    offline: common_pb2.Error | None = None


class BrokerCalls:
    """The coordinator's calls to brokers (module doc)."""

    def __init__(
        self, client: aetcd.Client, keys: Keys, security: ChannelSecurity = PLAINTEXT
    ) -> None:
        self.client = client
        self.keys = keys
        # The coordinator's own TLS identity when the cluster runs TLS
        # (tidelog_server.tls.channel_security_of): brokers serve only TLS then.
        self.pool = ChannelPool(security)

    async def close(self) -> None:
        await self.pool.close()

    async def _addresses(self) -> dict[int, str]:
        out = {}
        for kv in await self.client.get_prefix(self.keys.brokers):
            registration = BrokerRegistration.decode(kv.value)
            if registration.host and registration.port:
                out[registration.broker_id] = registration.address
        return out

    def _stub(self, address: str) -> Any:
        return admin_pb2_grpc.AdminStub(self.pool.channel(address))

    async def delete_records(
        self, partitions: Sequence[admin_pb2.DeleteRecordsPartition]
    ) -> list[admin_pb2.DeleteRecordsResult]:
        """Ask each partition's leader to delete records below its offset;
        one result per partition, in order (NOT_LEADER_OR_FOLLOWER when the
        partition has no live leader: retriable)."""
        addresses = await self._addresses()
        by_leader: dict[int, list[int]] = {}
        results: list[admin_pb2.DeleteRecordsResult] = []
        # One etcd range read per topic, not one read per partition: a request
        # may name MAX_PARTITIONS_PER_REQUEST partitions.
        states: dict[str, dict[int, PartitionState]] = {}
        for topic in {p.topic for p in partitions}:
            states[topic] = {}
            for kv in await self.client.get_prefix(self.keys.partition_states(topic)):
                tp = self.keys.parse_partition_state_key(kv.key)
                if tp is not None and tp.topic == topic:
                    states[topic][tp.partition] = PartitionState.decode(kv.value)
        for i, part in enumerate(partitions):
            results.append(
                admin_pb2.DeleteRecordsResult(topic=part.topic, partition=part.partition)
            )
            state = states[part.topic].get(part.partition)
            if state is None:
                _set_error(
                    results[i],
                    common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                    f"partition {part.topic}-{part.partition} does not exist",
                )
                continue
            leader = state.leader
            if leader not in addresses:
                _set_error(
                    results[i],
                    common_pb2.NOT_LEADER_OR_FOLLOWER,
                    f"{part.topic}-{part.partition} has no live leader (leader {leader}): retry",
                )
                continue
            by_leader.setdefault(leader, []).append(i)
        for leader, indexes in by_leader.items():
            request = admin_pb2.DeleteRecordsRequest(partitions=[partitions[i] for i in indexes])
            try:
                answer = await self._stub(addresses[leader]).DeleteRecords(
                    request,
                    timeout=BROKER_CALL_TIMEOUT_S,
                    metadata=LOCAL_METADATA,
                )
            except grpc.aio.AioRpcError as exc:
                # Retriable whatever the status; error_from_rpc words a call
                # the broker cancelled (too many calls waiting for it, or
                # stopping), whose details say only "CANCELLED".
                reason = error_from_rpc(exc).message
                error = NotLeaderOrFollowerError(
                    f"leader {leader} at {addresses[leader]} did not answer: {reason}"
                )
                for i in indexes:
                    _set_error(results[i], common_pb2.NOT_LEADER_OR_FOLLOWER, error.message)
                continue
            fill_from_leader(results, indexes, answer, leader)
        return results

    async def complete_figures(
        self, response: admin_pb2.DescribeTopicsResponse, timeout_s: float
    ) -> None:
        """Fill each partition of `response` with its leader's log figures,
        each leader asked once within `timeout_s`; a partition whose leader
        cannot tell gets -1 and an error saying why
        (tidelog_server.leader_figures)."""
        addresses = await self._addresses()
        await complete_from_leaders(response, addresses.get, ask_over_grpc(self._stub, timeout_s))

    async def local_logs(
        self, brokers: Iterable[int], topics: Iterable[str]
    ) -> dict[tuple[int, TopicPartition], LocalLog]:
        """Each broker's own replicas of `topics`: (broker, partition) ->
        LocalLog. A broker that does not answer is left out."""
        addresses = await self._addresses()
        names = sorted(set(topics))
        out: dict[tuple[int, TopicPartition], LocalLog] = {}
        for broker in sorted(set(brokers)):
            address = addresses.get(broker)
            if address is None:
                continue
            try:
                answer = await self._stub(address).DescribeTopics(
                    admin_pb2.DescribeTopicsRequest(names=names),
                    timeout=BROKER_CALL_TIMEOUT_S,
                    metadata=LOCAL_METADATA,
                )
            except grpc.aio.AioRpcError:
                continue
            for topic in answer.topics:
                for p in topic.partitions:
                    out[(broker, TopicPartition(topic.name, p.partition))] = LocalLog(
                        p.log_start_offset,
                        p.log_end_offset,
                        p.size_bytes,
                        p.error if p.error.code != common_pb2.NONE else None,
                    )
        return out


def fill_from_leader(
    results: list[admin_pb2.DeleteRecordsResult],
    indexes: list[int],
    answer: admin_pb2.DeleteRecordsResponse,
    leader: int,
) -> None:
    """Copy a leader's DeleteRecords answer into `results` at `indexes`, the
    entries it was asked about, in order. An entry the answer does not carry
    (a shorter answer, or another partition in its place) gets a retriable
    NOT_LEADER_OR_FOLLOWER: taken as it was, it would read as a success."""
    answered = list(answer.partitions)
    for position, i in enumerate(indexes):
        result = results[i]
        got = answered[position] if position < len(answered) else None
        if got is not None and (got.topic, got.partition) == (result.topic, result.partition):
            result.CopyFrom(got)
            continue
        _set_error(
            result,
            common_pb2.NOT_LEADER_OR_FOLLOWER,
            f"leader {leader} answered without {result.topic}-{result.partition}: retry",
        )


def _set_error(result: admin_pb2.DeleteRecordsResult, code: int, message: str) -> None:
    result.error.code = code  # type: ignore[assignment]
    result.error.message = message
