"""The gateway's exception-to-wire-error mapping: the shared ErrorMapper
(tidelog_server.service_errors documents the two shapes, in-band per item and
whole-call) with the gateway's logger; `broker_call_error`, the in-band
error for the items of a call a broker failed; and `abort_shutting_down`,
how a data stream ends while the gateway stops."""

from __future__ import annotations

import logging
from typing import NoReturn

import grpc.aio
from tidelog.errors import error_from_rpc
from tidelog.v1 import common_pb2
from tidelog_server.draining import abort_draining
from tidelog_server.forwarding import unanswered
from tidelog_server.service_errors import ErrorMapper

_MAPPER = ErrorMapper(logging.getLogger("tidelog.gateway"))

error_proto = _MAPPER.error_proto
abort = _MAPPER.abort


def broker_call_error(
    exc: grpc.aio.AioRpcError,
    address: str,
    retriable_code: common_pb2.ErrorCode.ValueType,
    doing: str,
) -> common_pb2.Error:
    """The in-band error for what the broker at `address` was asked when it
    failed the call while the gateway was `doing` something.

    - No answer of its own (dropped, unavailable, past the deadline:
      tidelog_server.forwarding.unanswered): `retriable_code`, naming the
      broker and what happened, ending "; retry".
    - Its own refusal of the whole call (invalid, not authorized, over a
      quota): that refusal's typed error, naming the broker, which a "retry"
      would only repeat.
    """
    upstream = f"broker {address}"
    reason = unanswered(exc, upstream)
    if reason is None:
        error = error_proto(error_from_rpc(exc, address=address), doing)
        error.message = f"{upstream} refused the request: {error.message}"
        return error
    return common_pb2.Error(code=retriable_code, message=f"{reason}; retry")


async def abort_shutting_down(context: grpc.aio.ServicerContext, what_to_do: str) -> NoReturn:
    """End a client's data stream (Log Produce and Fetch, Records Produce and
    Consume) because the gateway is stopping: "the gateway is shutting down:
    `what_to_do`", UNAVAILABLE with NOT_LEADER_OR_FOLLOWER in the trailer, as
    a broker's drain ends them (tidelog_server.draining says why that code)."""
    await abort_draining(context, "the gateway", what_to_do)
