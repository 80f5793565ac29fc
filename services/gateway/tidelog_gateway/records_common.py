"""What both kinds of `Records.Consume` stream share (explicit partitions in
`records_servicer`, a consumer group's in `records_group`): the limits on
credit and response size, the request checks they imply, the loop that
applies a stream's requests, the fetch window sized from the client's
credit (`CreditWindow`), the options of a stream's consumer, and the
conversion of an SDK record to its protobuf form."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import grpc.aio
from tidelog import AsyncConsumer, TopicPartition
from tidelog.errors import InvalidRequestError, TidelogError
from tidelog.types import ConsumerRecord
from tidelog.v1 import records_pb2
from tidelog_server.tls import ServerTls, client_options

from tidelog_gateway.cluster_view import ClusterView

MAX_RECORDS_PER_RESPONSE = 10_000
MAX_CREDIT_RECORDS = 1_000_000
#: The largest fetch window of a stream's consumer, per leader it reads from.
CONSUME_WINDOW_BYTES = 1024 * 1024
#: What a record is taken to weigh until the stream has sent some: small,
#: so that a stream's first window errs on the side of holding less.
RECORD_BYTES_GUESS = 128
#: How long a consume stream's fetch waits before checking for changes.
POLL_MS = 200


def consumer_options(connection: int, tls: ServerTls | None = None) -> dict[str, Any]:
    """Options of a stream's AsyncConsumer. Its window starts at 0 (the
    CreditWindow opens it once the client grants credit). `connection`
    picks one of the gateway's connections to each broker: gRPC would put
    every consumer of the process on one connection per broker, and a
    broker bounds the Fetch streams and unread bytes of one connection.
    With `tls`, it reaches the brokers as the gateway does, with its
    certificate."""
    return {
        "enable_auto_commit": False,
        "fetch_buffer_bytes": CONSUME_WINDOW_BYTES,
        "max_partition_fetch_bytes": CONSUME_WINDOW_BYTES // 4,
        "grpc_channel_options": [("tidelog.gateway.connection", connection)],
        **client_options(tls),
    }


class CreditWindow:
    """A stream's fetch window, sized from the client's record credit.

    The client grants records; brokers are granted bytes. The window of each
    fetch session of the stream's consumer (one per leader) is

        credit_records x bytes per record / leaders,  at most CONSUME_WINDOW_BYTES

    with bytes per record measured on the responses sent (a moving average;
    RECORD_BYTES_GUESS before the first), and 0 while the client has no
    credit. So the records fetched ahead of the client are about those it
    granted, plus one batch per leader (a broker sends a whole batch larger
    than the credit left), and a client that stops reading costs its credit
    and no more. A window that shrinks takes effect as fetched data is
    consumed (brokers keep credit already granted).
    """

    def __init__(self, consumer: AsyncConsumer, view: ClusterView) -> None:
        self._consumer = consumer
        self._view = view
        self._record_bytes = RECORD_BYTES_GUESS
        self._leaders = 1
        self._credit = 0
        self.window = 0
        consumer.set_fetch_window(0)

    def assigned(self, partitions: Iterable[TopicPartition]) -> None:
        """The stream now reads `partitions`: count their leaders."""
        leaders = set()
        for tp in partitions:
            try:
                leaders.add(self._view.leader_address(tp.topic, tp.partition))
            except TidelogError:
                continue
        self._leaders = max(1, len(leaders))
        self.update(self._credit)

    def sent(self, response: records_pb2.ConsumeResponse) -> None:
        """Learn the size of records from a response of records being sent."""
        if response.records:
            size = response.ByteSize() // len(response.records)
            self._record_bytes = max(1, (3 * self._record_bytes + size) // 4)

    def update(self, credit: int) -> None:
        """Size the window for the `credit` records the client has left."""
        self._credit = credit
        if credit <= 0:
            window = 0
        else:
            share = credit * self._record_bytes // self._leaders
            window = max(1, min(CONSUME_WINDOW_BYTES, share))
        if window != self.window:
            self.window = window
            self._consumer.set_fetch_window(window)


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


def add_records(
    response: records_pb2.ConsumeResponse,
    batches: Iterable[list[ConsumerRecord]],
    text: bool,
) -> None:
    """Append the SDK's records to `response` as ConsumedRecords; with
    `text`, keys and values as UTF-8 text when they decode.

    The hot path of every consume stream: each record is built in place by
    one `add()` (appending a built message would copy it), from the record
    tuple's items by index, headers only when there are some."""
    add = response.records.add
    header = records_pb2.RecordHeader
    for records in batches:
        for r in records:
            # ConsumerRecord: topic, partition, offset, timestamp,
            # timestamp_type, key, value, headers, leader_epoch.
            headers = [header(key=k, value=v or b"") for k, v in r[7]] if r[7] else None
            if text:
                out = add(
                    topic=r[0],
                    partition=r[1],
                    offset=r[2],
                    timestamp_ms=r[3],
                    headers=headers,
                )
                _set_text(out, "key", r[5])
                _set_text(out, "value", r[6])
            else:
                add(
                    topic=r[0],
                    partition=r[1],
                    offset=r[2],
                    timestamp_ms=r[3],
                    key=r[5],
                    value=r[6],
                    headers=headers,
                )


def _set_text(out: records_pb2.ConsumedRecord, name: str, data: bytes | None) -> None:
    if data is None:
        return
    try:
        setattr(out, f"{name}_text", data.decode())
    except UnicodeDecodeError:
        setattr(out, name, data)
