"""The one place where the coordinator turns exceptions into wire errors.

Same two shapes as the broker (services never import each other, so this is
a sibling of the broker's module, not a shared one):
- in-band `tidelog.v1.Error{code, message}` for one item of a response;
- whole-call errors end the call with the error's gRPC status and the precise
  ErrorCode in the trailing metadata key `tidelog-error-code`.

etcd being unreachable is COORDINATOR_NOT_AVAILABLE (retriable). An exception
that is neither typed nor an etcd outage is a bug: logged with its traceback,
reported as UNKNOWN_SERVER_ERROR, and the coordinator carries on.
"""

from __future__ import annotations

import logging
from typing import NoReturn

import grpc
from tidelog._etcd import is_unavailable
from tidelog.errors import (
    ERROR_CODE_METADATA_KEY,
    CoordinatorNotAvailableError,
    TidelogError,
    UnknownServerError,
)
from tidelog.v1 import common_pb2

log = logging.getLogger("tidelog.coordinator")


def as_tidelog_error(exc: BaseException, what: str) -> TidelogError:
    """`exc` itself when typed; an etcd outage as retriable; otherwise log and wrap."""
    if isinstance(exc, TidelogError):
        return exc
    if is_unavailable(exc):
        return CoordinatorNotAvailableError(f"etcd is not reachable while {what}: retry")
    log.exception("unexpected error while %s", what)
    return UnknownServerError(f"unexpected error while {what}: {type(exc).__name__}: {exc}")


def error_proto(exc: BaseException, what: str) -> common_pb2.Error:
    """The in-band Error for an exception raised while doing `what`."""
    error = as_tidelog_error(exc, what)
    return common_pb2.Error(code=common_pb2.ErrorCode.Value(error.code_name), message=error.message)


async def abort(context: grpc.aio.ServicerContext, exc: BaseException, what: str) -> NoReturn:
    """End the call with the gRPC status of `exc`."""
    error = as_tidelog_error(exc, what)
    await context.abort(
        error.grpc_status,
        error.message,
        trailing_metadata=((ERROR_CODE_METADATA_KEY, error.code_name),),
    )
    raise AssertionError("context.abort returns only by raising")  # pragma: no cover
