"""Exceptions to wire errors, for the services (internal; clients never use it).

The mapping itself (error class -> ErrorCode -> gRPC status) lives in
`tidelog.errors`; this module is the one place that applies it on the server
side, in two shapes:
- per-item errors (one partition of a produce or fetch, one topic or group
  of an admin call) travel in-band as `tidelog.v1.Error{code, message}`,
  because one request spans many items and one bad item must not fail the
  rest;
- whole-call errors (a malformed request) end the call with the error's gRPC
  status, its message, and the precise ErrorCode in the trailing metadata key
  `tidelog-error-code`, which the SDK turns back into the same exception (a
  NamedLimitError also names its limit, in its `limit_metadata_key`:
  `tidelog-max-partitions-per-request`, `tidelog-max-partitions-per-fetch`;
  an error refused before acting, `not_carried_out`, adds
  `tidelog-not-carried-out`).

An exception that is not a TidelogError (and that the service's `translate`
hook does not recognise) is a bug: it is logged with its traceback, reported
as UNKNOWN_SERVER_ERROR, and the service carries on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn

import grpc
from tidelog.errors import (
    ERROR_CODE_METADATA_KEY,
    NOT_CARRIED_OUT_METADATA_KEY,
    NamedLimitError,
    TidelogError,
    UnknownServerError,
)
from tidelog.v1 import common_pb2

#: A service's own translation of foreign exceptions (e.g. an etcd outage),
#: or None when it does not recognise the exception.
Translate = Callable[[BaseException, str], TidelogError | None]


class ErrorMapper:
    """Turns exceptions raised while doing something into wire errors.
    Stateless apart from its logger and hook; thread-safe."""

    def __init__(self, logger: logging.Logger, translate: Translate | None = None) -> None:
        self._log = logger
        self._translate = translate

    def as_tidelog_error(self, exc: BaseException, what: str) -> TidelogError:
        """`exc` itself when typed, the service's translation, or a logged wrap."""
        if isinstance(exc, TidelogError):
            return exc
        if self._translate is not None:
            translated = self._translate(exc, what)
            if translated is not None:
                return translated
        self._log.exception("unexpected error while %s", what)
        return UnknownServerError(f"unexpected error while {what}: {type(exc).__name__}: {exc}")

    def error_proto(self, exc: BaseException, what: str) -> common_pb2.Error:
        """The in-band Error for an exception raised while doing `what`."""
        error = self.as_tidelog_error(exc, what)
        return common_pb2.Error(
            code=common_pb2.ErrorCode.Value(error.code_name), message=error.message
        )

    async def abort(
        self, context: grpc.aio.ServicerContext, exc: BaseException, what: str
    ) -> NoReturn:
        """End the call with the gRPC status of `exc`."""
        error = self.as_tidelog_error(exc, what)
        trailing: tuple[tuple[str, str], ...] = ((ERROR_CODE_METADATA_KEY, error.code_name),)
        if isinstance(error, NamedLimitError):
            # The limit, for a client to act on (to split a request, to spread
            # partitions over streams); in words too, in the message.
            trailing += ((error.limit_metadata_key, str(error.limit)),)
        if error.not_carried_out:
            # The call was refused before anything was done: a client may
            # send even a write again (tidelog._admin_retry).
            trailing += ((NOT_CARRIED_OUT_METADATA_KEY, "1"),)
        await context.abort(error.grpc_status, error.message, trailing_metadata=trailing)
        raise AssertionError("context.abort returns only by raising")  # pragma: no cover
