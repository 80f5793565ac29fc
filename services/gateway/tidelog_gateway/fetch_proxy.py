"""One client's Fetch stream through the gateway: several brokers, one stream.

The client sees the protocol of a broker's Fetch stream (protos log.proto):
it names positions, removes partitions and grants byte credit on one
stream. The gateway routes each position to its leader's Fetch stream (one
per broker, opened by this client stream on first use, closed with it) and
sends every broker response on to the client as it comes, record bytes
untouched.

Credit, end to end: the gateway never holds more record bytes for the
client than the client granted. It keeps

    client_credit  granted by the client and not yet sent to it,
    outstanding    per broker: credit granted to that broker, not yet spent,
    held           bytes received from brokers, not yet sent to the client,

and grants a broker credit only while  sum(outstanding) + held  stays within
client_credit; each broker's outstanding credit is capped at a fair share
(client_credit / brokers, at least two responses' worth), so that a broker
whose partitions are idle cannot sit on the whole window (and at most
max(2, max_answers_per_message) responses' worth). As a broker may,
the gateway passes the credit by one whole batch when a batch is larger than
the credit left. Credit granted to a broker is also reserved from the
gateway's FetchBudget (limits) until the bytes it brings have been written
to the client, so the gateway's fetch memory is bounded for all clients
together too.

A partition the gateway cannot route (unknown topic, no live leader) is
answered in-band with its typed error, as a broker answers a partition it
cannot read: the client sends a new position to retry. When a broker's
stream breaks, each partition it was reading is answered with
NOT_LEADER_OR_FOLLOWER at the position the client has reached (after the
data already queued), its message naming the broker and what happened
(tidelog_server.forwarding.failure_of), which the SDK answers by sending the
position again; the gateway then routes it to the (new) leader. `min_bytes` and `max_wait_ms`
apply per broker, and so does `max_answers_per_message`: a broker's message
of several answers reaches the client as it came (its answers in order, a
partition's positions advanced answer by answer).

A request naming more partitions (positions and removals) than
--max-partitions-per-request is refused whole, before any of it is applied:
the stream ends INVALID_ARGUMENT naming the limit, in words and in the
trailing metadata key `tidelog-max-partitions-per-request` (which the
stream's initial metadata also carries, log_servicer); the SDK places its
partitions again, on a new stream, in requests within it. A request that
would leave the stream reading more partitions than
--max-partitions-per-fetch (those it reads, less the ones it removes, plus
the new ones it places) is refused the same way, before any of it is
applied or forwarded: the stream never reads more than the limit, and the
stream ends INVALID_ARGUMENT naming it, in words and in the trailing
metadata key `tidelog-max-partitions-per-fetch` (which the stream's initial
metadata also carries); the SDK spreads its partitions over several streams
of at most that many.

Drain (SIGTERM): the stream ends with UNAVAILABLE and NOT_LEADER_OR_FOLLOWER
in the trailer (log_servicer, errors.abort_shutting_down); the client
reconnects (to another gateway) and resumes from its positions.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator

import grpc
import grpc.aio
from tidelog.config import MAX_FETCH_ANSWERS_PER_MESSAGE
from tidelog.errors import (
    InvalidRequestError,
    NotLeaderOrFollowerError,
    PartitionsPerFetchError,
    PartitionsPerRequestError,
    TidelogError,
)
from tidelog.request_limits import check_fetch_positions
from tidelog.v1 import common_pb2, log_pb2
from tidelog_server.forwarding import failure_of

from tidelog_gateway.channels import Channels
from tidelog_gateway.cluster_view import ClusterView
from tidelog_gateway.config import GatewayConfig
from tidelog_gateway.errors import error_proto
from tidelog_gateway.limits import FetchBudget

log = logging.getLogger("tidelog.gateway.fetch")

#: The broker's default response size (FetchRequest.max_bytes = 0).
DEFAULT_MAX_BYTES = 1024 * 1024
#: A broker that has sent nothing for this long while holding more than its
#: share of the credit, when another broker has none, has its stream reopened.
RECLAIM_IDLE_S = 1.0

TopicPartitionKey = tuple[str, int]


class _Upstream:
    """This stream's Fetch stream to one broker."""

    def __init__(self, proxy: FetchProxy, address: str, first: log_pb2.FetchRequest) -> None:
        self.address = address
        self._proxy = proxy
        self.partitions: set[TopicPartitionKey] = set()
        #: Credit granted to the broker and not yet spent.
        self.outstanding = 0
        #: loop.time() of the stream's start or its last response.
        self.last_active = asyncio.get_running_loop().time()
        self.closed = False
        self._requests: asyncio.Queue[log_pb2.FetchRequest | None] = asyncio.Queue()
        self._requests.put_nowait(first)
        self._call = proxy.channels.log_streams(address).Fetch(self._request_iterator())
        self._reader = asyncio.ensure_future(self._read_loop())

    async def _request_iterator(self) -> AsyncIterator[log_pb2.FetchRequest]:
        while True:
            request = await self._requests.get()
            if request is None:
                return
            yield request

    def send(self, request: log_pb2.FetchRequest) -> None:
        if not self.closed:
            self._requests.put_nowait(request)

    async def _read_loop(self) -> None:
        try:
            async for response in self._call:
                self._proxy.on_response(self, response)
            reason = f"broker {self.address} ended the fetch stream"
        except grpc.aio.AioRpcError as exc:
            if self.closed:
                return
            reason = failure_of(exc, f"broker {self.address}")
        self._proxy.on_upstream_failed(self, reason)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._requests.put_nowait(None)
            self._call.cancel()
            self._reader.cancel()


class FetchProxy:
    """One client Fetch stream (see module doc)."""

    def __init__(
        self,
        view: ClusterView,
        channels: Channels,
        config: GatewayConfig,
        budget: FetchBudget,
        peer: str,
        draining: asyncio.Event,
    ) -> None:
        self.channels = channels
        self._view = view
        self._config = config
        self._budget = budget
        self._peer = peer
        self._draining = draining
        self._upstreams: dict[str, _Upstream] = {}
        #: Partition -> the broker address reading it.
        self._routes: dict[TopicPartitionKey, str] = {}
        #: Partition -> the offset the client reaches after what is queued.
        self._positions: dict[TopicPartitionKey, int] = {}
        self._partition_max_bytes: dict[TopicPartitionKey, int] = {}
        self._client_credit = 0
        self._held = 0
        #: Bytes reserved from the budget for this stream (granted or held).
        self._reserved = 0
        self._max_bytes = 0
        self._min_bytes = 0
        self._max_wait_ms = 0
        self._answers_per_message = 0
        self._out: deque[tuple[log_pb2.FetchResponse, int]] = deque()
        self._wake = asyncio.Event()
        self._input_closed = False
        self._failure: BaseException | None = None
        self._next_start = 0
        self._budget_waiter: asyncio.Task[None] | None = None
        self._reclaim_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ client side

    async def run(
        self, request_iterator: AsyncIterator[log_pb2.FetchRequest]
    ) -> AsyncGenerator[log_pb2.FetchResponse, None]:
        reader = asyncio.ensure_future(self._read_requests(request_iterator))
        drained = asyncio.ensure_future(self._draining.wait())
        drained.add_done_callback(lambda _: self._wake.set())
        try:
            while True:
                if self._failure is not None:
                    raise self._failure
                if self._draining.is_set():
                    return
                if self._out:
                    response, size = self._out.popleft()
                    self._client_credit -= size
                    try:
                        yield response
                    finally:
                        # Written (or abandoned): its bytes leave the gateway.
                        self._held -= size
                        self._unreserve(size)
                    self._distribute()
                    continue
                if self._input_closed and (self._client_credit <= 0 or not self._routes):
                    return
                self._wake.clear()
                await self._wake.wait()
        finally:
            drained.cancel()
            reader.cancel()
            self.close()

    async def _read_requests(self, requests: AsyncIterator[log_pb2.FetchRequest]) -> None:
        try:
            async for request in requests:
                self.apply(request)
        except TidelogError as exc:
            self._failure = exc
        except grpc.aio.AioRpcError:
            pass
        self._input_closed = True
        self._wake.set()

    def apply(self, request: log_pb2.FetchRequest) -> None:
        """Take in one client request. Raises InvalidRequestError, which
        ends the stream; a request over --max-partitions-per-request
        (PartitionsPerRequestError, naming it), one that would take the
        stream over --max-partitions-per-fetch (PartitionsPerFetchError,
        naming it), or one with a bad field is
        refused before any of it is applied (nor forwarded to a broker)."""
        config = self._config
        if request.credit_bytes < 0:
            raise InvalidRequestError(f"credit_bytes must be >= 0, got {request.credit_bytes}")
        for name, value in (
            ("max_bytes", request.max_bytes),
            ("min_bytes", request.min_bytes),
            ("max_wait_ms", request.max_wait_ms),
        ):
            if value < 0:
                raise InvalidRequestError(
                    f"{name} must be >= 0 (0 keeps the current value), got {value}"
                )
        answers = request.max_answers_per_message
        if not 0 <= answers <= MAX_FETCH_ANSWERS_PER_MESSAGE:
            raise InvalidRequestError(
                f"max_answers_per_message must be between 0 and "
                f"{MAX_FETCH_ANSWERS_PER_MESSAGE} (0 keeps the current value), got {answers}"
            )
        named = len(request.positions) + len(request.remove)
        if named > config.max_partitions_per_request:
            raise PartitionsPerRequestError(
                f"a fetch request names {named} partitions, over the limit of "
                f"{config.max_partitions_per_request} (--max-partitions-per-request)",
                config.max_partitions_per_request,
            )
        if self._client_credit + request.credit_bytes > config.fetch_max_credit_bytes:
            raise InvalidRequestError(
                f"credit_bytes would reach {self._client_credit + request.credit_bytes} "
                f"outstanding, over the limit of {config.fetch_max_credit_bytes} bytes: grant "
                "credit as responses are consumed"
            )
        check_fetch_positions(request.positions)
        held = len(self._positions)
        after = held + self._partitions_added(request)
        if after > config.max_partitions_per_fetch:
            raise PartitionsPerFetchError(
                f"the stream would read {after} partitions (it reads {held}), over the limit "
                f"of {config.max_partitions_per_fetch} (--max-partitions-per-fetch): remove "
                "partitions before placing others, or read them on another stream",
                config.max_partitions_per_fetch,
            )
        settings_changed = bool(
            request.max_bytes or request.min_bytes or request.max_wait_ms or answers
        )
        self._max_bytes = request.max_bytes or self._max_bytes
        self._min_bytes = request.min_bytes or self._min_bytes
        self._max_wait_ms = request.max_wait_ms or self._max_wait_ms
        self._answers_per_message = answers or self._answers_per_message
        if settings_changed:
            for upstream in self._upstreams.values():
                upstream.send(self._settings(log_pb2.FetchRequest()))
        # What one request removes and places goes on to each broker in one
        # request of removals, then one of positions: a broker's session
        # looks over all of its partitions after each request, so one request
        # per partition cost it time quadratic in the partitions placed at
        # once (~4.5 s of broker CPU for 1,200 sent straight from a
        # consumer, bench.reset_placement_ab).
        removing: dict[_Upstream, list[common_pb2.TopicPartition]] = {}
        placing: dict[str, list[log_pb2.FetchPosition]] = {}
        for tp in request.remove:
            key = (tp.topic, tp.partition)
            self._unroute(key, removing)
            self._positions.pop(key, None)
        for position in request.positions:
            self._place(position, placing, removing)
        for upstream, removed in removing.items():
            upstream.send(log_pb2.FetchRequest(remove=removed))
        for address, positions in placing.items():
            forwarded = log_pb2.FetchRequest(positions=positions)
            known = self._upstreams.get(address)
            if known is None:
                known = _Upstream(self, address, self._settings(forwarded))
                self._upstreams[address] = known
            else:
                known.send(forwarded)
            known.partitions.update((p.topic, p.partition) for p in positions)
        self._client_credit += request.credit_bytes
        self._distribute()

    def _partitions_added(self, request: log_pb2.FetchRequest) -> int:
        """How many partitions the stream reads more (or, negative, fewer)
        once `request` is applied: its removals come first, then its
        positions (a partition removed and placed again stays)."""
        removed = {(tp.topic, tp.partition) for tp in request.remove}
        placed = {(p.topic, p.partition) for p in request.positions}
        held = self._positions
        return sum(1 for key in placed if key not in held or key in removed) - sum(
            1 for key in removed if key in held
        )

    def _settings(self, request: log_pb2.FetchRequest) -> log_pb2.FetchRequest:
        request.max_bytes = self._max_bytes
        request.min_bytes = self._min_bytes
        request.max_wait_ms = self._max_wait_ms
        request.max_answers_per_message = self._answers_per_message
        return request

    def _place(
        self,
        position: log_pb2.FetchPosition,
        placing: dict[str, list[log_pb2.FetchPosition]],
        removing: dict[_Upstream, list[common_pb2.TopicPartition]],
    ) -> None:
        """Route the position to its leader: add it to `placing[address]`
        (and its removal from a former leader to `removing`), for the caller
        to send."""
        key = (position.topic, position.partition)
        self._positions[key] = position.fetch_offset
        self._partition_max_bytes[key] = position.partition_max_bytes
        try:
            address = self._view.leader_address(position.topic, position.partition)
        except TidelogError as exc:
            self._unroute(key, removing)
            self._queue_error(key, position.fetch_offset, error_proto(exc, "routing a fetch"))
            return
        previous = self._routes.get(key)
        if previous is not None and previous != address:
            self._unroute(key, removing)
        self._routes[key] = address
        placing.setdefault(address, []).append(position)

    def _unroute(
        self, key: TopicPartitionKey, removing: dict[_Upstream, list[common_pb2.TopicPartition]]
    ) -> None:
        """Stop routing the partition; its removal from the broker reading
        it goes in `removing`, for the caller to send."""
        address = self._routes.pop(key, None)
        upstream = None if address is None else self._upstreams.get(address)
        if upstream is not None and key in upstream.partitions:
            upstream.partitions.discard(key)
            removing.setdefault(upstream, []).append(
                common_pb2.TopicPartition(topic=key[0], partition=key[1])
            )

    def _queue_error(self, key: TopicPartitionKey, offset: int, error: common_pb2.Error) -> None:
        response = log_pb2.FetchResponse()
        response.partitions.add(
            topic=key[0], partition=key[1], error=error, fetch_offset=offset, next_offset=offset
        )
        self._out.append((response, 0))
        self._wake.set()

    # ------------------------------------------------------------ credit

    def _distribute(self) -> None:
        """Grant brokers credit within the client's (see module doc)."""
        upstreams = [u for u in self._upstreams.values() if u.partitions and not u.closed]
        if not upstreams:
            return
        free = self._client_credit - self._held - sum(u.outstanding for u in upstreams)
        fair_share = max(1, self._client_credit // len(upstreams))
        start = self._next_start % len(upstreams)
        self._next_start += 1
        starving = []
        for upstream in upstreams[start:] + upstreams[:start]:
            # Two responses' worth keeps a broker busy while one is in
            # flight; a broker asked for several answers per message needs
            # that many answers' worth to fill one.
            responses = max(2, self._answers_per_message)
            cap = min(responses * self._response_bytes(upstream), fair_share)
            grant = min(cap - upstream.outstanding, free, self._budget.available(self._peer))
            if grant > 0:
                self._budget.reserve(self._peer, grant)
                self._reserved += grant
                upstream.outstanding += grant
                free -= grant
                upstream.send(log_pb2.FetchRequest(credit_bytes=grant))
            if upstream.outstanding <= 0:
                starving.append(upstream)
        if starving and free <= 0 and self._reclaim(upstreams, fair_share):
            self._distribute()  # the credit taken back goes to the starving
        if free > 0 and self._budget.available(self._peer) <= 0:
            self._wait_for_budget()

    def _response_bytes(self, upstream: _Upstream) -> int:
        """The most one response of this broker can carry."""
        max_bytes = self._max_bytes or DEFAULT_MAX_BYTES
        per_partition = sum(
            self._partition_max_bytes.get(key) or max_bytes for key in upstream.partitions
        )
        return min(max_bytes, per_partition)

    def _reclaim(self, upstreams: list[_Upstream], fair_share: int) -> bool:
        """Take back credit from brokers that sit on more than their share
        without sending anything, so that the others can be given some. A
        broker cannot be asked to return credit, so its stream is reopened
        at the positions the client has reached (the credit dies with the
        old stream). Brokers active within RECLAIM_IDLE_S are left alone;
        the check runs again after that long. True if any was reopened."""
        hoarders = [u for u in upstreams if u.outstanding > fair_share]
        if not hoarders:
            return False  # the credit is with the client, not the brokers
        now = asyncio.get_running_loop().time()
        reopened = False
        for upstream in hoarders:
            if now - upstream.last_active >= RECLAIM_IDLE_S:
                self._reopen(upstream)
                reopened = True
        if not reopened and self._reclaim_timer is None:

            def again() -> None:
                self._reclaim_timer = None
                self._distribute()

            self._reclaim_timer = asyncio.get_running_loop().call_later(RECLAIM_IDLE_S, again)
        return reopened

    def _reopen(self, upstream: _Upstream) -> None:
        keys = sorted(upstream.partitions)
        request = log_pb2.FetchRequest(
            positions=[
                log_pb2.FetchPosition(
                    topic=key[0],
                    partition=key[1],
                    fetch_offset=self._positions[key],
                    partition_max_bytes=self._partition_max_bytes.get(key, 0),
                )
                for key in keys
                if key in self._positions
            ]
        )
        upstream.close()
        self._unreserve(upstream.outstanding)
        upstream.outstanding = 0
        replacement = _Upstream(self, upstream.address, self._settings(request))
        replacement.partitions = set(upstream.partitions)
        self._upstreams[upstream.address] = replacement

    def _wait_for_budget(self) -> None:
        """Distribute again once other streams have returned budget."""
        if self._budget_waiter is not None and not self._budget_waiter.done():
            return

        async def wait() -> None:
            await self._budget.wait_released()
            self._distribute()

        self._budget_waiter = asyncio.ensure_future(wait())

    def _unreserve(self, size: int) -> None:
        size = min(size, self._reserved)
        self._reserved -= size
        self._budget.release(self._peer, size)

    # ------------------------------------------------------------ broker side

    def on_response(self, upstream: _Upstream, response: log_pb2.FetchResponse) -> None:
        if upstream.closed or self._upstreams.get(upstream.address) is not upstream:
            return  # a reopened stream's last words: the new one reads them again
        upstream.last_active = asyncio.get_running_loop().time()
        size = 0
        for data in response.partitions:
            size += len(data.records)
            key = (data.topic, data.partition)
            if self._routes.get(key) != upstream.address:
                continue  # moved or removed since: the client ignores it too
            if data.error.code:
                # The broker stopped reading it until a new position comes.
                self._routes.pop(key, None)
                upstream.partitions.discard(key)
            elif self._positions.get(key) == data.fetch_offset:
                self._positions[key] = data.next_offset
        upstream.outstanding -= size
        if upstream.outstanding < 0:
            # One whole batch past the credit (allowed): hold it too.
            self._budget.reserve(self._peer, -upstream.outstanding)
            self._reserved += -upstream.outstanding
            upstream.outstanding = 0
        self._held += size
        self._out.append((response, size))
        self._wake.set()

    def on_upstream_failed(self, upstream: _Upstream, reason: str) -> None:
        if self._upstreams.get(upstream.address) is not upstream:
            return
        del self._upstreams[upstream.address]
        upstream.close()
        # Credit the broker never spent comes back to the client's window.
        self._unreserve(upstream.outstanding)
        upstream.outstanding = 0
        log.info("fetch stream to %s failed: %s", upstream.address, reason)
        error = error_proto(
            NotLeaderOrFollowerError(
                f"{reason}; the gateway lost its fetch stream to the leader: "
                "send the position again"
            ),
            "fetching",
        )
        for key in sorted(upstream.partitions):
            if self._routes.get(key) == upstream.address:
                del self._routes[key]
                self._queue_error(key, self._positions.get(key, 0), error)
        self._distribute()

    def close(self) -> None:
        for upstream in self._upstreams.values():
            upstream.close()
        self._upstreams.clear()
        if self._budget_waiter is not None:
            self._budget_waiter.cancel()
        if self._reclaim_timer is not None:
            self._reclaim_timer.cancel()
        self._budget.release(self._peer, self._reserved)
        self._reserved = 0
