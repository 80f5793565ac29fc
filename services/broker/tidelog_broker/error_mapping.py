"""The one place where the broker turns exceptions into wire errors.

Two shapes, one mapping (`tidelog.errors`):
- per-item errors (one partition of a produce or fetch, one topic of an admin
  call) travel in-band as `tidelog.v1.Error{code, message}`, because one
  request spans many partitions and one bad partition must not fail the rest;
- whole-call errors (a malformed request) end the call with the error's gRPC
  status, its message, and the precise ErrorCode in the trailing metadata key
  `tidelog-error-code`, which the SDK turns back into the same exception.

An exception that is not a TidelogError is a bug: it is logged with its
traceback and reported as UNKNOWN_SERVER_ERROR, and the broker carries on.
"""

from __future__ import annotations

import logging
from typing import NoReturn

import grpc
from tidelog.errors import ERROR_CODE_METADATA_KEY, TidelogError, UnknownServerError
from tidelog.v1 import common_pb2

log = logging.getLogger("tidelog.broker")


def as_tidelog_error(exc: BaseException, what: str) -> TidelogError:
    """`exc` itself when typed; otherwise log it and wrap it."""
    if isinstance(exc, TidelogError):
        return exc
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
