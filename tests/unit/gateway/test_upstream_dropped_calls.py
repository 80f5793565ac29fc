"""What the gateway's clients see when a broker or coordinator behind it
drops their call, is unreachable or runs out of time: a retriable answer
that names the upstream and says what happened, worded the same way on
every path (Log Produce, Fetch and ListOffsets to a broker; unary calls to
a coordinator; Metadata's auto-creation asked of a broker). A broker's own
refusal keeps its meaning.

The real gateway (GatewayServer, its ClusterView on a real etcd) runs in
the test's process in front of in-process stand-ins over real gRPC on
loopback, registered in etcd as the cluster's broker and coordinators.
A stand-in drops a call as gRPC drops one its grpc.aio server has no room
to queue (past grpc.server.max_pending_requests): CANCELLED, details
"CANCELLED", no Tidelog error code. The client calls the gateway with the
generated stubs alone, as a client in another language does.

The gateway answered a dropped produce stream "<address>: CANCELLED:
CANCELLED", a dropped fetch stream likewise, a dropped ListOffsets with the
status name only, and passed a coordinator's DEADLINE_EXCEEDED back as
"Deadline Exceeded", naming no one; it ended a Heartbeat stream whose
coordinator went away after answering with UNAVAILABLE alone, without the
COORDINATOR_NOT_AVAILABLE code its unary calls carry, and likewise when
it stopped, and ended one no coordinator took without the "; retry" its
unary calls end with. A fetch stream
dropped while the gateway was writing to it was answered "failed the call
(INTERNAL: Internal error from Core)": grpc.aio's word for the status it
lost, passed on as the broker's."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial

import grpc
import grpc.aio
import pytest
from tidelog.errors import ERROR_CODE_METADATA_KEY
from tidelog.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    group_pb2,
    group_pb2_grpc,
    log_pb2,
    log_pb2_grpc,
)
from tidelog_gateway.config import GATEWAY_NODE_ID, GatewayConfig
from tidelog_gateway.server import GatewayServer
from tidelog_server.etcd import connect
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import (
    BrokerRegistration,
    CoordinatorRegistration,
    PartitionState,
    TopicAssignment,
)

from tests.support.etcd import EtcdProcess
from tests.support.in_process_server import drop_call, serving
from tests.support.ports import free_port

pytestmark = pytest.mark.timeout(120)

TOPIC = "t"
#: Generous: the stand-ins answer at once; this only bounds a broken test.
DEADLINE_S = 30
#: The gateway's deadline on a forwarded unary call, short so that a
#: coordinator that never answers runs it out.
FORWARD_TIMEOUT_S = 1.0
DROPPED = "dropped the call (CANCELLED: overloaded or stopping)"


class DroppingBroker(log_pb2_grpc.LogServicer):
    """A leader that drops every Produce, Fetch and ListOffsets call.

    It drops a Fetch stream once the gateway has granted it credit (after
    which the gateway writes nothing until the broker answers), or, with
    `fetch_drop_at_once`, as soon as the gateway's first request has come,
    while the gateway is still writing the rest."""

    def __init__(self, fetch_drop_at_once: bool = False) -> None:
        self.produce_calls = 0
        self.fetch_drop_at_once = fetch_drop_at_once

    async def Produce(
        self,
        request_iterator: AsyncIterator[log_pb2.ProduceRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[log_pb2.ProduceResponse]:
        self.produce_calls += 1
        await drop_call(context)
        yield log_pb2.ProduceResponse()  # pragma: no cover (a generator)

    async def Fetch(
        self,
        request_iterator: AsyncIterator[log_pb2.FetchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[log_pb2.FetchResponse]:
        # Dropped while a write of the gateway's is in flight, the call ends
        # INTERNAL "Internal error from Core" on the gateway's side, its
        # status lost (tidelog.errors.is_status_lost): the
        # gateway then cannot tell that it was CANCELLED.
        async for request in request_iterator:
            if self.fetch_drop_at_once or request.credit_bytes:
                break
        await drop_call(context)
        yield log_pb2.FetchResponse()  # pragma: no cover (a generator)

    async def ListOffsets(
        self, request: log_pb2.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.ListOffsetsResponse:
        await drop_call(context)
        raise AssertionError("abort returned")


class Coordinator(admin_pb2_grpc.AdminServicer):
    """A coordinator replica whose DescribeConfigs `drops` the call,
    `hangs` (never answers), or answers with one topic named after it."""

    def __init__(self, name: str, behaviour: str = "answers") -> None:
        self.name = name
        self.behaviour = behaviour
        self.calls = 0

    async def DescribeConfigs(
        self, request: admin_pb2.DescribeConfigsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeConfigsResponse:
        self.calls += 1
        if self.behaviour == "drops":
            await drop_call(context)
        if self.behaviour == "hangs":
            await asyncio.Event().wait()  # until the gateway's deadline cancels it
        return admin_pb2.DescribeConfigsResponse(topics=[admin_pb2.TopicConfigs(name=self.name)])


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


@contextlib.asynccontextmanager
async def gateway_in_front_of(
    etcd: EtcdProcess,
    broker: str,
    coordinators: Sequence[str] = (),
    other_brokers: Sequence[str] = (),
    partitions: int = 1,
) -> AsyncIterator[grpc.aio.Channel]:
    """A channel to a gateway for a cluster whose broker 0 (at `broker`)
    leads TOPIC's `partitions` partitions, whose brokers 1, 2, ... are at
    `other_brokers` and whose coordinator replicas are at `coordinators`, in
    that order: their records written to etcd under a fresh prefix, as the
    brokers and the coordinators write them."""
    async with serving_gateway(etcd, broker, coordinators, other_brokers, partitions) as (
        _gateway,
        channel,
    ):
        yield channel


@contextlib.asynccontextmanager
async def serving_gateway(
    etcd: EtcdProcess,
    broker: str,
    coordinators: Sequence[str] = (),
    other_brokers: Sequence[str] = (),
    partitions: int = 1,
) -> AsyncIterator[tuple[GatewayServer, grpc.aio.Channel]]:
    """`gateway_in_front_of`, with the gateway itself, for a test that stops
    it (stopped after the block unless the test did)."""
    prefix = f"/gw-{uuid.uuid4().hex}"
    keys = Keys(prefix)
    client = connect(etcd.endpoint)
    try:
        for broker_id, address in enumerate([broker, *other_brokers]):
            registration = BrokerRegistration(broker_id, "127.0.0.1", _port(address))
            await client.put(keys.broker(broker_id), registration.encode())
        for n, address in enumerate(coordinators):
            registration = CoordinatorRegistration(f"c{n}", "127.0.0.1", _port(address))
            await client.put(keys.coordinator(f"c{n}"), registration.encode())
        topic = TopicAssignment(TOPIC, uuid.uuid4().hex, ((0,),) * partitions, {})
        await client.put(keys.topic(TOPIC), topic.encode())
        state = PartitionState(leader=0, leader_epoch=1, isr=(0,))
        for partition in range(partitions):
            await client.put(keys.partition_state(TOPIC, partition), state.encode())
    finally:
        await client.close()
    gateway = GatewayServer(
        GatewayConfig(
            listen_address="127.0.0.1:0",
            etcd_endpoint=etcd.endpoint,
            etcd_prefix=prefix,
            forward_timeout_s=FORWARD_TIMEOUT_S,
        )
    )
    await gateway.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gateway.bound_port}")
    try:
        yield gateway, channel
    finally:
        await channel.close(None)
        if not gateway.draining.is_set():
            await gateway.stop()


def unreachable() -> str:
    """An address nobody listens on (a broker or coordinator that is down)."""
    return f"127.0.0.1:{free_port()}"


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(DEADLINE_S * 2):
            await scenario()

    asyncio.run(bounded())


def produce_request() -> log_pb2.ProduceRequest:
    request = log_pb2.ProduceRequest(correlation_id=1, acks=1, timeout_ms=5000)
    request.partitions.add(topic=TOPIC, partition=0, records=b"batch bytes, unread")
    return request


async def produce_through(channel: grpc.aio.Channel) -> log_pb2.PartitionProduceResult:
    call = log_pb2_grpc.LogStub(channel).Produce()
    try:
        await call.write(produce_request())
        response: log_pb2.ProduceResponse = await call.read()
        return response.partitions[0]
    finally:
        call.cancel()


@pytest.mark.parametrize("leader", ["drops", "down"])
def test_a_produce_stream_the_leader_lost_is_retriable_naming_it(
    etcd: EtcdProcess, leader: str
) -> None:
    async def scenario() -> None:
        broker = DroppingBroker()
        async with contextlib.AsyncExitStack() as stack:
            if leader == "drops":
                address = await stack.enter_async_context(
                    serving(partial(log_pb2_grpc.add_LogServicer_to_server, broker))
                )
                happened = DROPPED
            else:
                address = unreachable()
                happened = "is unavailable (UNAVAILABLE: "
            channel = await stack.enter_async_context(gateway_in_front_of(etcd, address))
            result = await produce_through(channel)
        assert result.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER, result
        assert result.error.message.startswith(f"broker {address} {happened}"), result.error
        assert "the records may or may not be written: retry" in result.error.message
        assert result.base_offset == -1
        if leader == "drops":
            # Answered, not sent again: the broker may have appended it.
            assert broker.produce_calls == 1

    run(scenario)


def test_a_fetch_stream_the_leader_dropped_is_retriable_naming_it(etcd: EtcdProcess) -> None:
    async def scenario() -> None:
        broker = DroppingBroker()
        async with (
            serving(partial(log_pb2_grpc.add_LogServicer_to_server, broker)) as address,
            gateway_in_front_of(etcd, address) as channel,
        ):
            call = log_pb2_grpc.LogStub(channel).Fetch()
            try:
                await call.write(
                    log_pb2.FetchRequest(
                        positions=[log_pb2.FetchPosition(topic=TOPIC, partition=0, fetch_offset=7)],
                        credit_bytes=1 << 20,
                    )
                )
                response: log_pb2.FetchResponse = await call.read()
            finally:
                call.cancel()
        data = response.partitions[0]
        assert data.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER, data
        assert data.error.message == (
            f"broker {address} {DROPPED}; the gateway lost its fetch stream to the leader: "
            "send the position again"
        )
        assert (data.fetch_offset, data.next_offset) == (7, 7)

    run(scenario)


def test_a_fetch_stream_dropped_while_the_gateway_writes_is_retriable_naming_it(
    etcd: EtcdProcess,
) -> None:
    # One position per client request, so one request per position to the
    # leader: the gateway is still writing them when the leader drops the
    # stream after the first. The gateway answered "broker ... failed the
    # call (INTERNAL: Internal error from Core)", as if the broker had
    # failed, nearly every time.
    partitions = 500

    async def scenario() -> None:
        broker = DroppingBroker(fetch_drop_at_once=True)
        async with (
            serving(partial(log_pb2_grpc.add_LogServicer_to_server, broker)) as address,
            gateway_in_front_of(etcd, address, partitions=partitions) as channel,
        ):
            call = log_pb2_grpc.LogStub(channel).Fetch()
            answered: dict[int, log_pb2.PartitionData] = {}
            try:
                # (The gateway forwards the positions of one request in one.)
                for p in range(partitions):
                    await call.write(
                        log_pb2.FetchRequest(
                            positions=[
                                log_pb2.FetchPosition(topic=TOPIC, partition=p, fetch_offset=7)
                            ],
                            credit_bytes=(1 << 20) if p == 0 else 0,
                        )
                    )
                while len(answered) < partitions:
                    response: log_pb2.FetchResponse = await call.read()
                    answered.update((data.partition, data) for data in response.partitions)
            finally:
                call.cancel()
        lost = "while a request was being written to it (its status was lost: INTERNAL: "
        for data in answered.values():
            assert data.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER, data
            happened = data.error.message.removeprefix(f"broker {address} dropped the call ")
            assert happened.startswith(("(CANCELLED: overloaded or stopping)", lost)), data
            assert happened.endswith(
                "; the gateway lost its fetch stream to the leader: send the position again"
            ), data
            assert (data.fetch_offset, data.next_offset) == (7, 7)

    run(scenario)


def test_list_offsets_the_leader_dropped_is_retriable_naming_it(etcd: EtcdProcess) -> None:
    async def scenario() -> None:
        broker = DroppingBroker()
        async with (
            serving(partial(log_pb2_grpc.add_LogServicer_to_server, broker)) as address,
            gateway_in_front_of(etcd, address) as channel,
        ):
            request = log_pb2.ListOffsetsRequest()
            request.partitions.add(topic=TOPIC, partition=0, timestamp_ms=-1)
            response = await log_pb2_grpc.LogStub(channel).ListOffsets(request, timeout=DEADLINE_S)
        result = response.partitions[0]
        assert result.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER, result
        assert result.error.message == f"broker {address} {DROPPED}; retry"

    run(scenario)


class RefusingBroker(log_pb2_grpc.LogServicer):
    """A leader that refuses every ListOffsets whole, as a broker refuses an
    invalid request: INVALID_ARGUMENT with its error code."""

    async def ListOffsets(
        self, request: log_pb2.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.ListOffsetsResponse:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            "the request is invalid for a reason of the broker's",
            trailing_metadata=((ERROR_CODE_METADATA_KEY, "INVALID_REQUEST"),),
        )
        raise AssertionError("abort returned")


def test_list_offsets_the_leader_refused_keeps_its_meaning(etcd: EtcdProcess) -> None:
    # Not NOT_LEADER_OR_FOLLOWER "retry": a client would repeat a request the
    # leader will refuse again, for ever.
    async def scenario() -> None:
        async with (
            serving(partial(log_pb2_grpc.add_LogServicer_to_server, RefusingBroker())) as address,
            gateway_in_front_of(etcd, address) as channel,
        ):
            request = log_pb2.ListOffsetsRequest()
            request.partitions.add(topic=TOPIC, partition=0, timestamp_ms=-1)
            response = await log_pb2_grpc.LogStub(channel).ListOffsets(request, timeout=DEADLINE_S)
        result = response.partitions[0]
        assert result.error.code == common_pb2.INVALID_REQUEST, result
        assert result.error.message == (
            f"broker {address} refused the request: "
            "the request is invalid for a reason of the broker's"
        )
        assert (result.offset, result.timestamp_ms) == (-1, -1)

    run(scenario)


async def describe_configs(channel: grpc.aio.Channel) -> admin_pb2.DescribeConfigsResponse:
    answer: admin_pb2.DescribeConfigsResponse = await admin_pb2_grpc.AdminStub(
        channel
    ).DescribeConfigs(admin_pb2.DescribeConfigsRequest(), timeout=DEADLINE_S)
    return answer


def coordinator_not_available(exc: grpc.aio.AioRpcError) -> bool:
    trailing = exc.trailing_metadata() or ()
    return exc.code() == grpc.StatusCode.UNAVAILABLE and (
        ERROR_CODE_METADATA_KEY,
        "COORDINATOR_NOT_AVAILABLE",
    ) in tuple(trailing)


def test_a_coordinator_that_dropped_the_call_is_moved_on_from(etcd: EtcdProcess) -> None:
    async def scenario() -> None:
        first, second = Coordinator("first", "drops"), Coordinator("second")
        async with (
            serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, first)) as a1,
            serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, second)) as a2,
            gateway_in_front_of(etcd, unreachable(), [a1, a2]) as channel,
        ):
            answer = await describe_configs(channel)
        assert [t.name for t in answer.topics] == ["second"]
        assert (first.calls, second.calls) == (1, 1)

    run(scenario)


@pytest.mark.parametrize("coordinators", ["drop", "are down"])
def test_no_coordinator_answering_is_coordinator_not_available_naming_the_last(
    etcd: EtcdProcess, coordinators: str
) -> None:
    async def scenario() -> None:
        replica = Coordinator("only", "drops")
        async with contextlib.AsyncExitStack() as stack:
            if coordinators == "drop":
                addresses = [
                    await stack.enter_async_context(
                        serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, replica))
                    )
                ]
                happened = DROPPED
            else:
                addresses = [unreachable(), unreachable()]
                happened = "is unavailable (UNAVAILABLE: "
            channel = await stack.enter_async_context(
                gateway_in_front_of(etcd, unreachable(), addresses)
            )
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await describe_configs(channel)
        assert coordinator_not_available(raised.value), raised.value
        assert (raised.value.details() or "").startswith(
            f"cannot forward DescribeConfigs to a coordinator: coordinator {addresses[-1]} "
            f"{happened}"
        ), raised.value.details()
        assert (raised.value.details() or "").endswith("; retry")

    run(scenario)


def test_a_coordinator_past_the_deadline_is_named_and_not_asked_again(
    etcd: EtcdProcess,
) -> None:
    async def scenario() -> None:
        first, second = Coordinator("first", "hangs"), Coordinator("second")
        async with (
            serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, first)) as a1,
            serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, second)) as a2,
            gateway_in_front_of(etcd, unreachable(), [a1, a2]) as channel,
        ):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await describe_configs(channel)
        assert coordinator_not_available(raised.value), raised.value
        assert raised.value.details() == (
            f"cannot forward DescribeConfigs to a coordinator: coordinator {a1} did not "
            "answer in time (DEADLINE_EXCEEDED); retry"
        )
        # The first may still carry the call out: the second is not asked.
        assert (first.calls, second.calls) == (1, 0)

    run(scenario)


class RefusingLeader(log_pb2_grpc.LogServicer):
    """A broker that `drops`, `refuses` (as RefusingBroker) or `hangs`
    (never answers) every Metadata, counting them."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.calls = 0

    async def _fail(self, context: grpc.aio.ServicerContext) -> None:
        self.calls += 1
        if self.behaviour == "drops":
            await drop_call(context)
        if self.behaviour == "hangs":
            await asyncio.Event().wait()  # until the gateway's deadline cancels it
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            "the request is invalid for a reason of the broker's",
            trailing_metadata=((ERROR_CODE_METADATA_KEY, "INVALID_REQUEST"),),
        )

    async def Metadata(
        self, request: log_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.MetadataResponse:
        await self._fail(context)
        raise AssertionError("abort returned")


def _metadata_for(names: Sequence[str]) -> log_pb2.MetadataRequest:
    return log_pb2.MetadataRequest(topics=names, allow_auto_topic_creation=True)


@pytest.mark.parametrize("broker", ["drops", "down", "refuses", "hangs"])
def test_a_topic_the_broker_failed_to_auto_create_says_why(etcd: EtcdProcess, broker: str) -> None:
    # The gateway answered "topic 'new' does not exist", as if nothing had
    # been tried.
    async def scenario() -> None:
        async with contextlib.AsyncExitStack() as stack:
            if broker == "down":
                address = unreachable()
            else:
                address = await stack.enter_async_context(
                    serving(partial(log_pb2_grpc.add_LogServicer_to_server, RefusingLeader(broker)))
                )
            channel = await stack.enter_async_context(gateway_in_front_of(etcd, address))
            response = await log_pb2_grpc.LogStub(channel).Metadata(
                _metadata_for([TOPIC, "new"]), timeout=DEADLINE_S
            )
        known, new = response.topics
        happened = {
            "drops": f"broker {address} {DROPPED}; retry",
            "down": f"broker {address} is unavailable (UNAVAILABLE: ",
            "refuses": f"broker {address} refused the request: "
            "the request is invalid for a reason of the broker's",
            "hangs": f"broker {address} did not answer in time (DEADLINE_EXCEEDED); retry",
        }[broker]
        code = (
            common_pb2.INVALID_REQUEST
            if broker == "refuses"
            else common_pb2.UNKNOWN_TOPIC_OR_PARTITION
        )
        assert new.error.code == code, new
        assert new.error.message.startswith(
            f"topic 'new' does not exist and was not auto-created: {happened}"
        ), new.error.message
        # The known topic is described as ever.
        assert not known.HasField("error"), known
        assert [(p.partition, p.leader_id) for p in known.partitions] == [(0, GATEWAY_NODE_ID)]

    run(scenario)


def test_auto_creation_past_the_deadline_is_not_asked_of_another_broker(
    etcd: EtcdProcess,
) -> None:
    # The gateway asked the next broker too, while the first may still be
    # creating the topic, and answered "does not exist" naming neither.
    async def scenario() -> None:
        first, second = RefusingLeader("hangs"), RefusingLeader("drops")
        async with (
            serving(partial(log_pb2_grpc.add_LogServicer_to_server, first)) as a0,
            serving(partial(log_pb2_grpc.add_LogServicer_to_server, second)) as a1,
            gateway_in_front_of(etcd, a0, other_brokers=[a1]) as channel,
        ):
            response = await log_pb2_grpc.LogStub(channel).Metadata(
                _metadata_for(["new"]), timeout=DEADLINE_S
            )
        (new,) = response.topics
        assert new.error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION, new
        assert new.error.message == (
            f"topic 'new' does not exist and was not auto-created: broker {a0} did not "
            "answer in time (DEADLINE_EXCEEDED); retry"
        )
        assert (first.calls, second.calls) == (1, 0)

    run(scenario)


class HeartbeatCoordinator(group_pb2_grpc.GroupServicer):
    """A coordinator replica that answers each heartbeat of a stream, and
    after the first answer either `drops` the stream at the next heartbeat
    or waits (`stops`: the test stops the server under it)."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.answered = asyncio.Event()

    async def Heartbeat(
        self,
        request_iterator: AsyncIterator[group_pb2.GroupHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[group_pb2.GroupHeartbeatResponse]:
        async for _request in request_iterator:
            if self.answered.is_set() and self.behaviour == "drops":
                await drop_call(context)
            yield group_pb2.GroupHeartbeatResponse(
                member_id="m1", member_epoch=1, heartbeat_interval_ms=1000
            )
            self.answered.set()


@pytest.mark.parametrize("coordinator", ["drops", "stops"])
def test_a_heartbeat_stream_its_coordinator_lost_midway_is_coordinator_not_available(
    etcd: EtcdProcess, coordinator: str
) -> None:
    # The gateway ended it UNAVAILABLE without the error code: a client in
    # another language could not tell it from the gateway itself failing.
    async def scenario() -> None:
        replica = HeartbeatCoordinator(coordinator)
        async with contextlib.AsyncExitStack() as stack:
            upstream = contextlib.AsyncExitStack()
            stack.push_async_callback(upstream.aclose)
            address = await upstream.enter_async_context(
                serving(partial(group_pb2_grpc.add_GroupServicer_to_server, replica))
            )
            channel = await stack.enter_async_context(
                gateway_in_front_of(etcd, unreachable(), [address])
            )
            call = group_pb2_grpc.GroupStub(channel).Heartbeat(timeout=DEADLINE_S)
            stack.callback(call.cancel)
            await call.write(group_pb2.GroupHeartbeatRequest(group_id="g", member_epoch=0))
            first: group_pb2.GroupHeartbeatResponse = await call.read()
            assert first.member_id == "m1"
            if coordinator == "drops":
                await call.write(group_pb2.GroupHeartbeatRequest(group_id="g", member_id="m1"))
            else:
                await upstream.aclose()
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call.read()
        assert coordinator_not_available(raised.value), raised.value
        details = raised.value.details() or ""
        assert details.startswith(
            f"cannot relay the heartbeat to a coordinator: coordinator {address} "
        ), details
        if coordinator == "drops":
            assert details == (
                f"cannot relay the heartbeat to a coordinator: coordinator {address} "
                f"{DROPPED}; re-attach"
            )
        assert details.endswith("; re-attach")

    run(scenario)


@pytest.mark.parametrize("coordinators", ["none is registered", "are down"])
def test_a_heartbeat_no_coordinator_answers_is_coordinator_not_available_to_retry(
    etcd: EtcdProcess, coordinators: str
) -> None:
    # It ended "...: coordinator <address> is unavailable (...)", without
    # the "; retry" the forwarded unary calls end with.
    async def scenario() -> None:
        addresses = [] if coordinators == "none is registered" else [unreachable(), unreachable()]
        async with gateway_in_front_of(etcd, unreachable(), addresses) as channel:
            call = group_pb2_grpc.GroupStub(channel).Heartbeat(timeout=DEADLINE_S)
            await call.write(group_pb2.GroupHeartbeatRequest(group_id="g", member_epoch=0))
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call.read()
        assert coordinator_not_available(raised.value), raised.value
        details = raised.value.details() or ""
        happened = (
            "no coordinator is registered in etcd"
            if not addresses
            else f"coordinator {addresses[-1]} is unavailable (UNAVAILABLE: "
        )
        assert details.startswith(f"cannot relay the heartbeat to a coordinator: {happened}"), (
            details
        )
        assert details.endswith("; retry"), details

    run(scenario)


def test_a_heartbeat_stream_the_stopping_gateway_ends_is_coordinator_not_available(
    etcd: EtcdProcess,
) -> None:
    # The gateway ended it UNAVAILABLE without the error code, which a
    # client in another language reads to find its coordinator again.
    async def scenario() -> None:
        replica = HeartbeatCoordinator("stops")
        async with contextlib.AsyncExitStack() as stack:
            address = await stack.enter_async_context(
                serving(partial(group_pb2_grpc.add_GroupServicer_to_server, replica))
            )
            gateway, channel = await stack.enter_async_context(
                serving_gateway(etcd, unreachable(), [address])
            )
            call = group_pb2_grpc.GroupStub(channel).Heartbeat(timeout=DEADLINE_S)
            stack.callback(call.cancel)
            await call.write(group_pb2.GroupHeartbeatRequest(group_id="g", member_epoch=0))
            first: group_pb2.GroupHeartbeatResponse = await call.read()
            assert first.member_id == "m1"
            # As on SIGTERM: the gateway drains, then stops.
            stopping = asyncio.ensure_future(gateway.stop())
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call.read()
            await stopping
        assert coordinator_not_available(raised.value), raised.value
        assert raised.value.details() == (
            "the gateway is shutting down: re-attach through another gateway"
        )

    run(scenario)


class DescribingCoordinator(admin_pb2_grpc.AdminServicer):
    """A coordinator whose DescribeTopics answers TOPIC's placement, as a
    coordinator does (figures 0): partition 0 led by broker 0, partition 1
    by broker 1, partition 2 with no leader."""

    async def DescribeTopics(
        self, request: admin_pb2.DescribeTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeTopicsResponse:
        return admin_pb2.DescribeTopicsResponse(
            topics=[
                admin_pb2.TopicDescription(
                    name=TOPIC,
                    partitions=[
                        admin_pb2.PartitionDescription(
                            partition=p, leader_id=leader, replicas=[max(leader, 0)], isr=[]
                        )
                        for p, leader in enumerate((0, 1, -1))
                    ],
                )
            ]
        )


class FiguresLeader(admin_pb2_grpc.AdminServicer):
    """Broker `broker_id` answering DescribeTopics from "its own logs"
    (asked with tidelog-local): partition `partition` of TOPIC, end offset
    42; or, as `behaviour` says, dropping the call, refusing it
    (TOPIC_AUTHORIZATION_FAILED) or never answering."""

    def __init__(self, broker_id: int, partition: int, behaviour: str = "answers") -> None:
        self.broker_id = broker_id
        self.partition = partition
        self.behaviour = behaviour
        self.local_calls = 0

    async def DescribeTopics(
        self, request: admin_pb2.DescribeTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeTopicsResponse:
        metadata = context.invocation_metadata() or ()
        self.local_calls += any(key == "tidelog-local" for key, _ in metadata)
        if self.behaviour == "drops":
            await drop_call(context)
        if self.behaviour == "hangs":
            await asyncio.Event().wait()  # until the gateway's deadline cancels it
        if self.behaviour == "refuses":
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"not authorized to describe {TOPIC!r}",
                trailing_metadata=((ERROR_CODE_METADATA_KEY, "TOPIC_AUTHORIZATION_FAILED"),),
            )
        answer = admin_pb2.DescribeTopicsResponse()
        answer.topics.add(name=TOPIC).partitions.add(
            partition=self.partition,
            leader_id=self.broker_id,
            log_start_offset=2,
            log_end_offset=42,
            high_watermark=40,
            size_bytes=4096,
            segment_count=1,
        )
        return answer


@pytest.mark.parametrize("leader", ["drops", "down", "refuses", "hangs"])
def test_describe_topics_names_a_leader_that_could_not_tell(etcd: EtcdProcess, leader: str) -> None:
    # The gateway left such a partition's figures at 0, as if its log were
    # empty, and waited 5 s for a leader that never answers, whatever its
    # forwarding deadline.
    async def scenario() -> None:
        healthy = FiguresLeader(1, partition=1)
        async with contextlib.AsyncExitStack() as stack:

            async def serve(servicer: admin_pb2_grpc.AdminServicer) -> str:
                return await stack.enter_async_context(
                    serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, servicer))
                )

            address = (
                unreachable() if leader == "down" else await serve(FiguresLeader(0, 0, leader))
            )
            other = await serve(healthy)
            coordinator = await serve(DescribingCoordinator())
            channel = await stack.enter_async_context(
                gateway_in_front_of(etcd, address, [coordinator], other_brokers=[other])
            )
            # Generous, yet short of the 5 s the gateway waited for a leader
            # whatever its forwarding deadline (FORWARD_TIMEOUT_S, 1 s).
            response = await admin_pb2_grpc.AdminStub(channel).DescribeTopics(
                admin_pb2.DescribeTopicsRequest(names=[TOPIC]), timeout=4 * FORWARD_TIMEOUT_S
            )
        (topic,) = response.topics
        assert not topic.HasField("error"), topic
        failed, answered, leaderless = topic.partitions
        happened = {
            "drops": (common_pb2.NOT_LEADER_OR_FOLLOWER, f"{DROPPED}: "),
            "down": (common_pb2.NOT_LEADER_OR_FOLLOWER, "is unavailable (UNAVAILABLE: "),
            "refuses": (
                common_pb2.TOPIC_AUTHORIZATION_FAILED,
                "refused the call (TOPIC_AUTHORIZATION_FAILED: "
                f"not authorized to describe {TOPIC!r}): its log figures are unknown",
            ),
            "hangs": (
                common_pb2.REQUEST_TIMED_OUT,
                "did not answer in time (DEADLINE_EXCEEDED): its log figures are unknown; retry",
            ),
        }[leader]
        assert failed.error.code == happened[0], failed
        assert failed.error.message.startswith(
            f"{TOPIC}-0: leader broker 0 at {address} {happened[1]}"
        ), failed.error.message
        assert _figures(failed) == (-1, -1, -1, -1, -1)
        # The other leader's partition has its figures, and no error.
        assert not answered.HasField("error"), answered
        assert _figures(answered) == (2, 42, 40, 4096, 1)
        assert healthy.local_calls == 1
        assert leaderless.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER, leaderless
        assert leaderless.error.message == (
            f"{TOPIC}-2 has no leader right now (replicas 0): its log figures are unknown; retry"
        )
        assert _figures(leaderless) == (-1, -1, -1, -1, -1)

    run(scenario)


def _figures(p: admin_pb2.PartitionDescription) -> tuple[int, ...]:
    return (p.log_start_offset, p.log_end_offset, p.high_watermark, p.size_bytes, p.segment_count)
