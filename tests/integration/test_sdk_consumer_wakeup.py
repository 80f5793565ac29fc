"""Consumer.wakeup() and close() from another thread, against a real broker:
a poll waiting with a long timeout (poll(), poll_arrow(), iteration) is
interrupted well before its timeout; a wakeup() before a poll makes that
poll raise once and costs no record; close() from another thread wakes the
waiting poll (ClosedError; iteration ends). AsyncConsumer: cancelling the
task of a waiting getmany() interrupts it and costs no record; stop() from
another task wakes it. (In a group: see
tests/integration/groups/test_consumer_kafka_api.py.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from tidelog import AdminClient, AsyncConsumer, Consumer, NewTopic, Producer, TopicPartition
from tidelog.errors import ClosedError, WakeupError

pytestmark = pytest.mark.timeout(90)

#: What the interrupted poll waits for: far longer than the test may take.
LONG_MS = 120_000
#: How long the test waits for the interrupted poll to come back: generous
#: (a loaded machine), and well within LONG_MS.
COME_BACK_S = 30


def create(address: str, topic: str) -> TopicPartition:
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=1)])
    return TopicPartition(topic, 0)


def produce(address: str, topic: str, values: list[bytes]) -> None:
    with Producer(address, linger_ms=2) as producer:
        for value in values:
            producer.send(topic, value, partition=0)
        producer.flush()


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run `call` in a thread; the dict gets its "result" or its "error"."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def wait_polling(consumer: Consumer) -> None:
    """Until the consumer's other thread is inside a poll (so the wake-up
    under test reaches a waiting poll, not the next one)."""
    deadline = time.monotonic() + COME_BACK_S
    while not consumer._in_poll:
        assert time.monotonic() < deadline, "the poll did not start"
        time.sleep(0.01)
    time.sleep(0.2)  # past the first collect, into the wait


def _poll(consumer: Consumer) -> Any:
    return consumer.poll(timeout_ms=LONG_MS)


def _poll_arrow(consumer: Consumer) -> Any:
    return consumer.poll_arrow(timeout_ms=LONG_MS)


def _iterate(consumer: Consumer) -> Any:
    return [record for record in consumer]


WAITS = {"poll": _poll, "poll_arrow": _poll_arrow, "iteration": _iterate}


@pytest.mark.parametrize("wait", list(WAITS))
def test_wakeup_interrupts_a_waiting_poll_well_before_its_timeout(
    broker_address: str, topic_name: str, wait: str
) -> None:
    tp = create(broker_address, topic_name)
    with Consumer(bootstrap_servers=broker_address, consumer_timeout_ms=LONG_MS) as consumer:
        consumer.assign([tp])
        thread, outcome = in_thread(lambda: WAITS[wait](consumer))
        wait_polling(consumer)
        consumer.wakeup()
        thread.join(COME_BACK_S)
        assert not thread.is_alive(), "the poll slept on after wakeup()"
        assert isinstance(outcome.get("error"), WakeupError), outcome
        # Usable afterwards: records produced now are read.
        produce(broker_address, topic_name, [b"after"])
        assert [r.value for r in consumer.poll(timeout_ms=30_000)[tp]] == [b"after"]


def test_a_wakeup_before_a_poll_raises_once_and_costs_no_record(
    broker_address: str, topic_name: str
) -> None:
    tp = create(broker_address, topic_name)
    produce(broker_address, topic_name, [b"%d" % i for i in range(10)])
    with Consumer(bootstrap_servers=broker_address) as consumer:
        consumer.assign([tp])
        got: list[int] = []
        deadline = time.monotonic() + COME_BACK_S
        while len(got) < 4:
            assert time.monotonic() < deadline
            got += [r.offset for r in consumer.poll(timeout_ms=200, max_records=4 - len(got))[tp]]
        consumer.wakeup()
        consumer.wakeup()  # two before a poll are one
        with pytest.raises(WakeupError):
            consumer.poll(timeout_ms=0)  # even a poll that would not wait
        assert consumer.position(tp) == 4
        while len(got) < 10:
            assert time.monotonic() < deadline
            got += [r.offset for r in consumer.poll(timeout_ms=200).get(tp, [])]
        assert got == list(range(10))

        # The same in poll_arrow() and position().
        consumer.seek(tp, 2)
        consumer.wakeup()
        with pytest.raises(WakeupError):
            consumer.poll_arrow()
        consumer.wakeup()
        with pytest.raises(WakeupError):
            consumer.position(tp)
        assert consumer.position(tp) == 2


def test_a_wakeup_during_iteration_keeps_the_records_fetched_ahead(
    broker_address: str, topic_name: str
) -> None:
    """Iteration takes a chunk of records and returns them one by one; a
    wakeup() between two of them raises at the next one, and iterating
    again returns the rest of the chunk: none lost, none twice."""
    tp = create(broker_address, topic_name)
    produce(broker_address, topic_name, [b"%d" % i for i in range(20)])
    with Consumer(bootstrap_servers=broker_address, consumer_timeout_ms=LONG_MS) as consumer:
        consumer.assign([tp])
        records = iter(consumer)
        first = [next(records).offset for _ in range(3)]
        consumer.wakeup()
        with pytest.raises(WakeupError):
            next(records)
        assert consumer.position(tp) == 3  # what iteration returned
        rest = [next(records).offset for _ in range(17)]
        assert first + rest == list(range(20))


@pytest.mark.parametrize("wait", ["poll", "iteration"])
def test_close_from_another_thread_wakes_the_waiting_poll(
    broker_address: str, topic_name: str, wait: str
) -> None:
    """Kafka forbids close() from another thread; here it wakes the poll
    waiting there, which raises ClosedError (iteration ends), and closes."""
    tp = create(broker_address, topic_name)
    consumer = Consumer(bootstrap_servers=broker_address, consumer_timeout_ms=LONG_MS)
    try:
        consumer.assign([tp])
        thread, outcome = in_thread(lambda: WAITS[wait](consumer))
        wait_polling(consumer)
        consumer.close()
        thread.join(COME_BACK_S)
        assert not thread.is_alive(), "the poll slept on after close()"
    finally:
        consumer.close()
    if wait == "poll":
        assert isinstance(outcome.get("error"), ClosedError), outcome
    else:
        assert outcome == {"result": []}
    with pytest.raises(ClosedError):
        consumer.poll()


def test_an_async_consumer_is_interrupted_by_cancelling_its_task(
    broker_address: str, topic_name: str
) -> None:
    tp = create(broker_address, topic_name)
    produce(broker_address, topic_name, [b"0", b"1"])

    async def scenario() -> None:
        async with AsyncConsumer(bootstrap_servers=broker_address) as consumer:
            consumer.assign([tp])
            first = await consumer.getmany(timeout_ms=30_000, max_records=1)
            assert [r.offset for r in first[tp]] == [0]
            await asyncio.sleep(0.5)  # the second record is fetched meanwhile
            consumer.pause(tp)  # so that the next getmany() waits
            waiting = asyncio.ensure_future(consumer.getmany(timeout_ms=LONG_MS))
            await asyncio.sleep(0.2)
            waiting.cancel()
            done, _ = await asyncio.wait([waiting], timeout=COME_BACK_S)
            assert done == {waiting} and waiting.cancelled()
            assert await consumer.position(tp) == 1
            consumer.resume(tp)
            again = await consumer.getmany(timeout_ms=30_000)
            assert [r.offset for r in again[tp]] == [1]

    asyncio.run(asyncio.wait_for(scenario(), 60))


@pytest.mark.parametrize("wait", ["getmany", "async for"])
def test_stopping_an_async_consumer_wakes_its_waiting_reader(
    broker_address: str, topic_name: str, wait: str
) -> None:
    tp = create(broker_address, topic_name)

    async def read(consumer: AsyncConsumer) -> Any:
        if wait == "getmany":
            return await consumer.getmany(timeout_ms=LONG_MS)
        return [record async for record in consumer]

    async def scenario() -> None:
        consumer = AsyncConsumer(bootstrap_servers=broker_address)
        await consumer.start()
        consumer.assign([tp])
        reader = asyncio.ensure_future(read(consumer))
        await asyncio.sleep(0.3)
        await consumer.stop()
        done, _ = await asyncio.wait([reader], timeout=COME_BACK_S)
        assert done == {reader}, "the reader slept on after stop()"
        if wait == "getmany":
            with pytest.raises(ClosedError):
                reader.result()
        else:
            assert reader.result() == []

    asyncio.run(asyncio.wait_for(scenario(), 60))
