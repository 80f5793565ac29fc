"""The answer to one ListOffsets request, at a bounded cost per request.

A timestamp lookup reads, checks and searches a batch of the partition, on
the event loop (its timestamp column only, no record built: ~1.5 ms for a
1 MiB batch of 10-byte records, `python -m bench.timestamp_lookup`; a full
decode took ~10 ms). Answered entry by entry, one partition named thousands
of times with a timestamp kept the broker busy for seconds and every other
client waiting.
So, within one request:
- each distinct (topic, partition, timestamp_ms) is looked up once, and an
  entry repeating it gets the same answer (one answer per entry, in request
  order, as always);
- at most MAX_TIMESTAMPS_PER_PARTITION distinct timestamps are looked up in
  one partition; the entries past it are answered INVALID_REQUEST naming the
  limit. Latest (-1) and earliest (-2) cost no decode and are always
  answered: asking one partition for both in one request is common;
- the event loop is given back after each timestamp lookup, so that other
  calls are served between them.
The number of entries is checked by the servicer (MAX_LIST_OFFSETS_ENTRIES).
"""

from __future__ import annotations

import asyncio

from tidelog.request_limits import MAX_TIMESTAMPS_PER_PARTITION, too_many_timestamps_error
from tidelog.v1 import log_pb2

from tidelog_broker.error_mapping import error_proto
from tidelog_broker.partition_manager import PartitionManager


async def answer_list_offsets(
    manager: PartitionManager, request: log_pb2.ListOffsetsRequest
) -> log_pb2.ListOffsetsResponse:
    """One result per entry of `request`, in its order."""
    response = log_pb2.ListOffsetsResponse()
    answered: dict[tuple[str, int, int], log_pb2.ListOffsetsResult] = {}
    looked_up: dict[tuple[str, int], int] = {}
    for part in request.partitions:
        key = (part.topic, part.partition, part.timestamp_ms)
        result = answered.get(key)
        if result is None:
            result = log_pb2.ListOffsetsResult(topic=part.topic, partition=part.partition)
            if part.timestamp_ms >= 0:
                lookups = looked_up.get(key[:2], 0)
                if lookups >= MAX_TIMESTAMPS_PER_PARTITION:
                    _fail(result, too_many_timestamps_error(part.topic, part.partition))
                else:
                    looked_up[key[:2]] = lookups + 1
                    _look_up(manager, part, result)
                    await asyncio.sleep(0)
            else:
                _look_up(manager, part, result)
            answered[key] = result
        response.partitions.append(result)
    return response


def _look_up(
    manager: PartitionManager,
    part: log_pb2.ListOffsetsPartition,
    result: log_pb2.ListOffsetsResult,
) -> None:
    try:
        result.offset, result.timestamp_ms = manager.list_offset(
            part.topic, part.partition, part.timestamp_ms
        )
    except Exception as exc:
        _fail(result, exc)


def _fail(result: log_pb2.ListOffsetsResult, exc: Exception) -> None:
    result.error.CopyFrom(error_proto(exc, f"listing offsets of {result.topic}-{result.partition}"))
    result.offset = -1
    result.timestamp_ms = -1
