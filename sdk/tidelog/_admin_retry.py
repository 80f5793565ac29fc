"""When and how the admin clients send a failed call again (Kafka's
AdminClient: retriable errors are retried after `retry.backoff.ms` until
`default.api.timeout.ms` runs out).

`AdminRetry.run(attempt, idempotent=...)` runs one attempt after another:

- which errors: a retriable TidelogError (`retriable`: no coordinator or
  broker answering, a coordinator starting, a call the server dropped, ...),
  except UnknownTopicOrPartitionError, which an admin call takes as the
  answer (describing a topic that does not exist), as Kafka's admin does;
- which calls: reads (describe, list) always; writes only when the error
  says the request was surely not carried out (`TidelogError.
  not_carried_out`: never sent because no connection could be made, no
  coordinator registered, or refused by the server before it acted). A
  write whose outcome is unknown (DEADLINE_EXCEEDED, a call cut off or
  dropped mid-way, etcd unreachable during its transaction) is NOT sent
  again: it may have been carried out, and the error is raised at once.
  (Were CreateTopics resent after such an outcome, it could answer
  TOPIC_ALREADY_EXISTS for a topic this very call created; Tidelog leaves
  that to the caller.)
- how long: until `default_api_timeout_ms` from the start of the call; an
  attempt still running then is cut off. The pause after attempt n is
  `retry_backoff_ms * 2**(n-1)`, capped at `retry_backoff_max_ms`, times a
  random factor in [0.8, 1.2] (Kafka 3.7+'s exponential backoff, so clients
  that failed together do not retry in step).

When the time is out, the last error is raised again, its message saying
`default_api_timeout_ms` and how many attempts were made.

Except: while no server of the client's has ever answered it (no attempt
succeeded, none failed with a server's own answer or was dropped by one), a
call that reached no server (BrokerNotAvailableError, not carried out) is
raised at once, its message saying so:
a bootstrap list none of whose addresses ever answered is most likely wrong
(a typo, a port of another service), and `tidelog topics list` against it
should say so at once, not after a minute. Kafka's AdminClient waits out
its timeout there; a client that has reached the cluster once retries as
Kafka does (a broker restarting, a coordinator starting).

Not thread-safe: the client's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tidelog.config import AdminConfig
from tidelog.errors import (
    BrokerNotAvailableError,
    RequestTimedOutError,
    TidelogError,
    UnknownTopicOrPartitionError,
)

log = logging.getLogger("tidelog.admin")

T = TypeVar("T")

#: Kafka's CommonClientConfigs.RETRY_BACKOFF_JITTER.
JITTER = 0.2


def may_resend(error: TidelogError, idempotent: bool) -> bool:
    """Whether a call that failed with `error` may be sent again (module doc)."""
    if not error.retriable or isinstance(error, UnknownTopicOrPartitionError):
        return False
    return idempotent or error.not_carried_out


class AdminRetry:
    """The retry policy of one admin client (see module doc)."""

    def __init__(self, config: AdminConfig) -> None:
        self._api_timeout_ms = config.default_api_timeout_ms
        self._backoff_s = config.retry_backoff_ms / 1000
        self._backoff_max_s = max(config.retry_backoff_max_ms, config.retry_backoff_ms) / 1000
        #: Whether a server has answered one of this client's attempts (with
        #: its answer or its own error): see the module doc's exception.
        self._answered = False

    def backoff_s(self, attempts: int) -> float:
        """The pause after `attempts` failed attempts (doubling, capped, jittered)."""
        delay = min(self._backoff_s * 2 ** min(attempts - 1, 30), self._backoff_max_s)
        return delay * random.uniform(1 - JITTER, 1 + JITTER)

    async def run(self, attempt: Callable[[], Awaitable[T]], *, idempotent: bool, what: str) -> T:
        """`attempt()` until it succeeds, fails for good, or the api
        timeout runs out (module doc). `what` names the call in log lines."""
        deadline = time.monotonic() + self._api_timeout_ms / 1000
        attempts = 0
        last: TidelogError | None = None
        while True:
            attempts += 1
            try:
                async with asyncio.timeout_at(_loop_time_of(deadline)):
                    result = await attempt()
                self._answered = True
                return result
            except TimeoutError:
                raise self._out_of_time(
                    last or RequestTimedOutError(f"{what} got no answer (the attempt was cut off)"),
                    attempts,
                    cut_off=True,
                ) from None
            except TidelogError as exc:
                if not _reached_no_server(exc):
                    self._answered = True  # a server's own error, or a call it dropped
                elif not self._answered:
                    raise _never_answered(exc) from None
                if not may_resend(exc, idempotent):
                    raise
                last = exc
                pause_s = self.backoff_s(attempts)
                if time.monotonic() + pause_s >= deadline:
                    raise self._out_of_time(exc, attempts, cut_off=False) from None
                log.info("%s: %s; retrying in %.0f ms", what, exc.message, pause_s * 1000)
                await asyncio.sleep(pause_s)

    def _out_of_time(self, error: TidelogError, attempts: int, cut_off: bool) -> TidelogError:
        """`error` (the last one) with a message saying the time is out."""
        how = (
            f"the last of {attempts} attempts was cut off"
            if cut_off
            else f"after {attempts} attempts"
        )
        error.message = (
            f"{error.message} (gave up: default_api_timeout_ms={self._api_timeout_ms} "
            f"ran out, {how})"
        )
        error.args = (error.message,)
        return error


def _reached_no_server(error: TidelogError) -> bool:
    """Whether `error` says the call reached no server at all: no
    connection could be made to any address (BrokerNotAvailableError,
    surely not carried out). A call a server dropped (CANCELLED: also
    BrokerNotAvailableError, but maybe carried out) reached one."""
    return isinstance(error, BrokerNotAvailableError) and error.not_carried_out


def _never_answered(error: TidelogError) -> TidelogError:
    """`error` saying that no server ever answered (module doc)."""
    error.message = (
        f"{error.message} (no server at these addresses has answered this client: "
        "check bootstrap_servers; not retried)"
    )
    error.args = (error.message,)
    return error


def _loop_time_of(monotonic_deadline: float) -> float:
    """A time.monotonic() deadline in the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_deadline - time.monotonic())
