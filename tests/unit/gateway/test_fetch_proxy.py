"""FetchProxy's credit, with scripted brokers: the gateway never grants
brokers more than the client granted, takes back credit an idle broker sits
on, and answers a lost broker stream at the client's position."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tidelog.errors import InvalidRequestError, PartitionsPerRequestError
from tidelog.v1 import common_pb2, log_pb2
from tidelog_gateway import fetch_proxy
from tidelog_gateway.config import GatewayConfig
from tidelog_gateway.fetch_proxy import FetchProxy
from tidelog_gateway.limits import FetchBudget

TOPIC = "t"


class ScriptedCall:
    """A broker's Fetch stream: records what the gateway sends, answers
    what the test pushes."""

    def __init__(self, requests: AsyncIterator[log_pb2.FetchRequest]) -> None:
        self.sent: list[log_pb2.FetchRequest] = []
        self.responses: asyncio.Queue[log_pb2.FetchResponse | None] = asyncio.Queue()
        self.cancelled = False
        self._pump = asyncio.ensure_future(self._take(requests))

    async def _take(self, requests: AsyncIterator[log_pb2.FetchRequest]) -> None:
        async for request in requests:
            self.sent.append(request)

    def __aiter__(self) -> ScriptedCall:
        return self

    async def __anext__(self) -> log_pb2.FetchResponse:
        response = await self.responses.get()
        if response is None:
            raise StopAsyncIteration
        return response

    def cancel(self) -> None:
        self.cancelled = True
        self._pump.cancel()

    @property
    def credit(self) -> int:
        return sum(r.credit_bytes for r in self.sent)

    def send(self, partition: int, offset: int, size: int) -> None:
        response = log_pb2.FetchResponse()
        response.partitions.add(
            topic=TOPIC,
            partition=partition,
            fetch_offset=offset,
            next_offset=offset + 1,
            records=b"x" * size,
        )
        self.responses.put_nowait(response)


class Brokers:
    """Stands in for the view (partition p is led by broker p) and the channels."""

    def __init__(self) -> None:
        self.calls: dict[str, list[ScriptedCall]] = {}

    def leader_address(self, topic: str, partition: int) -> str:
        return f"broker-{partition}"

    def log_streams(self, address: str) -> Any:
        brokers = self

        class Stub:
            def Fetch(self, requests: AsyncIterator[log_pb2.FetchRequest]) -> ScriptedCall:
                call = ScriptedCall(requests)
                brokers.calls.setdefault(address, []).append(call)
                return call

        return Stub()

    def current(self, partition: int) -> ScriptedCall:
        return self.calls[f"broker-{partition}"][-1]


class Client:
    """Sends requests and reads every response as soon as it comes."""

    def __init__(self, proxy: FetchProxy) -> None:
        self.proxy = proxy
        self.requests: asyncio.Queue[log_pb2.FetchRequest] = asyncio.Queue()
        self.received: asyncio.Queue[log_pb2.FetchResponse] = asyncio.Queue()
        self._responses = proxy.run(self._requests())
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for response in self._responses:
            self.received.put_nowait(response)

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._responses.aclose()

    async def _requests(self) -> AsyncIterator[log_pb2.FetchRequest]:
        while True:
            yield await self.requests.get()

    def grant(self, credit: int, *partitions: int) -> None:
        self.requests.put_nowait(
            log_pb2.FetchRequest(
                positions=[
                    log_pb2.FetchPosition(topic=TOPIC, partition=p, fetch_offset=0)
                    for p in partitions
                ],
                credit_bytes=credit,
            )
        )

    async def next(self) -> log_pb2.FetchResponse:
        return await asyncio.wait_for(self.received.get(), 10)


def make(budget_bytes: int = 1 << 30) -> tuple[Brokers, Client, FetchBudget]:
    brokers = Brokers()
    budget = FetchBudget(budget_bytes, budget_bytes)
    proxy = FetchProxy(
        brokers,  # type: ignore[arg-type]
        brokers,  # type: ignore[arg-type]
        GatewayConfig(),
        budget,
        "peer",
        asyncio.Event(),
    )
    return brokers, Client(proxy), budget


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_brokers_get_no_more_credit_than_the_client_granted() -> None:
    async def scenario() -> None:
        brokers, client, budget = make()
        client.grant(90_000, 0, 1, 2)
        await settle()
        granted = sum(brokers.current(p).credit for p in range(3))
        assert 0 < granted <= 90_000
        assert budget.reserved == granted
        # Each broker spends its credit; the gateway passes it on and grants
        # only what the client returns.
        for p in range(3):
            brokers.current(p).send(p, 0, brokers.current(p).credit)
        delivered = 0
        while delivered < granted:
            response = await client.next()
            delivered += sum(len(d.records) for d in response.partitions)
        await settle()
        assert sum(brokers.current(p).credit for p in range(3)) == granted
        client.grant(30_000)
        await settle()
        assert sum(brokers.current(p).credit for p in range(3)) == granted + 30_000
        await client.close()
        assert budget.reserved == 0

    asyncio.run(scenario())


def test_credit_an_idle_broker_sits_on_goes_to_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fetch_proxy, "RECLAIM_IDLE_S", 0.05)

    async def scenario() -> None:
        brokers, client, budget = make()
        # The first request names one partition: its broker gets the window.
        client.grant(50_000, 0)
        await settle()
        idle = brokers.current(0)
        assert idle.credit == 50_000
        client.grant(0, 1)
        await settle()
        assert brokers.current(1).credit == 0  # nothing left to grant
        # Broker 0 sends nothing: its stream is reopened at the client's
        # position, and broker 1 gets a share.
        await asyncio.sleep(0.3)
        assert idle.cancelled
        reopened = brokers.current(0)
        assert reopened is not idle
        assert [(p.partition, p.fetch_offset) for p in reopened.sent[0].positions] == [(0, 0)]
        assert brokers.current(1).credit > 0
        assert brokers.current(0).credit + brokers.current(1).credit <= 50_000
        assert budget.reserved <= 50_000
        await client.close()

    asyncio.run(scenario())


def test_a_lost_broker_stream_is_answered_at_the_client_position() -> None:
    async def scenario() -> None:
        brokers, client, _ = make()
        client.grant(10_000, 0)
        await settle()
        broker = brokers.current(0)
        broker.send(0, 0, 100)
        first = await client.next()
        assert first.partitions[0].next_offset == 1
        broker.responses.put_nowait(None)  # the stream ends
        lost = await client.next()
        (data,) = lost.partitions
        assert data.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
        assert data.fetch_offset == 1  # where the client is now
        await client.close()

    asyncio.run(scenario())


def test_a_spent_window_sets_no_reclaim_timer() -> None:
    async def scenario() -> None:
        brokers, client, _ = make()
        client.grant(1000, 0, 1)
        await settle()
        for p in range(2):
            broker = brokers.current(p)
            broker.send(p, 0, broker.credit)
        await client.next()
        await client.next()
        await settle()
        # The credit is with the client now: no broker sits on any, so there
        # is nothing to take back and nothing to check again later.
        assert client.proxy._reclaim_timer is None
        await client.close()

    asyncio.run(scenario())


def test_answers_per_message_reach_every_broker_and_a_change_is_passed_on() -> None:
    async def scenario() -> None:
        brokers, client, _ = make()
        request = log_pb2.FetchRequest(
            positions=[log_pb2.FetchPosition(topic=TOPIC, partition=0, fetch_offset=0)],
            credit_bytes=10_000,
            max_answers_per_message=4,
        )
        client.requests.put_nowait(request)
        await settle()
        client.grant(0, 1)  # a broker opened after the setting gets it too
        await settle()
        for p in range(2):
            assert brokers.current(p).sent[0].max_answers_per_message == 4
        client.requests.put_nowait(log_pb2.FetchRequest(max_answers_per_message=1))
        await settle()
        for p in range(2):
            assert brokers.current(p).sent[-1].max_answers_per_message == 1
        await client.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("answers", [-1, 17])
def test_answers_per_message_out_of_range_are_refused_naming_the_limit(answers: int) -> None:
    async def scenario() -> None:
        brokers, client, _ = make()
        client.requests.put_nowait(
            log_pb2.FetchRequest(credit_bytes=1000, max_answers_per_message=answers)
        )
        with pytest.raises(InvalidRequestError, match="between 0 and 16"):
            await asyncio.wait_for(client._reader, 10)
        assert brokers.calls == {}

    asyncio.run(scenario())


def test_a_message_of_several_answers_moves_the_position_answer_by_answer() -> None:
    async def scenario() -> None:
        brokers, client, _ = make()
        client.requests.put_nowait(
            log_pb2.FetchRequest(
                positions=[log_pb2.FetchPosition(topic=TOPIC, partition=0, fetch_offset=0)],
                credit_bytes=10_000,
                max_answers_per_message=3,
            )
        )
        await settle()
        broker = brokers.current(0)
        bundled = log_pb2.FetchResponse()
        for offset in range(3):
            bundled.partitions.add(
                topic=TOPIC,
                partition=0,
                fetch_offset=offset,
                next_offset=offset + 1,
                records=b"x" * 100,
            )
        broker.responses.put_nowait(bundled)
        received = await client.next()
        assert [d.fetch_offset for d in received.partitions] == [0, 1, 2]
        broker.responses.put_nowait(None)  # the stream ends: answered where the client is
        (lost,) = (await client.next()).partitions
        assert lost.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
        assert lost.fetch_offset == 3
        await client.close()

    asyncio.run(scenario())


class OneBroker(Brokers):
    """Broker 0 leads every partition."""

    def leader_address(self, topic: str, partition: int) -> str:
        return "broker-0"


def test_the_partitions_of_one_request_reach_their_broker_in_one_request() -> None:
    """A consumer placing (removing) 1,200 partitions in one request: the
    gateway passes them on in one request, not one per partition (a broker's
    session looks over all its partitions after every request)."""

    async def scenario() -> None:
        brokers = OneBroker()
        proxy = FetchProxy(
            brokers,  # type: ignore[arg-type]
            brokers,  # type: ignore[arg-type]
            GatewayConfig(),
            FetchBudget(1 << 30, 1 << 30),
            "peer",
            asyncio.Event(),
        )
        client = Client(proxy)
        client.grant(10_000, *range(1200))
        await settle()
        (call,) = brokers.calls["broker-0"]
        placing = [r for r in call.sent if r.positions]
        assert len(placing) == 1
        assert [p.partition for p in placing[0].positions] == list(range(1200))
        # The next placement, of some of them, goes on in one request too,
        # each at its own position.
        client.requests.put_nowait(
            log_pb2.FetchRequest(
                positions=[
                    log_pb2.FetchPosition(topic=TOPIC, partition=p, fetch_offset=p)
                    for p in range(0, 1200, 2)
                ]
            )
        )
        await settle()
        placing = [r for r in call.sent if r.positions]
        assert len(placing) == 2
        assert [(p.partition, p.fetch_offset) for p in placing[1].positions] == [
            (p, p) for p in range(0, 1200, 2)
        ]
        # So do removals (a consumer pausing every partition).
        client.requests.put_nowait(
            log_pb2.FetchRequest(
                remove=[common_pb2.TopicPartition(topic=TOPIC, partition=p) for p in range(1200)]
            )
        )
        await settle()
        removing = [r for r in call.sent if r.remove]
        assert len(removing) == 1
        assert [tp.partition for tp in removing[0].remove] == list(range(1200))
        await client.close()

    asyncio.run(scenario())


def test_a_request_over_the_partition_limit_is_refused_before_any_of_it_is_applied() -> None:
    """Refused whole, naming the limit (in words, and as `limit` for the
    trailing metadata): nothing of it reaches a broker and the positions
    stay as they were, so the client may place the partitions again, split
    (tidelog._partition_limits)."""

    async def scenario() -> None:
        brokers = Brokers()
        proxy = FetchProxy(
            brokers,  # type: ignore[arg-type]
            brokers,  # type: ignore[arg-type]
            GatewayConfig(max_partitions_per_request=3),
            FetchBudget(1 << 30, 1 << 30),
            "peer",
            asyncio.Event(),
        )
        client = Client(proxy)
        client.grant(1000, 0, 1)
        await settle()
        sent = {address: [list(c.sent) for c in calls] for address, calls in brokers.calls.items()}
        # One removal and three positions: four partitions named.
        client.requests.put_nowait(
            log_pb2.FetchRequest(
                remove=[common_pb2.TopicPartition(topic=TOPIC, partition=0)],
                positions=[
                    log_pb2.FetchPosition(topic=TOPIC, partition=p, fetch_offset=5)
                    for p in (1, 2, 3)
                ],
                credit_bytes=1000,
                max_bytes=77,
            )
        )
        with pytest.raises(PartitionsPerRequestError) as refused:
            await asyncio.wait_for(client._reader, 10)
        assert refused.value.limit == 3
        assert "names 4 partitions, over the limit of 3 (--max-partitions-per-request)" in str(
            refused.value
        )
        # Nothing of it applied: no broker got a request it did not have
        # before (broker 2 and 3 not even a stream), no position moved.
        assert {a: [list(c.sent) for c in calls] for a, calls in brokers.calls.items()} == sent
        assert proxy._positions == {(TOPIC, 0): 0, (TOPIC, 1): 0}
        assert proxy._max_bytes == 0

    asyncio.run(scenario())


def _limited_proxy(brokers: Brokers, max_partitions_per_fetch: int) -> FetchProxy:
    return FetchProxy(
        brokers,  # type: ignore[arg-type]
        brokers,  # type: ignore[arg-type]
        GatewayConfig(max_partitions_per_fetch=max_partitions_per_fetch),
        FetchBudget(1 << 30, 1 << 30),
        "peer",
        asyncio.Event(),
    )


def _sent(brokers: Brokers) -> dict[str, list[list[log_pb2.FetchRequest]]]:
    return {address: [list(c.sent) for c in calls] for address, calls in brokers.calls.items()}


def test_a_request_over_the_stream_partition_limit_is_refused_before_any_of_it_applies() -> None:
    """--max-partitions-per-fetch is checked on what the stream would read
    after the request, before any of it is applied: no broker is sent a
    position (nor a setting, nor credit) of it, and the stream's positions
    never go over the limit, not even until the refusal."""

    async def scenario() -> None:
        brokers = Brokers()
        proxy = _limited_proxy(brokers, 3)
        client = Client(proxy)
        client.grant(1000, 0, 1)
        await settle()
        sent = _sent(brokers)
        client.requests.put_nowait(
            log_pb2.FetchRequest(
                positions=[
                    log_pb2.FetchPosition(topic=TOPIC, partition=p, fetch_offset=5)
                    for p in (1, 2, 3)
                ],
                credit_bytes=1000,
                max_bytes=77,
            )
        )
        with pytest.raises(InvalidRequestError) as refused:
            await asyncio.wait_for(client._reader, 10)
        assert "the stream would read 4 partitions" in str(refused.value)
        assert "over the limit of 3 (--max-partitions-per-fetch)" in str(refused.value)
        assert _sent(brokers) == sent
        assert proxy._positions == {(TOPIC, 0): 0, (TOPIC, 1): 0}
        assert proxy._max_bytes == 0

    asyncio.run(scenario())


def test_a_request_removing_as_many_partitions_as_it_adds_stays_within_the_limit() -> None:
    """The limit counts what the stream reads after the request: its
    removals first, then its new positions (a partition removed and placed
    again in one request is read once)."""

    async def scenario() -> None:
        brokers = Brokers()
        proxy = _limited_proxy(brokers, 3)
        client = Client(proxy)
        client.grant(1000, 0, 1, 2)
        await settle()
        client.requests.put_nowait(
            log_pb2.FetchRequest(
                remove=[common_pb2.TopicPartition(topic=TOPIC, partition=p) for p in (0, 2)],
                positions=[
                    log_pb2.FetchPosition(topic=TOPIC, partition=p, fetch_offset=0) for p in (2, 3)
                ],
            )
        )
        await settle()
        assert not client._reader.done()
        assert sorted(proxy._positions) == [(TOPIC, 1), (TOPIC, 2), (TOPIC, 3)]
        assert [r.positions[0].partition for r in brokers.current(3).sent if r.positions] == [3]
        await client.close()

    asyncio.run(scenario())
