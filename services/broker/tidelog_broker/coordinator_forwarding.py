"""Forwarding a client's call from a broker to a coordinator replica.

In cluster mode a broker answers some calls (Admin, InitProducerId) by
asking a coordinator: replicas are tried in turn while they are
UNAVAILABLE; any other failure is passed back to the client unchanged
(status, details and the `tidelog-error-code` trailer), so the client sees
exactly what the coordinator said. With no replica reachable the call ends
with COORDINATOR_NOT_AVAILABLE (retriable).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc
from tidelog.errors import ERROR_CODE_METADATA_KEY, CoordinatorNotAvailableError

from tidelog_broker.error_mapping import abort

#: Deadline of one forwarded call.
FORWARD_TIMEOUT_S = 30.0

T = TypeVar("T")


async def forward_to_coordinator(
    addresses: Iterable[str],
    invoke: Callable[[str], Awaitable[T]],
    context: grpc.aio.ServicerContext,
    what: str,
) -> T:
    """`invoke(address)` on the first coordinator replica that answers."""
    last = "no coordinator is registered in etcd"
    for address in addresses:
        try:
            return await invoke(address)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                last = f"{address}: {exc.details()}"
                continue
            trailing: Any = exc.trailing_metadata() or ()
            code = next((v for k, v in trailing if k == ERROR_CODE_METADATA_KEY), "")
            await context.abort(
                exc.code(),
                exc.details() or "",
                trailing_metadata=((ERROR_CODE_METADATA_KEY, code),) if code else (),
            )
    await abort(
        context,
        CoordinatorNotAvailableError(f"cannot forward {what} to a coordinator: {last}"),
        f"forwarding {what}",
    )
