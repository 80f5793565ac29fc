"""Channels a service opens to its peers, and calls to the first coordinator
replica that answers.

- `ChannelPool`: one grpc.aio channel per address, opened on first use and
  reused (a channel multiplexes every call to its peer), all closed by
  `close` when the service stops. A channel nobody closes keeps its sockets
  and its polling until the process ends.
- `unanswered` and `may_ask_another`: the rule for a call a peer gave no
  answer of its own to (dropped on its side, UNAVAILABLE, past its
  deadline, or ended as this process wrote to it, its status lost:
  `is_status_lost`), worded for the client the failure is passed back to,
  and whether the call may go to another replica; `failure_of` words any
  failed call the same way.
- `ask_coordinators`: a call on coordinator replicas in turn while they are
  UNAVAILABLE or cancel the call (tidelog.errors.is_server_cancelled: too
  many calls waiting for that replica, or it is stopping). A replica past
  the deadline, or with no replica answering, gives
  CoordinatorNotAvailableError (retriable) naming the replica and what
  happened; when no replica was reached at all it is `not_carried_out`
  (the call went nowhere: a client may send even a write again), while one
  past its deadline may have been carried out and is not marked so. Any
  other failure is the coordinator's answer and is raised as is, for the
  caller to `pass_back` unchanged (status, details and the
  `tidelog-error-code` trailer). A broker and the gateway both forward
  with it, each through its own channels.
- `CoordinatorForwarding`: `ask_coordinators` over a ChannelPool (the
  broker's).
- `LOCAL_METADATA_KEY` (`tidelog-local`): set on a call one service sends
  another, "answer from what you hold yourself, call no one": a broker
  asked DescribeTopics (or DeleteRecords) answers from its own logs instead
  of forwarding the call to a coordinator; a coordinator asked
  DescribeTopics answers with its placement alone, without asking each
  leader for its figures, since the broker or gateway that forwarded the
  call asks them itself (so the leaders are asked once per call). `is_local`
  tells a servicer whether its call carries it.

Not thread-safe: used from one service's event loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NoReturn, TypeVar

import grpc
import grpc.aio
from tidelog.errors import (
    ERROR_CODE_METADATA_KEY,
    CoordinatorNotAvailableError,
    dropped_the_call,
    dropped_while_written,
    is_server_cancelled,
    is_status_lost,
)
from tidelog.security import PLAINTEXT, ChannelSecurity

T = TypeVar("T")

#: Invocation metadata key: "answer from what you hold yourself" (module doc).
LOCAL_METADATA_KEY = "tidelog-local"
#: The metadata that carries it.
LOCAL_METADATA = ((LOCAL_METADATA_KEY, "1"),)


def is_local(context: grpc.aio.ServicerContext) -> bool:
    """Whether the call carries `tidelog-local` (module doc)."""
    return any(k == LOCAL_METADATA_KEY for k, _ in context.invocation_metadata() or ())


class ChannelPool:
    """One channel per address, closed together (see module doc)."""

    def __init__(self, security: ChannelSecurity = PLAINTEXT) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._security = security

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._security.aio_channel(address)
        return channel

    def addresses(self) -> list[str]:
        """Addresses with an open channel."""
        return sorted(self._channels)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(None)


def unanswered(exc: grpc.aio.AioRpcError, upstream: str) -> str | None:
    """What happened to a call `upstream` (its role and address: "broker
    127.0.0.1:9092") gave no answer of its own to, in words for the client
    the failure is passed back to (the caller adds what to do: "; retry"):

    - it dropped the call (tidelog.errors.is_server_cancelled: more calls
      waiting for it than gRPC queues, or it is stopping);
    - it was UNAVAILABLE (unreachable, or it said so);
    - the call ran out of time: DEADLINE_EXCEEDED without the error code a
      Tidelog server names (so gRPC's deadline, not the upstream's answer);
    - it ended a streaming call as this process was writing to it, and
      gRPC lost its status (`is_status_lost`).

    None when `exc` is the upstream's own answer."""
    if is_server_cancelled(exc):
        return dropped_the_call(upstream)
    if is_status_lost(exc):
        return dropped_while_written(upstream)
    code = exc.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"{upstream} is unavailable (UNAVAILABLE: {exc.details()})"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and not _names_an_error_code(exc):
        return f"{upstream} did not answer in time (DEADLINE_EXCEEDED)"
    return None


def may_ask_another(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a call `unanswered` words may be sent to another replica:
    one dropped or unreachable. Not one past its deadline: the replica may
    still carry it out, and another would do it twice (a topic created,
    then TOPIC_ALREADY_EXISTS); nor one whose status was lost
    (`is_status_lost`), which the replica may have carried out too."""
    return exc.code() == grpc.StatusCode.UNAVAILABLE or is_server_cancelled(exc)


def failure_of(exc: grpc.aio.AioRpcError, upstream: str) -> str:
    """`unanswered`'s words for `exc`, or, for the upstream's own answer,
    its status and details, naming it the same way."""
    reason = unanswered(exc, upstream)
    if reason is None:
        reason = f"{upstream} failed the call ({exc.code().name}: {exc.details()})"
    return reason


def _names_an_error_code(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a Tidelog server named the call's error (its trailer)."""
    trailing: Any = exc.trailing_metadata() or ()
    return any(key == ERROR_CODE_METADATA_KEY for key, _ in trailing)


async def ask_coordinators(
    addresses: Iterable[str], invoke: Callable[[str], Awaitable[T]], what: str
) -> T:
    """`invoke(address)` on the first of `addresses` (the live coordinator
    replicas, in the order to try them) that answers: neither UNAVAILABLE
    nor cancelled on its side.

    Raises that replica's AioRpcError when it fails otherwise, and
    CoordinatorNotAvailableError naming the replica and what happened when
    one runs out of time (it may still carry the call out: see
    `may_ask_another`) or none answers.
    """
    last = "no coordinator is registered in etcd"
    for address in addresses:
        try:
            return await invoke(address)
        except grpc.aio.AioRpcError as exc:
            reason = unanswered(exc, f"coordinator {address}")
            if reason is None:
                raise
            if not may_ask_another(exc):
                raise CoordinatorNotAvailableError(
                    f"cannot forward {what} to a coordinator: {reason}; retry"
                ) from exc
            last = reason
    # Every replica was unreachable or dropped the call untaken (or none is
    # registered): nothing was done.
    raise CoordinatorNotAvailableError(
        f"cannot forward {what} to a coordinator: {last}; retry"
    ).surely_not_carried_out()


async def pass_back(context: grpc.aio.ServicerContext, exc: grpc.aio.AioRpcError) -> NoReturn:
    """End the client's call with the upstream's own answer `exc`: its
    status, details and error code (the `tidelog-error-code` trailer)."""
    trailing: Any = exc.trailing_metadata() or ()
    code = next((v for k, v in trailing if k == ERROR_CODE_METADATA_KEY), "")
    await context.abort(
        exc.code(),
        exc.details() or "",
        trailing_metadata=((ERROR_CODE_METADATA_KEY, code),) if code else (),
    )
    raise AssertionError("context.abort returns only by raising")  # pragma: no cover


class CoordinatorForwarding:
    """Calls to coordinator replicas over a shared ChannelPool."""

    def __init__(self, pool: ChannelPool, addresses: Callable[[], Iterable[str]]) -> None:
        self.pool = pool
        #: The live coordinator replicas' addresses, in the order to try them.
        self._addresses = addresses

    async def call(self, invoke: Callable[[grpc.aio.Channel], Awaitable[T]], what: str) -> T:
        """`invoke(channel)` on the first replica that answers, as
        `ask_coordinators` (which says what it raises)."""
        return await ask_coordinators(
            self._addresses(), lambda address: invoke(self.pool.channel(address)), what
        )
