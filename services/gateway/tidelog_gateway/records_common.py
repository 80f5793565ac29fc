"""What both kinds of `Records.Consume` stream share (explicit partitions in
`records_servicer`, a consumer group's in `records_group`): the limits on
credit and response size, the request checks they imply, the loop that
applies a stream's requests, and the conversion of an SDK record to its
protobuf form."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import grpc.aio
from tidelog.errors import InvalidRequestError, TidelogError
from tidelog.types import ConsumerRecord
from tidelog.v1 import records_pb2

MAX_RECORDS_PER_RESPONSE = 10_000
MAX_CREDIT_RECORDS = 1_000_000
#: The fetch window of a stream's consumer: what an idle stream may hold.
CONSUME_WINDOW_BYTES = 1024 * 1024
#: How long a consume stream's fetch waits before checking for changes.
POLL_MS = 200


def check_credit(request: records_pb2.ConsumeRequest, credit: int) -> None:
    """The credit and response size a request asks for, against the limits
    (`credit`: what the stream has left)."""
    if request.credit_records < 0:
        raise InvalidRequestError(f"credit_records must be >= 0, got {request.credit_records}")
    if credit + request.credit_records > MAX_CREDIT_RECORDS:
        raise InvalidRequestError(
            f"credit_records would reach {credit + request.credit_records} "
            f"outstanding, over the limit of {MAX_CREDIT_RECORDS}"
        )
    if not 0 <= request.max_records <= MAX_RECORDS_PER_RESPONSE:
        raise InvalidRequestError(
            f"max_records must be 0 (the default) to {MAX_RECORDS_PER_RESPONSE}, "
            f"got {request.max_records}"
        )


async def apply_requests(
    requests: AsyncIterator[records_pb2.ConsumeRequest],
    apply: Callable[[records_pb2.ConsumeRequest], Awaitable[None]],
) -> TidelogError | None:
    """Apply a stream's requests in order until the client half-closes it or
    it breaks. Returns the error that refused a request (the stream then ends
    with it), or None."""
    try:
        async for request in requests:
            await apply(request)
    except TidelogError as exc:
        return exc
    except grpc.aio.AioRpcError:
        pass  # the client went away: the response side ends the stream
    return None


def consumed_record(record: ConsumerRecord, text: bool) -> records_pb2.ConsumedRecord:
    """`record` as sent to the client; with `text`, key and value as UTF-8
    text when they decode."""
    out = records_pb2.ConsumedRecord(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        timestamp_ms=record.timestamp,
        headers=[records_pb2.RecordHeader(key=k, value=v or b"") for k, v in record.headers or ()],
    )
    for name, data in (("key", record.key), ("value", record.value)):
        if data is None:
            continue
        if text:
            try:
                setattr(out, f"{name}_text", data.decode())
                continue
            except UnicodeDecodeError:
                pass
        setattr(out, name, data)
    return out
