"""A client that pipelines more produce requests than the gateway lets a
stream owe answers for (`max_pending_produce`, 4 here), without reading
any answer, gets every answer and then the end of its stream once it reads:
the refusal of a bad request it sent last, or the stream's normal end after
its half-close. Log Produce and Records Produce alike.

The end of the reading went through the queue of owed answers as a sentinel
put without waiting, and was dropped when the queue was full: the stream
answered what it owed and then waited, holding its budgets, until the
client gave up (here: the deadline). To have the queue full when the
gateway reads the last request, a broker is frozen (SIGSTOP) while the
client writes, so that the first answer is owed until it thaws while the
gateway has every other request at hand: the partition's leader for
Records (whose producer holds the records meanwhile), a follower of an
acks=all partition for Log (whose requests the gateway forwards to the
leader at once).

The real gateway (GatewayServer with its limit lowered) runs in the test's
process, on an event loop of its own in a thread, in front of the module's
real cluster; the client speaks to it with the generated stubs over real
gRPC, as a client in another language does.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import grpc
import grpc.aio
import pytest
from tidelog import AdminClient, NewTopic
from tidelog.records import encode_batch
from tidelog.v1 import log_pb2, log_pb2_grpc, records_pb2, records_pb2_grpc
from tidelog_gateway.config import GatewayConfig
from tidelog_gateway.server import GatewayServer

from tests.support.cluster import ClusterProcesses

pytestmark = pytest.mark.timeout(180)

MAX_PENDING = 4
#: Requests pipelined before the last one: one the gateway's writer waits
#: on, and the limit's worth owed behind it.
PIPELINED = MAX_PENDING + 1
#: How long the leader stays frozen while the gateway reads the requests
#: (not a bound on anything: the assertions hold however it goes).
FROZEN_S = 1.5
#: Generous: bounds a stream that never ends (the bug), not a speed.
DEADLINE_S = 30


@pytest.fixture(scope="module")
def gateway_address(cluster: ClusterProcesses) -> Iterator[str]:
    """A GatewayServer owing at most MAX_PENDING answers per stream, served
    from a thread of its own until the module's tests are done."""
    loop = asyncio.new_event_loop()
    gateway = GatewayServer(
        GatewayConfig(
            listen_address="127.0.0.1:0",
            etcd_endpoint=cluster.etcd.endpoint,
            etcd_prefix=cluster.prefix,
            max_pending_produce=MAX_PENDING,
        )
    )
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(gateway.start(), loop).result(DEADLINE_S)
        yield f"127.0.0.1:{gateway.bound_port}"
        asyncio.run_coroutine_threadsafe(gateway.stop(), loop).result(DEADLINE_S)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(DEADLINE_S)
        loop.close()


def broker_to_freeze(cluster: ClusterProcesses, topic: str, replicas: int) -> int:
    """Create `topic` (one partition, `replicas` replicas): the PID of its
    leader (one replica) or of a follower (more)."""
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, replicas)])
        (description,) = admin.describe_topics([topic])
    (partition,) = description.partitions
    followers = [b for b in partition.replicas if b != partition.leader]
    chosen = followers[0] if followers else partition.leader
    return next(b.pid for b in cluster.brokers if b.broker_id == chosen)


async def with_frozen(pid: int, write: Callable[[], Awaitable[None]]) -> None:
    """`write` while the process `pid` is frozen, and a while after, so that
    the gateway reads what was written while its first answer is owed."""
    os.kill(pid, signal.SIGSTOP)
    try:
        await write()
        await asyncio.sleep(FROZEN_S)
    finally:
        os.kill(pid, signal.SIGCONT)


async def answers_then_end(call: AsyncIterator[object]) -> tuple[list[object], object]:
    """Every answer of the stream, then how it ended (None: normally)."""
    answers: list[object] = []
    try:
        async for answer in call:
            answers.append(answer)
    except grpc.aio.AioRpcError as exc:
        return answers, exc
    return answers, None


def produce_request(topic: str, n: int, acks: int = -1) -> log_pb2.ProduceRequest:
    return log_pb2.ProduceRequest(
        correlation_id=n,
        acks=acks,
        # Past the freeze: answered once the follower has thawed, or with
        # REQUEST_TIMED_OUT, either way an answer.
        timeout_ms=3000,
        partitions=[log_pb2.PartitionRecords(topic=topic, records=encode_batch([b"%d" % n]))],
    )


async def until_answered(stub: log_pb2_grpc.LogStub, topic: str) -> None:
    """Produce to `topic` through the gateway until it answers without an
    error: the gateway knows the topic and its leader."""
    for _ in range(DEADLINE_S * 10):
        call = stub.Produce(timeout=DEADLINE_S)
        await call.write(produce_request(topic, -1))
        await call.done_writing()
        (answer,) = [a async for a in call]
        if not any(p.error.code for p in answer.partitions):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the gateway never took a produce request to {topic}")


def records_request(topic: str, n: int) -> records_pb2.RecordsProduceRequest:
    record = records_pb2.ProduceRecord(topic=topic, partition=0, value_text=str(n))
    return records_pb2.RecordsProduceRequest(correlation_id=n, records=[record])


async def until_recorded(stub: records_pb2_grpc.RecordsStub, topic: str) -> None:
    """`until_answered` for the Records service."""
    for _ in range(DEADLINE_S * 10):
        call = stub.Produce(timeout=DEADLINE_S)
        await call.write(records_request(topic, -1))
        await call.done_writing()
        (answer,) = [a async for a in call]
        if not any(r.error.code for r in answer.results):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the gateway never took a records request to {topic}")


@pytest.mark.parametrize("ending", ["refused", "half-closed"])
def test_log_produce_pipelined_past_the_limit_ends(
    cluster: ClusterProcesses, gateway_address: str, names: tuple[str, str], ending: str
) -> None:
    topic, _ = names
    pid = broker_to_freeze(cluster, topic, 3)

    async def scenario() -> tuple[list[object], object]:
        async with grpc.aio.insecure_channel(gateway_address) as channel:
            stub = log_pb2_grpc.LogStub(channel)
            await until_answered(stub, topic)
            call = stub.Produce(timeout=DEADLINE_S)

            async def write() -> None:
                # Everything written before a single answer is read.
                for n in range(PIPELINED):
                    await call.write(produce_request(topic, n))
                if ending == "refused":
                    await call.write(produce_request(topic, PIPELINED, acks=5))
                else:
                    await call.done_writing()

            await with_frozen(pid, write)
            return await answers_then_end(call)

    answers, end = asyncio.run(scenario())
    assert [a.correlation_id for a in answers] == list(range(PIPELINED))  # type: ignore[attr-defined]
    if ending == "refused":
        assert isinstance(end, grpc.aio.AioRpcError), end
        assert end.code() == grpc.StatusCode.INVALID_ARGUMENT, end
        assert "acks must be -1 (all), 0 or 1, got 5" in (end.details() or ""), end
    else:
        assert end is None, end


@pytest.mark.parametrize("ending", ["refused", "half-closed"])
def test_records_produce_pipelined_past_the_limit_ends(
    cluster: ClusterProcesses, gateway_address: str, names: tuple[str, str], ending: str
) -> None:
    topic, _ = names
    pid = broker_to_freeze(cluster, topic, 1)

    async def scenario() -> tuple[list[object], object]:
        async with grpc.aio.insecure_channel(gateway_address) as channel:
            stub = records_pb2_grpc.RecordsStub(channel)
            await until_recorded(stub, topic)
            call = stub.Produce(timeout=DEADLINE_S)

            async def write() -> None:
                for n in range(PIPELINED):
                    await call.write(records_request(topic, n))
                if ending == "refused":
                    too_many = [records_pb2.ProduceRecord(topic=topic, partition=0)] * 10_001
                    await call.write(records_pb2.RecordsProduceRequest(records=too_many))
                else:
                    await call.done_writing()

            await with_frozen(pid, write)
            return await answers_then_end(call)

    answers, end = asyncio.run(scenario())
    assert [a.correlation_id for a in answers] == list(range(PIPELINED))  # type: ignore[attr-defined]
    assert all(not r.error.code for a in answers for r in a.results)  # type: ignore[attr-defined]
    if ending == "refused":
        assert isinstance(end, grpc.aio.AioRpcError), end
        assert end.code() == grpc.StatusCode.INVALID_ARGUMENT, end
        assert "over the limit of 10000" in (end.details() or ""), end
    else:
        assert end is None, end
