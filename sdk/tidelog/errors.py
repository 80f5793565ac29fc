"""Typed errors shared by the SDK and the services.

One root, `TidelogError`, with narrow subclasses. Each class says whether a
retry can succeed (`retriable`), which wire `ErrorCode` it travels as
(`code_name`), and which gRPC status code a service answers with when the
error fails a whole call (`grpc_status`). This module holds the mapping
between the three; it is applied:

- on the server side by `tidelog_server.service_errors` (in-band
  `Error{code, message}` per item, or the call's status with the precise code
  in the `ERROR_CODE_METADATA_KEY` trailing metadata);
- on the client side by `error_from_code(code, message)` for per-item errors
  and `error_from_rpc(rpc_error)` for failed calls.

A call the server's side cancelled (`is_server_cancelled`) is not a closed
client: grpc.aio raises asyncio.CancelledError, never an AioRpcError, for a
call this process cancelled (its task cancelled, `call.cancel()`, its channel
closed), so an AioRpcError CANCELLED comes from the other side. gRPC drops a
call a grpc.aio server has not taken yet once more than
`grpc.server.max_pending_requests` (1,000; all past 3,000) wait for the
server's event loop, with details "CANCELLED" and nothing else. Such a call
decodes to a retriable error (`server_cancelled_error`: BrokerNotAvailableError,
or CoordinatorNotAvailableError for a coordinator) naming the address;
ClosedError is raised only by a client that is closed.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

import grpc


class TidelogError(Exception):
    """Root of every Tidelog error."""

    #: True when the same request may succeed if sent again (after a metadata
    #: refresh or a backoff).
    retriable: ClassVar[bool] = False
    #: Wire code (tidelog.v1.ErrorCode value name).
    code_name: ClassVar[str] = "UNKNOWN_SERVER_ERROR"
    #: gRPC status used when this error fails a whole call.
    grpc_status: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN

    #: The partition the error is about, when it is about one (a consumer's
    #: fetch or offset lookup sets them), so that code which handles it
    #: needs no parsing of the message; None otherwise.
    topic: str | None = None
    partition: int | None = None
    #: True when the error says the request was surely not carried out: it
    #: was never sent (no server or coordinator could be reached), or the
    #: server refused it before acting (no coordinator replica answered the
    #: broker that forwards it). A resend then cannot do it twice, so the
    #: admin client resends even a write (tidelog._admin_retry). A server
    #: says so in the `NOT_CARRIED_OUT_METADATA_KEY` trailer (`not_carried_out`).
    #: False says nothing: a write that failed so (DEADLINE_EXCEEDED, a
    #: dropped call) may have been carried out.
    not_carried_out: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.__class__.__name__

    def surely_not_carried_out(self) -> Self:
        """Mark the error `not_carried_out`; returns it."""
        self.not_carried_out = True
        return self

    def about(self, topic: str, partition: int) -> Self:
        """Say which partition the error is about; returns the error."""
        self.topic = topic
        self.partition = partition
        return self


class UnknownServerError(TidelogError):
    """The server failed in a way it did not expect."""

    code_name = "UNKNOWN_SERVER_ERROR"
    grpc_status = grpc.StatusCode.INTERNAL


class UnknownTopicOrPartitionError(TidelogError):
    """The topic or partition does not exist (it may be being created)."""

    retriable = True
    code_name = "UNKNOWN_TOPIC_OR_PARTITION"
    grpc_status = grpc.StatusCode.NOT_FOUND


class InvalidTopicError(TidelogError):
    """The topic name breaks the naming rule."""

    code_name = "INVALID_TOPIC"
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class OffsetOutOfRangeError(TidelogError):
    """The requested offset is outside the partition's valid range."""

    code_name = "OFFSET_OUT_OF_RANGE"
    grpc_status = grpc.StatusCode.OUT_OF_RANGE


class CorruptRecordError(TidelogError):
    """A record batch failed its CRC32C check."""

    code_name = "CORRUPT_MESSAGE"
    grpc_status = grpc.StatusCode.DATA_LOSS


class UndecodableBatchError(CorruptRecordError):
    """A consumer met a stored batch it cannot decode (damaged, forged before
    brokers checked bodies, or decompressing past the consumer's limit).

    Raised after the records before the batch were returned; the position
    stays at `offset` until the application seeks (to `next_offset` to skip
    the batch)."""

    def __init__(
        self,
        message: str,
        topic: str = "",
        partition: int = -1,
        offset: int = -1,
        next_offset: int = -1,
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        #: Base offset of the batch that cannot be decoded.
        self.offset = offset
        #: The offset after the batch: where a seek skips it.
        self.next_offset = next_offset


class MessageTooLargeError(TidelogError):
    """A record batch is larger than the topic allows (max.message.bytes)."""

    code_name = "MESSAGE_TOO_LARGE"
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class InvalidRecordError(TidelogError):
    """A record batch is truncated or malformed."""

    code_name = "INVALID_RECORD"
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class UnsupportedCodecError(TidelogError):
    """The compression codec is unknown."""

    code_name = "INVALID_REQUEST"
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class NotLeaderOrFollowerError(TidelogError):
    """The broker does not lead this partition; refresh metadata and retry.
    A refusal made before acting (`not_carried_out`)."""

    retriable = True
    not_carried_out = True
    code_name = "NOT_LEADER_OR_FOLLOWER"
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class TopicAlreadyExistsError(TidelogError):
    """A topic with that name already exists."""

    code_name = "TOPIC_ALREADY_EXISTS"
    grpc_status = grpc.StatusCode.ALREADY_EXISTS


class InvalidPartitionsError(TidelogError):
    """The partition count is not acceptable."""

    code_name = "INVALID_PARTITIONS"
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class InvalidReplicationFactorError(TidelogError):
    """The replication factor is not acceptable."""

    code_name = "INVALID_REPLICATION_FACTOR"
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class NotEnoughReplicasError(TidelogError):
    """acks=all: fewer in-sync replicas than min.insync.replicas; the batch
    was not written."""

    retriable = True
    code_name = "NOT_ENOUGH_REPLICAS"
    grpc_status = grpc.StatusCode.UNAVAILABLE


class NotEnoughReplicasAfterAppendError(TidelogError):
    """acks=all: the batch was written and the high watermark passed it, but
    the ISR had shrunk below min.insync.replicas by then, so it is not
    acknowledged (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND). Retriable: an
    idempotent producer's retry is answered with the original offsets, a
    non-idempotent one's may write the batch a second time (at least once).
    Not a NotEnoughReplicasError, which says that nothing was written."""

    retriable = True
    code_name = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
    grpc_status = grpc.StatusCode.UNAVAILABLE


class RequestTimedOutError(TidelogError):
    """The request did not complete in time."""

    retriable = True
    code_name = "REQUEST_TIMED_OUT"
    grpc_status = grpc.StatusCode.DEADLINE_EXCEEDED


class FencedLeaderEpochError(TidelogError):
    """The request carries an older leader epoch than the broker's."""

    retriable = True
    code_name = "FENCED_LEADER_EPOCH"
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class OutOfOrderSequenceError(TidelogError):
    """An idempotent producer's sequence skipped ahead."""

    code_name = "OUT_OF_ORDER_SEQUENCE_NUMBER"
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class DuplicateSequenceError(TidelogError):
    """The batch was already written."""

    code_name = "DUPLICATE_SEQUENCE_NUMBER"
    grpc_status = grpc.StatusCode.ALREADY_EXISTS


class InvalidProducerEpochError(TidelogError):
    """The producer was fenced by a newer instance with the same id."""

    code_name = "INVALID_PRODUCER_EPOCH"
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class InvalidConfigError(TidelogError):
    """A config key is unknown or its value is out of range."""

    code_name = "INVALID_CONFIG"
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class StorageError(TidelogError):
    """The broker could not read or write its disk."""

    retriable = True
    code_name = "STORAGE_ERROR"
    grpc_status = grpc.StatusCode.INTERNAL


class InvalidRequestError(TidelogError):
    """A request field is invalid."""

    code_name = "INVALID_REQUEST"
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class NamedLimitError(InvalidRequestError):
    """A refusal for a limit the server names to clients: `limit` is that
    number, and a server refusing with it also puts it, as digits, in the
    trailing metadata key `limit_metadata_key` (tidelog_server.service_errors),
    so that a client can act on it (tidelog._partition_limits). Decodes, on
    the client, to InvalidRequestError: the message and the key say the rest."""

    limit_metadata_key: ClassVar[str]

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class PartitionsPerRequestError(NamedLimitError):
    """A request names more partitions than the server takes in one (the
    gateway's --max-partitions-per-request), named in
    MAX_PARTITIONS_METADATA_KEY: the client splits the request and sends it
    again (the SDK does)."""

    limit_metadata_key = "tidelog-max-partitions-per-request"


class PartitionsPerFetchError(NamedLimitError):
    """A Fetch request would leave its stream reading more partitions at once
    than the server lets one stream read (the gateway's
    --max-partitions-per-fetch), named in MAX_PARTITIONS_PER_FETCH_METADATA_KEY:
    the client reads its partitions on several streams (the SDK does)."""

    limit_metadata_key = "tidelog-max-partitions-per-fetch"


class CommitFailedError(TidelogError):
    """An offset commit was refused because this consumer is no longer a
    member of the group's current generation: it was fenced (its session
    ended, or the group rebalanced without it). Retrying cannot succeed;
    poll() rejoins the group, and the partitions it then owns are committed
    from there. Kafka's CommitFailedException; the class raised is one of
    its subclasses, which names why (IllegalGenerationError,
    UnknownMemberIdError)."""


class IllegalGenerationError(CommitFailedError):
    """The consumer group generation is stale."""

    code_name = "ILLEGAL_GENERATION"
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class UnknownMemberIdError(CommitFailedError):
    """The member is not known to the group."""

    code_name = "UNKNOWN_MEMBER_ID"
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class RebalanceInProgressError(TidelogError):
    """The group is rebalancing."""

    retriable = True
    code_name = "REBALANCE_IN_PROGRESS"
    grpc_status = grpc.StatusCode.ABORTED


class CoordinatorNotAvailableError(TidelogError):
    """The coordinator cannot serve the request right now."""

    retriable = True
    code_name = "COORDINATOR_NOT_AVAILABLE"
    grpc_status = grpc.StatusCode.UNAVAILABLE


class InvalidTimestampError(TidelogError):
    """The timestamp is invalid for the topic."""

    code_name = "INVALID_TIMESTAMP"
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class GroupIdNotFoundError(TidelogError):
    """The consumer group is not known."""

    code_name = "GROUP_ID_NOT_FOUND"
    grpc_status = grpc.StatusCode.NOT_FOUND


class NonEmptyGroupError(TidelogError):
    """The consumer group still has live members."""

    code_name = "NON_EMPTY_GROUP"
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class ElectionNotNeededError(TidelogError):
    """The preferred replica already leads the partition."""

    code_name = "ELECTION_NOT_NEEDED"
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class PreferredLeaderNotAvailableError(TidelogError):
    """The preferred replica is not alive or not in the ISR (it may catch up)."""

    retriable = True
    code_name = "PREFERRED_LEADER_NOT_AVAILABLE"
    grpc_status = grpc.StatusCode.UNAVAILABLE


class NoReassignmentInProgressError(TidelogError):
    """A reassignment was to be cancelled, but the partition has none."""

    code_name = "NO_REASSIGNMENT_IN_PROGRESS"
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class AuthorizationFailedError(TidelogError):
    """The principal may not do this operation on this resource (ACLs). The
    message names the principal, the operation and the resource. Not
    retriable: an operator must grant it (`tidelog acls add`)."""

    code_name = "AUTHORIZATION_FAILED"
    grpc_status = grpc.StatusCode.PERMISSION_DENIED


class TopicAuthorizationFailedError(AuthorizationFailedError):
    """AuthorizationFailedError on a topic."""

    code_name = "TOPIC_AUTHORIZATION_FAILED"


class GroupAuthorizationFailedError(AuthorizationFailedError):
    """AuthorizationFailedError on a consumer group."""

    code_name = "GROUP_AUTHORIZATION_FAILED"


class ClusterAuthorizationFailedError(AuthorizationFailedError):
    """AuthorizationFailedError on the cluster."""

    code_name = "CLUSTER_AUTHORIZATION_FAILED"


class SaslAuthenticationError(TidelogError):
    """The client could not be authenticated: unknown user or wrong password,
    credentials over a connection without TLS, or no identity at all where
    the cluster refuses anonymous clients. Not retriable."""

    code_name = "SASL_AUTHENTICATION_FAILED"
    grpc_status = grpc.StatusCode.UNAUTHENTICATED


# Client-side errors: these never travel on the wire.


class TidelogTimeoutError(TidelogError):
    """A client-side wait (send, flush, poll of metadata) ran out of time."""

    retriable = True
    code_name = "REQUEST_TIMED_OUT"
    grpc_status = grpc.StatusCode.DEADLINE_EXCEEDED


class BrokerNotAvailableError(TidelogError):
    """No broker could be reached at the bootstrap or leader address."""

    retriable = True
    code_name = "UNKNOWN_SERVER_ERROR"
    grpc_status = grpc.StatusCode.UNAVAILABLE


class ClosedError(TidelogError):
    """The producer or consumer was closed."""

    code_name = "UNKNOWN_SERVER_ERROR"
    grpc_status = grpc.StatusCode.CANCELLED


class WakeupError(TidelogError):
    """`Consumer.wakeup()` interrupted a poll() (Kafka's WakeupException):
    the one waiting when it was called, or the next one. The consumer stays
    usable: the call that raised took no records, so positions are where
    they were, and a group member keeps its membership."""

    code_name = "UNKNOWN_SERVER_ERROR"
    grpc_status = grpc.StatusCode.CANCELLED


class IllegalStateError(TidelogError):
    """The client was used in a way its state does not allow (for example
    poll() before assign())."""

    code_name = "UNKNOWN_SERVER_ERROR"
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class NoOffsetForPartitionError(TidelogError):
    """A consumer has no position for a partition and auto_offset_reset="none"
    forbids choosing one."""

    code_name = "OFFSET_OUT_OF_RANGE"
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class GroupsNotSupportedError(TidelogError):
    """Consumer groups (group_id, subscribe, commit) need a cluster: the
    servers reached run standalone (a broker without --etcd). Use assign()
    and seek(), or start brokers in cluster mode with a coordinator."""

    code_name = "INVALID_REQUEST"
    grpc_status = grpc.StatusCode.UNIMPLEMENTED


# The one class each wire code decodes to (several classes may share a code;
# the first listed here wins when decoding).
_BY_CODE: dict[str, type[TidelogError]] = {}
for _cls in (
    UnknownServerError,
    UnknownTopicOrPartitionError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    CorruptRecordError,
    MessageTooLargeError,
    InvalidRecordError,
    NotLeaderOrFollowerError,
    TopicAlreadyExistsError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    NotEnoughReplicasError,
    NotEnoughReplicasAfterAppendError,
    RequestTimedOutError,
    FencedLeaderEpochError,
    OutOfOrderSequenceError,
    DuplicateSequenceError,
    InvalidProducerEpochError,
    InvalidConfigError,
    StorageError,
    InvalidRequestError,
    IllegalGenerationError,
    UnknownMemberIdError,
    RebalanceInProgressError,
    CoordinatorNotAvailableError,
    InvalidTimestampError,
    GroupIdNotFoundError,
    NonEmptyGroupError,
    ElectionNotNeededError,
    PreferredLeaderNotAvailableError,
    NoReassignmentInProgressError,
    AuthorizationFailedError,
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    SaslAuthenticationError,
):
    _BY_CODE.setdefault(_cls.code_name, _cls)

# gRPC status codes to the error a failed call raises when the server did not
# say more precisely (see error_from_rpc).
_BY_STATUS: dict[grpc.StatusCode, type[TidelogError]] = {
    grpc.StatusCode.UNAVAILABLE: BrokerNotAvailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: RequestTimedOutError,
    grpc.StatusCode.NOT_FOUND: UnknownTopicOrPartitionError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError,
    grpc.StatusCode.OUT_OF_RANGE: OffsetOutOfRangeError,
    grpc.StatusCode.DATA_LOSS: CorruptRecordError,
    grpc.StatusCode.ALREADY_EXISTS: TopicAlreadyExistsError,
    grpc.StatusCode.PERMISSION_DENIED: AuthorizationFailedError,
    grpc.StatusCode.UNAUTHENTICATED: SaslAuthenticationError,
}

# Metadata key in which a service names the precise ErrorCode of a failed call.
ERROR_CODE_METADATA_KEY = "tidelog-error-code"

#: Trailing metadata key (value "1") in which a service says that it refused
#: a failed call before acting on it (TidelogError.not_carried_out).
NOT_CARRIED_OUT_METADATA_KEY = "tidelog-not-carried-out"

#: What gRPC's core says of a call it could not send because no connection
#: to the server could be made (UNAVAILABLE): the call never left this
#: process. A call cut off after it was sent says otherwise ("Socket
#: closed", "Connection reset by peer", ...).
NEVER_CONNECTED_DETAILS = "failed to connect to all addresses"

#: Metadata key in which the gateway names its --max-partitions-per-request:
#: in the initial metadata of each Produce and Fetch stream it accepts, and in
#: the trailing metadata of a refusal for it (PartitionsPerRequestError).
#: tidelog._partition_limits reads it.
MAX_PARTITIONS_METADATA_KEY = PartitionsPerRequestError.limit_metadata_key

#: Metadata key in which the gateway names its --max-partitions-per-fetch
#: (how many partitions one Fetch stream may read at once): in the initial
#: metadata of each Fetch stream it accepts, and in the trailing metadata of
#: a refusal for it (PartitionsPerFetchError). The SDK spreads the partitions
#: it reads through that server over Fetch streams of at most that many
#: (tidelog._fetcher, tidelog._partition_limits).
MAX_PARTITIONS_PER_FETCH_METADATA_KEY = PartitionsPerFetchError.limit_metadata_key


def error_class_for_code(code_name: str) -> type[TidelogError]:
    """The exception class for a wire ErrorCode name."""
    return _BY_CODE.get(code_name, UnknownServerError)


def error_from_code(code: int | str, message: str) -> TidelogError:
    """Build the typed exception for a per-partition wire error."""
    if isinstance(code, int):
        from tidelog.v1 import common_pb2

        code = common_pb2.ErrorCode.Name(common_pb2.ErrorCode.ValueType(code))
    return error_class_for_code(code)(message)


def _named_error_code(exc: grpc.RpcError) -> str | None:
    """The ErrorCode name a Tidelog server put in the call's trailing metadata."""
    trailing: Any = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == ERROR_CODE_METADATA_KEY:
            return str(value)
    return None


def _says_not_carried_out(exc: grpc.RpcError) -> bool:
    """Whether a Tidelog server said it refused the call before acting."""
    trailing: Any = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return any(key == NOT_CARRIED_OUT_METADATA_KEY for key, _ in trailing or ())


def never_connected(exc: BaseException) -> bool:
    """Whether a call failed UNAVAILABLE because gRPC could make no
    connection to its server (`NEVER_CONNECTED_DETAILS`): it was never sent."""
    return (
        isinstance(exc, grpc.RpcError)
        and hasattr(exc, "code")
        and exc.code() == grpc.StatusCode.UNAVAILABLE
        and _named_error_code(exc) is None
        and NEVER_CONNECTED_DETAILS in (exc.details() or "")
    )


def names_error_code(exc: grpc.RpcError) -> bool:
    """Whether a Tidelog server named the failed call's ErrorCode (in the
    `ERROR_CODE_METADATA_KEY` trailer): its status is then an answer of the
    server's own, not one gRPC made up for a broken transport."""
    return _named_error_code(exc) is not None


def is_server_cancelled(exc: BaseException) -> bool:
    """Whether `exc` is a call the server's side cancelled (see the module
    doc): status CANCELLED without an error code a Tidelog server named."""
    return (
        isinstance(exc, grpc.RpcError)
        and hasattr(exc, "code")
        and exc.code() == grpc.StatusCode.CANCELLED
        and _named_error_code(exc) is None
    )


def is_unanswered(exc: BaseException) -> bool:
    """Whether a call failed without an answer of its server's own, so that
    another server may be asked: unreachable (UNAVAILABLE), too slow
    (DEADLINE_EXCEEDED), or cancelled on its side (`is_server_cancelled`)."""
    return (
        isinstance(exc, grpc.RpcError)
        and hasattr(exc, "code")
        and exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    ) or is_server_cancelled(exc)


#: grpc.aio's details for a call whose status a failed write replaced
#: (`is_status_lost`).
STATUS_LOST_DETAILS = "Internal error from Core"


def is_status_lost(exc: BaseException) -> bool:
    """Whether `exc` is grpc.aio's INTERNAL "Internal error from Core" in
    place of the status the server ended the call with.

    A server may end a streaming call while the client still writes (it
    aborts, returns, is stopping, or gRPC drops the call it has no room
    for). A write of the client's that reaches gRPC as the call ends fails,
    and grpc.aio then replaces the call's status, even one already
    received, with INTERNAL, details "Internal error from Core": the reader
    of the call sees that instead of the server's (grpc/grpc#36066, open in
    grpcio 1.85). The server's own status cannot be had back. No Tidelog
    server sends those details: it is the server ending the call, not an
    answer of its own."""
    return (
        isinstance(exc, grpc.RpcError)
        and hasattr(exc, "code")
        and exc.code() == grpc.StatusCode.INTERNAL
        and exc.details() == STATUS_LOST_DETAILS
    )


def dropped_while_written(upstream: str) -> str:
    """What happened to a call `upstream` (its role and address) ended as
    this process wrote to it, its status lost (`is_status_lost`)."""
    return (
        f"{upstream} dropped the call while a request was being written to it "
        f"(its status was lost: INTERNAL: {STATUS_LOST_DETAILS})"
    )


def dropped_the_call(upstream: str) -> str:
    """What happened to a call `upstream` (its role and address: "broker
    127.0.0.1:9092") cancelled on its side, in the words the SDK and the
    services both use."""
    return f"{upstream} dropped the call (CANCELLED: overloaded or stopping)"


def server_cancelled_error(
    address: str, unavailable: type[TidelogError] = BrokerNotAvailableError
) -> TidelogError:
    """The retriable error of a call the server at `address` cancelled:
    `unavailable` (BrokerNotAvailableError, or CoordinatorNotAvailableError
    for a coordinator), naming the server by that role:
    "broker 127.0.0.1:9092 dropped the call (CANCELLED: overloaded or
    stopping); retry"."""
    return unavailable(f"{dropped_the_call(_named(address, unavailable))}; retry")


def _named(address: str, unavailable: type[TidelogError]) -> str:
    """The server at `address` by its role: "broker 127.0.0.1:9092", or
    "coordinator ..." when `unavailable` is CoordinatorNotAvailableError."""
    role = "coordinator" if issubclass(unavailable, CoordinatorNotAvailableError) else "broker"
    return f"{role} {address}" if address else f"the {role}"


def error_from_rpc(
    exc: grpc.RpcError,
    *,
    address: str = "",
    unavailable: type[TidelogError] = BrokerNotAvailableError,
) -> TidelogError:
    """Turn a failed gRPC call into the typed exception the server meant. A
    call the server cancelled becomes `server_cancelled_error(address,
    unavailable)`, retriable: `unavailable` says what the server at
    `address` is (a broker unless told)."""
    status = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    code_name = _named_error_code(exc)
    if code_name is not None:
        error = error_class_for_code(code_name)(details)
        if _says_not_carried_out(exc):
            error.surely_not_carried_out()
        return error
    if status == grpc.StatusCode.CANCELLED:
        return server_cancelled_error(address, unavailable)
    if is_status_lost(exc):
        # The server ended the call (a broker stopping, say): retriable as a
        # drop, not the UnknownServerError an INTERNAL would be.
        return unavailable(f"{dropped_while_written(_named(address, unavailable))}; retry")
    cls = _BY_STATUS.get(status, UnknownServerError)
    error = cls(f"{status.name}: {details}" if cls is UnknownServerError else details)
    if never_connected(exc):
        error.surely_not_carried_out()
    return error
