"""The AdminClient's operations on existing partitions: adding partitions,
deleting records, preferred-leader election, and replica reassignments.

Each function takes the client's one-call runner (`call(fn)`: the first
reachable address answers) and the request timeout, builds the request,
checks what the client can check before sending (limits, shapes), and turns
each partition's in-band error into a typed one. Results are per item, as
Kafka's admin clients give them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from tidelog.errors import (
    InvalidPartitionsError,
    InvalidRequestError,
    TidelogError,
    error_from_code,
)
from tidelog.request_limits import check_partitions_per_request
from tidelog.types import (
    NewPartitions,
    PartitionReassignment,
    ReplicaProgress,
    TopicPartition,
)
from tidelog.v1 import admin_pb2, common_pb2

T = TypeVar("T")
Call = Callable[[Callable[[Any], Awaitable[T]]], Awaitable[T]]


def _error(item: Any, what: str) -> TidelogError | None:
    """The typed error of one result item; its message names `what` (once:
    the servers' messages usually name the partition already)."""
    if not item.error.code:
        return None
    message = item.error.message
    return error_from_code(item.error.code, message if what in message else f"{what}: {message}")


def _first_error(results: Mapping[Any, TidelogError | None], raise_errors: bool) -> None:
    if raise_errors:
        for error in results.values():
            if error is not None:
                raise error


async def create_partitions(
    call: Call[Any],
    timeout_s: float,
    new_partitions: Mapping[str, NewPartitions | int],
    validate_only: bool,
    raise_errors: bool,
) -> dict[str, TidelogError | None]:
    """topic -> None (grown) or its typed error; see AdminClient."""
    topics = []
    for name, spec in new_partitions.items():
        if isinstance(spec, int):
            spec = NewPartitions(spec)
        if spec.total_count < 1:
            raise InvalidPartitionsError(f"{name}: total_count={spec.total_count}: use at least 1")
        topic = admin_pb2.NewPartitions(name=name, total_count=spec.total_count)
        if spec.new_assignments is not None:
            first_new = spec.total_count - len(spec.new_assignments)
            for i, brokers in enumerate(spec.new_assignments):
                topic.assignment.add(partition=first_new + i, broker_ids=list(brokers))
        topics.append(topic)
    request = admin_pb2.CreatePartitionsRequest(topics=topics, validate_only=validate_only)
    response = await call(lambda s: s.CreatePartitions(request, timeout=timeout_s))
    out = {t.name: _error(t, t.name) for t in response.topics}
    _first_error(out, raise_errors)
    return out


async def delete_records(
    call: Call[Any],
    timeout_s: float,
    records_to_delete: Mapping[TopicPartition, int],
    raise_errors: bool,
) -> dict[TopicPartition, int | TidelogError]:
    """partition -> its new log start offset (low watermark) or its typed
    error; see AdminClient."""
    check_partitions_per_request(len(records_to_delete), "DeleteRecords")
    parts = []
    for tp, offset in records_to_delete.items():
        if offset < -1:
            raise InvalidRequestError(
                f"{tp.topic}-{tp.partition}: offset {offset}: use -1 (the high watermark) or "
                "an offset >= 0"
            )
        parts.append(
            admin_pb2.DeleteRecordsPartition(topic=tp.topic, partition=tp.partition, offset=offset)
        )
    request = admin_pb2.DeleteRecordsRequest(partitions=parts)
    response = await call(lambda s: s.DeleteRecords(request, timeout=timeout_s))
    out: dict[TopicPartition, int | TidelogError] = {}
    for item in response.partitions:
        tp = TopicPartition(item.topic, item.partition)
        error = _error(item, f"{item.topic}-{item.partition}")
        out[tp] = error if error is not None else item.low_watermark
    if raise_errors:
        for value in out.values():
            if isinstance(value, TidelogError):
                raise value
    return out


async def elect_leaders(
    call: Call[Any], timeout_s: float, partitions: Iterable[TopicPartition] | None
) -> dict[TopicPartition, TidelogError | None]:
    """partition -> None (its preferred replica now leads) or why not
    (ElectionNotNeededError, PreferredLeaderNotAvailableError, ...)."""
    wanted = list(partitions or ())
    check_partitions_per_request(len(wanted), "ElectLeaders")
    request = admin_pb2.ElectLeadersRequest(
        partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in wanted]
    )
    response = await call(lambda s: s.ElectLeaders(request, timeout=timeout_s))
    return {
        TopicPartition(r.topic, r.partition): _error(r, f"{r.topic}-{r.partition}")
        for r in response.partitions
    }


async def alter_partition_reassignments(
    call: Call[Any],
    timeout_s: float,
    reassignments: Mapping[TopicPartition, Sequence[int] | None],
    throttle_bytes_per_s: int,
    raise_errors: bool,
) -> dict[TopicPartition, TidelogError | None]:
    """partition -> None (started, changed or cancelled) or its typed error."""
    check_partitions_per_request(len(reassignments), "AlterPartitionReassignments")
    if throttle_bytes_per_s < 0:
        raise InvalidRequestError(
            f"throttle_bytes_per_s={throttle_bytes_per_s}: use 0 (no limit) or more"
        )
    request = admin_pb2.AlterPartitionReassignmentsRequest(
        partitions=[
            admin_pb2.PartitionReassignment(
                topic=tp.topic, partition=tp.partition, replicas=list(target or ())
            )
            for tp, target in reassignments.items()
        ],
        throttle_bytes_per_s=throttle_bytes_per_s,
    )
    response = await call(lambda s: s.AlterPartitionReassignments(request, timeout=timeout_s))
    out = {
        TopicPartition(r.topic, r.partition): _error(r, f"{r.topic}-{r.partition}")
        for r in response.partitions
    }
    _first_error(out, raise_errors)
    return out


async def list_partition_reassignments(
    call: Call[Any], timeout_s: float, partitions: Iterable[TopicPartition] | None
) -> dict[TopicPartition, PartitionReassignment]:
    """The reassignments in progress (of `partitions`; all when None)."""
    wanted = list(partitions or ())
    check_partitions_per_request(len(wanted), "ListPartitionReassignments")
    request = admin_pb2.ListPartitionReassignmentsRequest(
        partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in wanted]
    )
    response = await call(lambda s: s.ListPartitionReassignments(request, timeout=timeout_s))
    return {
        TopicPartition(r.topic, r.partition): PartitionReassignment(
            replicas=list(r.replicas),
            adding_replicas=list(r.adding_replicas),
            removing_replicas=list(r.removing_replicas),
            original_replicas=list(r.original_replicas),
            throttle_bytes_per_s=r.throttle_bytes_per_s,
            started_ms=r.started_ms,
            leader=r.leader_id,
            isr=list(r.isr),
            leader_log_end_offset=r.leader_log_end_offset,
            progress={
                p.broker_id: ReplicaProgress(
                    broker_id=p.broker_id,
                    reachable=p.reachable,
                    log_end_offset=p.log_end_offset,
                    size_bytes=p.size_bytes,
                    lag_records=p.lag_records,
                    lag_bytes=p.lag_bytes,
                    in_sync=p.in_sync,
                    error=error_from_code(p.error.code, p.error.message) if p.error.code else None,
                )
                for p in r.progress
            },
        )
        for r in response.reassignments
    }
