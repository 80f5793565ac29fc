"""Wire error codes and gRPC statuses map to the typed errors clients raise."""

from __future__ import annotations

import grpc
import pytest
from tidelog import errors
from tidelog.v1 import common_pb2

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("code", "cls", "retriable"),
    [
        (common_pb2.NOT_LEADER_OR_FOLLOWER, errors.NotLeaderOrFollowerError, True),
        (common_pb2.UNKNOWN_TOPIC_OR_PARTITION, errors.UnknownTopicOrPartitionError, True),
        (common_pb2.REQUEST_TIMED_OUT, errors.RequestTimedOutError, True),
        (common_pb2.NOT_ENOUGH_REPLICAS, errors.NotEnoughReplicasError, True),
        (
            common_pb2.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            errors.NotEnoughReplicasAfterAppendError,
            True,
        ),
        (common_pb2.OFFSET_OUT_OF_RANGE, errors.OffsetOutOfRangeError, False),
        (common_pb2.MESSAGE_TOO_LARGE, errors.MessageTooLargeError, False),
        (common_pb2.TOPIC_ALREADY_EXISTS, errors.TopicAlreadyExistsError, False),
        (common_pb2.INVALID_TOPIC, errors.InvalidTopicError, False),
        (common_pb2.CORRUPT_MESSAGE, errors.CorruptRecordError, False),
    ],
)
def test_error_from_code(code: int, cls: type[errors.TidelogError], retriable: bool) -> None:
    exc = errors.error_from_code(code, "details")
    assert type(exc) is cls
    assert exc.retriable is retriable
    assert exc.message == "details"
    assert isinstance(exc, errors.TidelogError)


def test_every_wire_code_has_a_class() -> None:
    for name, value in common_pb2.ErrorCode.items():
        if value == 0:
            continue
        exc = errors.error_from_code(value, "x")
        assert exc.code_name == name, name


class _FakeRpcError(grpc.RpcError):
    def __init__(self, status: grpc.StatusCode, details: str, trailing=()) -> None:  # type: ignore[no-untyped-def]
        self._status, self._details, self._trailing = status, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._status

    def details(self) -> str:
        return self._details

    def trailing_metadata(self):  # type: ignore[no-untyped-def]
        return self._trailing


def test_error_from_rpc_prefers_the_precise_code_in_trailing_metadata() -> None:
    rpc = _FakeRpcError(
        grpc.StatusCode.INVALID_ARGUMENT,
        "bad name",
        ((errors.ERROR_CODE_METADATA_KEY, "INVALID_TOPIC"),),
    )
    assert type(errors.error_from_rpc(rpc)) is errors.InvalidTopicError


def test_a_stopping_gateway_names_its_code_under_unavailable() -> None:
    # How a draining gateway ends its Produce and Fetch streams: the SDK's
    # sender and fetcher take the named code over the bare status.
    rpc = _FakeRpcError(
        grpc.StatusCode.UNAVAILABLE,
        "the gateway is shutting down: fetch again from your positions",
        ((errors.ERROR_CODE_METADATA_KEY, "NOT_LEADER_OR_FOLLOWER"),),
    )
    assert errors.names_error_code(rpc)
    assert not errors.names_error_code(_FakeRpcError(grpc.StatusCode.UNAVAILABLE, "gone"))
    exc = errors.error_from_rpc(rpc)
    assert type(exc) is errors.NotLeaderOrFollowerError and exc.retriable


def test_error_from_rpc_falls_back_to_the_status() -> None:
    exc = errors.error_from_rpc(_FakeRpcError(grpc.StatusCode.UNAVAILABLE, "down"))
    assert isinstance(exc, errors.BrokerNotAvailableError) and exc.retriable


def test_client_side_errors() -> None:
    assert issubclass(errors.GroupsNotSupportedError, errors.TidelogError)
    assert issubclass(errors.NoOffsetForPartitionError, errors.TidelogError)


def test_an_error_says_which_partition_it_is_about() -> None:
    error = errors.error_from_code(common_pb2.OFFSET_OUT_OF_RANGE, "offset 9 is out of range")
    assert (error.topic, error.partition) == (None, None)
    assert error.about("orders", 3) is error
    assert (error.topic, error.partition) == ("orders", 3)


def test_a_call_the_server_cancelled_is_retriable_and_names_the_server() -> None:
    """gRPC drops a call a grpc.aio server has no room to queue with
    CANCELLED and details "CANCELLED": not a closed client (ClosedError, as
    this decoded before), a server to ask again."""
    rpc = _FakeRpcError(grpc.StatusCode.CANCELLED, "CANCELLED")
    assert errors.is_server_cancelled(rpc)
    exc = errors.error_from_rpc(rpc, address="127.0.0.1:9092")
    assert type(exc) is errors.BrokerNotAvailableError and exc.retriable
    # Worded as the services word a call dropped upstream
    # (tidelog_server.forwarding.unanswered).
    assert exc.message == (
        "broker 127.0.0.1:9092 dropped the call (CANCELLED: overloaded or stopping); retry"
    )
    coordinator = errors.error_from_rpc(
        rpc, address="127.0.0.1:9290", unavailable=errors.CoordinatorNotAvailableError
    )
    assert type(coordinator) is errors.CoordinatorNotAvailableError
    assert coordinator.message == (
        "coordinator 127.0.0.1:9290 dropped the call (CANCELLED: overloaded or stopping); retry"
    )
    unnamed = errors.error_from_rpc(rpc)
    assert unnamed.message == (
        "the broker dropped the call (CANCELLED: overloaded or stopping); retry"
    )
    # A code the server named wins over the status, as for every status.
    named = _FakeRpcError(
        grpc.StatusCode.CANCELLED, "x", ((errors.ERROR_CODE_METADATA_KEY, "INVALID_REQUEST"),)
    )
    assert not errors.is_server_cancelled(named)
    assert type(errors.error_from_rpc(named)) is errors.InvalidRequestError


def test_a_call_without_an_answer_of_its_servers_own_may_go_to_another() -> None:
    """The one rule the metadata refresh and the group clients fail over by."""
    for status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        assert errors.is_unanswered(_FakeRpcError(status, "x"))
    assert errors.is_unanswered(_FakeRpcError(grpc.StatusCode.CANCELLED, "CANCELLED"))
    named = _FakeRpcError(
        grpc.StatusCode.CANCELLED, "x", ((errors.ERROR_CODE_METADATA_KEY, "INVALID_REQUEST"),)
    )
    assert not errors.is_unanswered(named)
    assert not errors.is_unanswered(_FakeRpcError(grpc.StatusCode.PERMISSION_DENIED, "no"))
    assert not errors.is_unanswered(ValueError("not a call"))


def test_a_call_whose_status_grpc_lost_is_retriable_and_names_the_server() -> None:
    """A server that ends a stream while the client writes to it (a broker
    stopping) reaches grpc.aio's reader as INTERNAL "Internal error from
    Core" (grpc/grpc#36066): a server to ask again, not the
    UnknownServerError an INTERNAL of the server's own is."""
    rpc = _FakeRpcError(grpc.StatusCode.INTERNAL, "Internal error from Core")
    assert errors.is_status_lost(rpc)
    exc = errors.error_from_rpc(rpc, address="127.0.0.1:9092")
    assert type(exc) is errors.BrokerNotAvailableError and exc.retriable
    assert exc.message == (
        "broker 127.0.0.1:9092 dropped the call while a request was being written to it "
        "(its status was lost: INTERNAL: Internal error from Core); retry"
    )
    coordinator = errors.error_from_rpc(
        rpc, address="127.0.0.1:9290", unavailable=errors.CoordinatorNotAvailableError
    )
    assert type(coordinator) is errors.CoordinatorNotAvailableError
    # Any other INTERNAL is the server's own failure.
    other = _FakeRpcError(grpc.StatusCode.INTERNAL, "boom")
    assert not errors.is_status_lost(other)
    assert type(errors.error_from_rpc(other)) is errors.UnknownServerError
    # A code the server named wins, as for every status.
    named = _FakeRpcError(
        grpc.StatusCode.INTERNAL,
        "Internal error from Core",
        ((errors.ERROR_CODE_METADATA_KEY, "CORRUPT_MESSAGE"),),
    )
    assert type(errors.error_from_rpc(named)) is errors.CorruptRecordError
