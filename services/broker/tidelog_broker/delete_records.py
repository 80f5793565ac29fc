"""DeleteRecords on the broker that leads the partitions (or a standalone
broker): each partition's log start offset moves up to the offset asked for
(-1: the high watermark), never past the high watermark, so that only
committed records are deleted; whole segments below it go
(PartitionLog.delete_records_before). Followers learn the new start from
the leader's ReplicaFetch answers and move theirs too (replica_fetcher).

Each partition succeeds or fails alone, with its error in-band; one named
more than once fails in each of its entries and keeps its log start
(request_limits.repeated): two offsets for one partition have no order to
honour. Not thread-safe: runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio

from tidelog.errors import OffsetOutOfRangeError
from tidelog.request_limits import (
    check_partitions_per_request,
    repeated,
    repeated_partition_error,
)
from tidelog.v1 import admin_pb2

from tidelog_broker.error_mapping import error_proto
from tidelog_broker.partition_manager import PartitionManager

#: The offset that means "the high watermark" (Kafka's -1).
HIGH_WATERMARK = -1


async def delete_records(
    manager: PartitionManager, request: admin_pb2.DeleteRecordsRequest
) -> admin_pb2.DeleteRecordsResponse:
    """Delete records below each partition's offset, on this broker's logs
    (it must lead them in cluster mode). Raises InvalidRequestError for a
    request over MAX_PARTITIONS_PER_REQUEST."""
    check_partitions_per_request(len(request.partitions), "DeleteRecords")
    response = admin_pb2.DeleteRecordsResponse()
    doomed = []
    repeated_partitions = repeated((p.topic, p.partition) for p in request.partitions)
    for part in request.partitions:
        result = response.partitions.add(topic=part.topic, partition=part.partition)
        name = f"{part.topic}-{part.partition}"
        try:
            if (part.topic, part.partition) in repeated_partitions:
                raise repeated_partition_error(part.topic, part.partition, "DeleteRecords")
            manager.replicas.leader_replication(part.topic, part.partition, write=True)
            partition_log = manager.partition_log(part.topic, part.partition)
            high_watermark = manager.high_watermark(partition_log)
            offset = high_watermark if part.offset == HIGH_WATERMARK else part.offset
            if offset < 0 or offset > high_watermark:
                raise OffsetOutOfRangeError(
                    f"cannot delete records of {name} below offset {part.offset}: use -1 (the "
                    f"high watermark) or an offset from 0 to the high watermark {high_watermark}"
                )
            before = partition_log.log_start_offset
            doomed.extend(partition_log.delete_records_before(offset))
            result.low_watermark = partition_log.log_start_offset
            if partition_log.log_start_offset != before:
                # Positions below the new start read OFFSET_OUT_OF_RANGE now
                # (fetch sessions skip idle partitions until a wake).
                manager.logs.wake((part.topic, part.partition))
        except Exception as exc:
            result.error.CopyFrom(error_proto(exc, f"deleting records of {name}"))
    if doomed:
        await asyncio.to_thread(manager.logs.unlink_dropped, doomed)
    return response
