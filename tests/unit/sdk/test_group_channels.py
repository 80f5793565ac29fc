"""`is_unavailable` (tidelog.group._channels): which failed coordinator calls
the group clients retry on another replica."""

from __future__ import annotations

import grpc
import pytest
from tidelog.group._channels import is_unavailable


def error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="x")


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        # The coordinator cancelled it (shutting down); grpc.aio raises
        # asyncio.CancelledError, not this, for a call cancelled here.
        grpc.StatusCode.CANCELLED,
    ],
)
def test_a_coordinator_that_did_not_answer_is_moved_on_from(code: grpc.StatusCode) -> None:
    assert is_unavailable(error(code))


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
    ],
)
def test_an_answer_of_the_coordinator_is_not_retried(code: grpc.StatusCode) -> None:
    assert not is_unavailable(error(code))
