"""A real broker's dropped calls reach the application as retriable errors
naming the broker, not as ClosedError.

gRPC keeps the calls a grpc.aio server has not taken yet in a backlog and
drops the excess with CANCELLED (details "CANCELLED"): at random between
grpc.server.max_pending_requests (1,000) and 3,000 waiting, all of them past
3,000. CALLS concurrent admin calls from one client put more than that on
the broker at once (here ~1/3 of them were dropped). Each dropped call
raises BrokerNotAvailableError (retriable) saying the server cancelled it,
and asking again succeeds; a call on the closed client raises ClosedError.

The SDK raised ClosedError ("the client is closed") for every dropped call."""

from __future__ import annotations

import asyncio

import pytest
from tidelog import AsyncAdminClient, NewTopic
from tidelog.errors import BrokerNotAvailableError, ClosedError

from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(240)

#: Over the hard limit of 3,000 calls waiting for the broker's loop.
CALLS = 5000
TOPIC = "t"
#: Generous: the whole flood took ~3 s here.
FLOOD_TIMEOUT_S = 120


def test_calls_the_broker_dropped_are_retriable_and_say_so(broker: BrokerProcess) -> None:
    async def flood() -> None:
        # A read the broker dropped is sent again (tidelog._admin_retry):
        # a backoff longer than the api timeout lets no resend happen, so
        # each drop surfaces as the error it decodes to.
        admin = AsyncAdminClient(
            broker.address,
            default_api_timeout_ms=FLOOD_TIMEOUT_S * 1000,
            retry_backoff_ms=10 * FLOOD_TIMEOUT_S * 1000,
        )
        try:
            await admin.create_topics([NewTopic(TOPIC, 1, 1)])
            async with asyncio.timeout(FLOOD_TIMEOUT_S):
                outcomes = await asyncio.gather(
                    *(admin.describe_configs([TOPIC]) for _ in range(CALLS)),
                    return_exceptions=True,
                )
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            # Without a drop this test would show nothing.
            assert failures, f"the broker dropped none of {CALLS} concurrent calls"
            for failure in failures:
                assert isinstance(failure, BrokerNotAvailableError), repr(failure)
                assert failure.retriable
                assert failure.message.startswith(
                    f"broker {broker.address} dropped the call (CANCELLED: overloaded or stopping)"
                ), failure.message
            # Retriable indeed: asked again (one at a time), each is answered.
            async with asyncio.timeout(FLOOD_TIMEOUT_S):
                for _ in failures:
                    assert TOPIC in await admin.describe_configs([TOPIC])
        finally:
            await admin.close()
        with pytest.raises(ClosedError):
            await admin.describe_configs([TOPIC])

    asyncio.run(flood())
