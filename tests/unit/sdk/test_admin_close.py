"""A closed client raises ClosedError ("this client is closed"), nothing
else: an admin call running when close() is called, or made after it, from
the asyncio and the blocking AdminClient; and the Metadata of a closed
Cluster, at once. Against an in-process stand-in broker over real gRPC on
loopback whose DescribeConfigs waits until the test releases it.

The old code raised asyncio.CancelledError from the running async call (its
channel closed under it), concurrent.futures.CancelledError from the
blocking one, and BrokerNotAvailableError("the client is closed"), a
retriable error, from a group call after close(); Cluster.topic() on a
closed cluster retried that until its timeout."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from functools import partial

import grpc
import grpc.aio
import pytest
from tidelog import AdminClient, AsyncAdminClient
from tidelog._connection import Cluster
from tidelog.config import AdminConfig
from tidelog.errors import ClosedError
from tidelog.v1 import admin_pb2, admin_pb2_grpc

from tests.support.in_process_server import serving

pytestmark = pytest.mark.timeout(60)

#: Generous: everything here happens at once; this only bounds a broken test.
DEADLINE_S = 30


class WaitingAdmin(admin_pb2_grpc.AdminServicer):
    """A broker whose DescribeConfigs answers once `release` is set."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()

    async def DescribeConfigs(
        self, request: admin_pb2.DescribeConfigsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeConfigsResponse:
        self.arrived.set()
        await self.release.wait()
        return admin_pb2.DescribeConfigsResponse()


def test_an_async_admin_call_running_at_close_raises_closed_error() -> None:
    async def scenario() -> None:
        broker = WaitingAdmin()
        async with serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, broker)) as address:
            admin = AsyncAdminClient(address)
            try:
                async with asyncio.timeout(DEADLINE_S):
                    # The caller's own cancel is still a CancelledError.
                    call = asyncio.ensure_future(admin.describe_configs(["t"]))
                    await broker.arrived.wait()
                    call.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await call

                    broker.arrived.clear()
                    call = asyncio.ensure_future(admin.describe_configs(["t"]))
                    await broker.arrived.wait()
                    await admin.close()
                    with pytest.raises(ClosedError, match="closed during the call"):
                        await call
                    # Made after close(): a broker call, a coordinator call.
                    with pytest.raises(ClosedError):
                        await admin.describe_configs(["t"])
                    with pytest.raises(ClosedError):
                        await admin.list_consumer_groups()
                    # The cluster call, and one its security base class adds.
                    with pytest.raises(ClosedError, match="the admin client is closed"):
                        await admin.describe_cluster()
                    with pytest.raises(ClosedError, match="the admin client is closed"):
                        await admin.describe_acls()
            finally:
                broker.release.set()
                await admin.close()

    asyncio.run(scenario())


@contextmanager
def serving_in_thread(servicer: WaitingAdmin) -> Iterator[tuple[str, asyncio.AbstractEventLoop]]:
    """The stand-in served from a loop of its own thread (the test's thread
    blocks in AdminClient calls): its address and loop, for the block."""
    loop = asyncio.new_event_loop()
    address: Future[str] = Future()
    stop = asyncio.Event()

    async def serve() -> None:
        async with serving(partial(admin_pb2_grpc.add_AdminServicer_to_server, servicer)) as at:
            address.set_result(at)
            await stop.wait()
            servicer.release.set()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    thread.start()
    try:
        yield address.result(DEADLINE_S), loop
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(DEADLINE_S)
        loop.close()


def test_a_blocking_admin_call_running_at_close_raises_closed_error() -> None:
    broker = WaitingAdmin()
    with serving_in_thread(broker) as (address, loop):
        admin = AdminClient(address)
        try:
            raised: Future[BaseException | None] = Future()

            def describe() -> None:
                try:
                    admin.describe_configs(["t"])
                    raised.set_result(None)
                except BaseException as exc:
                    raised.set_result(exc)

            caller = threading.Thread(target=describe)
            caller.start()
            arrived = asyncio.run_coroutine_threadsafe(broker.arrived.wait(), loop)
            arrived.result(DEADLINE_S)
            admin.close()
            caller.join(DEADLINE_S)
            assert isinstance(raised.result(DEADLINE_S), ClosedError)
            with pytest.raises(ClosedError):
                admin.describe_configs(["t"])
        finally:
            admin.close()


def test_a_closed_cluster_raises_closed_error_at_once() -> None:
    async def scenario() -> None:
        # Nothing needs to listen there: a closed cluster calls nobody.
        cluster = Cluster(AdminConfig(bootstrap_servers="127.0.0.1:1"))
        await cluster.close()
        with pytest.raises(ClosedError):
            cluster.channel("127.0.0.1:1")
        # Not retried as a broker outage until the timeout.
        async with asyncio.timeout(DEADLINE_S):
            with pytest.raises(ClosedError):
                await cluster.topic("t", timeout_s=2 * DEADLINE_S)

    asyncio.run(scenario())
