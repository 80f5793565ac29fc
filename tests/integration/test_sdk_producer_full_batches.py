"""A full batch is sent at once, against a real broker: with linger_ms at 60 s,
records that fill a batch (exactly, or leaving no room for another record) or
that a keyless record no longer fits are acknowledged within a deadline far
below the linger, by Producer (through send()'s C lanes, and without
tidelog._cproduce) and by AsyncProducer. Before, such a batch waited for the
next send() or its linger."""

from __future__ import annotations

import asyncio

import pytest
from tidelog import AdminClient, AsyncProducer, NewTopic, Producer, _accumulator
from tidelog._accumulator import BATCH_OVERHEAD, RECORD_OVERHEAD

pytestmark = pytest.mark.timeout(120)

LINGER_MS = 60_000
#: Generous on a loaded machine, and still half the linger.
ACK_DEADLINE_S = 30
#: Records of VALUE bytes that fill a batch of BATCH_SIZE exactly.
PER_BATCH = 50
VALUE = 100
BATCH_SIZE = BATCH_OVERHEAD + PER_BATCH * (RECORD_OVERHEAD + VALUE)


def _create(address: str, topic: str, partitions: int = 1) -> None:
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=partitions)])


@pytest.fixture(params=["c-lanes", "python"])
def lanes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """ "python": the producer is made without tidelog._cproduce, as an install
    without a C compiler is (every record takes the accumulator's lock)."""
    if request.param == "python":
        monkeypatch.setattr(_accumulator, "_cproduce", None)
        return False
    if _accumulator._cproduce is None:
        pytest.skip("tidelog._cproduce is not built (needs a C compiler: `make install`)")
    return True


@pytest.mark.parametrize("slack", [0, RECORD_OVERHEAD - 1], ids=["exactly-full", "no-room-left"])
@pytest.mark.parametrize("acks", [1, "all"], ids=["acks-1", "idempotent"])
def test_batches_their_records_fill_are_sent_without_waiting_for_linger(
    broker_address: str, topic_name: str, lanes: bool, slack: int, acks: int | str
) -> None:
    _create(broker_address, topic_name)
    with Producer(
        broker_address, linger_ms=LINGER_MS, batch_size=BATCH_SIZE + slack, acks=acks
    ) as producer:
        futures = [producer.send(topic_name, b"%03d" % i * (VALUE // 3) + b"x") for i in range(2)]
        # The batch's first record went the locked way; the next ones the lane's.
        assert (topic_name in producer._acc.lanes) == lanes
        futures += [
            producer.send(topic_name, b"%03d" % i * (VALUE // 3) + b"x")
            for i in range(2, 2 * PER_BATCH)
        ]
        # Two full batches: no flush, no close, no further send().
        offsets = [f.get(ACK_DEADLINE_S).offset for f in futures]
        assert offsets == list(range(2 * PER_BATCH))


def test_a_batch_a_keyless_record_did_not_fit_is_sent_without_waiting_for_linger(
    broker_address: str, topic_name: str, lanes: bool
) -> None:
    """Two partitions: the record after the first PER_BATCH - 1 does not fit and
    moves to the other partition; the batch it left is sent then."""
    _create(broker_address, topic_name, partitions=2)
    value = b"v" * VALUE
    with Producer(broker_address, linger_ms=LINGER_MS, batch_size=BATCH_SIZE - 10) as producer:
        first = [producer.send(topic_name, value) for _ in range(PER_BATCH - 1)]
        moved = producer.send(topic_name, value)
        metadata = [f.get(ACK_DEADLINE_S) for f in first]
        assert [m.offset for m in metadata] == list(range(PER_BATCH - 1))
        assert moved[0].partition != metadata[0].partition
        # It lingers in its own batch until close() sends it.
    assert moved.get(0).offset == 0


def test_async_producer_sends_a_batch_its_records_fill_without_waiting_for_linger(
    broker_address: str, topic_name: str, lanes: bool
) -> None:
    _create(broker_address, topic_name)

    async def main() -> list[int]:
        async with AsyncProducer(
            broker_address, linger_ms=LINGER_MS, batch_size=BATCH_SIZE + RECORD_OVERHEAD - 1
        ) as producer:
            futures = [
                await producer.send(topic_name, b"%03d" % i * (VALUE // 3) + b"x")
                for i in range(2 * PER_BATCH)
            ]
            done = await asyncio.wait_for(asyncio.gather(*futures), ACK_DEADLINE_S)
            return [m.offset for m in done]

    assert asyncio.run(main()) == list(range(2 * PER_BATCH))
