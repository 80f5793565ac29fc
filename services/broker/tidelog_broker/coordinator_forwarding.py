"""Forwarding a client's call from a broker to a coordinator replica.

In cluster mode a broker answers some calls (Admin, InitProducerId) by
asking a coordinator through the broker's one `CoordinatorForwarding`
(tidelog_server.forwarding: a shared channel pool, replicas tried in turn
while they are UNAVAILABLE or drop the call). Any other failure is passed
back to the client unchanged (status, details and the `tidelog-error-code`
trailer), so the client sees exactly what the coordinator said. With no
replica answering, or one past the deadline, the call ends with
COORDINATOR_NOT_AVAILABLE (retriable) naming the replica and what happened.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
import grpc.aio
from tidelog.errors import CoordinatorNotAvailableError
from tidelog_server.forwarding import CoordinatorForwarding, pass_back

from tidelog_broker.error_mapping import abort

#: Deadline of one forwarded call.
FORWARD_TIMEOUT_S = 30.0

T = TypeVar("T")


async def forward_to_coordinator(
    forwarding: CoordinatorForwarding,
    invoke: Callable[[grpc.aio.Channel], Awaitable[T]],
    context: grpc.aio.ServicerContext,
    what: str,
) -> T:
    """`invoke(channel)` on the first coordinator replica that answers; its
    failure, or COORDINATOR_NOT_AVAILABLE, ends the client's call."""
    try:
        return await forwarding.call(invoke, what)
    except grpc.aio.AioRpcError as exc:
        await pass_back(context, exc)
    except CoordinatorNotAvailableError as exc:
        await abort(context, exc, f"forwarding {what}")
