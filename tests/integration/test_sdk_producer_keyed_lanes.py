"""Keyed records through send()'s keyed lanes (tidelog._cproduce), against a real
broker: every record lands on its key's murmur2 partition, each partition's in
send order at the offset its future reports, mixed with records the lanes do
not take (explicit partitions) and keyless ones, by Producer (plain and
idempotent) and AsyncProducer; records with headers and tombstones too, which
the lanes take as well, read back exactly; and a batch keyed records fill is
sent without waiting for the linger; keyed and keyless records of several
threads in one topic, the sticky batch's lane taking both. Also without tidelog._cproduce (every
record takes the accumulator's lock), which must deliver the same."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from tidelog import (
    AdminClient,
    AsyncProducer,
    Consumer,
    NewTopic,
    Producer,
    TopicPartition,
    _accumulator,
)
from tidelog._accumulator import BATCH_OVERHEAD, record_size
from tidelog.partitioner import partition_for_key

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 4
KEYS = [b"%08d" % i for i in range(100)]


def _create(address: str, topic: str, partitions: int = PARTITIONS) -> None:
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=partitions)])


@pytest.fixture(params=["c-lanes", "python"])
def lanes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param == "python":
        monkeypatch.setattr(_accumulator, "_cproduce", None)
        return False
    if _accumulator._cproduce is None:
        pytest.skip("tidelog._cproduce is not built (needs a C compiler: `make install`)")
    return True


Plan = list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None, int | None]]


def _plan(count: int, kind: str = "keyed") -> Plan:
    """(key, value, headers, partition) per record. "keyed": keyed mostly, a few
    with headers, explicit partitions (not for the lanes) or keyless. "headers":
    as an application that traces sends them: every record with a trace id and
    some with more headers (a null value, a non-ASCII key), every fifth a
    tombstone, a few keyless, a few explicit partitions."""
    out: Plan = []
    for i in range(count):
        key: bytes | None = KEYS[i % len(KEYS)]
        value: bytes | None = b"value-%06d" % i
        headers: list[tuple[str, bytes | None]] | None = None
        partition = None
        if kind == "headers":
            headers = [("trace-id", b"%016x" % i)]
            if i % 3 == 0:
                headers += [("span", None), ("clé", b"\x00" * (i % 7))]
            if i % 5 == 0:
                value = None
        if i % 97 == 5 and kind == "keyed":
            headers = [("h", b"%d" % i)]
        elif i % 89 == 7:
            partition = i % PARTITIONS
        elif i % 83 == 11:
            key = None
            value = value or b"keyless-%06d" % i
        out.append((key, value, headers, partition))
    return out


def _lane_took_headers(producer: Producer | AsyncProducer, topic: str) -> bool:
    """Whether a lane of the topic has taken records into a batch with headers
    (False where lanes have no headers column, as before they took headers)."""
    lanes = [*(producer._acc.keyed_lanes.get(topic) or []), producer._acc.lanes.get(topic)]
    return any(
        lane is not None and getattr(lane, "with_headers", False) and lane.used for lane in lanes
    )


def _check(address: str, topic: str, plan, metadata) -> None:  # type: ignore[no-untyped-def]
    for (key, _, _, partition), md in zip(plan, metadata, strict=True):
        if partition is not None:
            assert md.partition == partition
        elif key is not None:
            assert md.partition == partition_for_key(key, PARTITIONS)
    with Consumer(bootstrap_servers=address) as consumer:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        got = []
        deadline = time.monotonic() + 60
        while len(got) < len(plan) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(records)
    assert len(got) == len(plan)
    by_offset = {(r.partition, r.offset): r for r in got}
    for (key, value, headers, _), md in zip(plan, metadata, strict=True):
        record = by_offset[(md.partition, md.offset)]
        assert (record.key, record.value) == (key, value)
        assert list(record.headers or []) == list(headers or [])
    # Each partition's records in send order: offsets grow with the send order.
    for p in range(PARTITIONS):
        offsets = [md.offset for md in metadata if md.partition == p]
        assert offsets == sorted(offsets) == list(range(len(offsets)))


@pytest.mark.parametrize("kind", ["keyed", "headers"])
@pytest.mark.parametrize("acks", [1, "all"], ids=["acks-1", "idempotent"])
def test_keyed_records_land_on_their_partitions_in_send_order(
    broker_address: str, topic_name: str, lanes: bool, acks: int | str, kind: str
) -> None:
    _create(broker_address, topic_name)
    plan = _plan(20_000, kind)
    with Producer(broker_address, linger_ms=5, acks=acks) as producer:
        futures = []
        used_lane = took_headers = False
        for key, value, headers, partition in plan:
            futures.append(
                producer.send(topic_name, value, key=key, headers=headers, partition=partition)
            )
            used_lane = used_lane or any(producer._acc.keyed_lanes.get(topic_name) or [])
            took_headers = took_headers or _lane_took_headers(producer, topic_name)
        assert used_lane == lanes
        # (The "keyed" plan's few records with headers give lanes a headers column too.)
        assert took_headers == lanes or kind == "keyed"
        metadata = [f.get(60) for f in futures]
    _check(broker_address, topic_name, plan, metadata)


@pytest.mark.parametrize("kind", ["keyed", "headers"])
def test_the_async_producer_sends_keyed_records_through_its_lanes(
    broker_address: str, topic_name: str, lanes: bool, kind: str
) -> None:
    _create(broker_address, topic_name)
    plan = _plan(5_000, kind)

    async def run() -> list:  # type: ignore[type-arg]
        async with AsyncProducer(broker_address, linger_ms=5) as producer:
            futures = []
            used_lane = took_headers = False
            for key, value, headers, partition in plan:
                futures.append(
                    await producer.send(
                        topic_name, value, key=key, headers=headers, partition=partition
                    )
                )
                used_lane = used_lane or any(producer._acc.keyed_lanes.get(topic_name) or [])
                took_headers = took_headers or _lane_took_headers(producer, topic_name)
            assert used_lane == lanes
            assert took_headers == lanes or kind == "keyed"
            return [await f for f in futures]

    metadata = asyncio.run(run())
    _check(broker_address, topic_name, plan, metadata)


@pytest.mark.parametrize("kind", ["plain", "headers", "tombstones"])
def test_a_batch_keyed_records_fill_is_sent_without_waiting_for_linger(
    broker_address: str, topic_name: str, lanes: bool, kind: str
) -> None:
    _create(broker_address, topic_name, partitions=2)
    key = KEYS[0]
    value = None if kind == "tombstones" else b"v" * 100
    headers = [("trace-id", b"t" * 16)] if kind != "plain" else None
    per_batch = 50
    batch_size = BATCH_OVERHEAD + per_batch * record_size(key, value, headers)
    with Producer(broker_address, linger_ms=60_000, batch_size=batch_size) as producer:
        futures = [
            producer.send(topic_name, value, key=key, headers=headers) for _ in range(2 * per_batch)
        ]
        # Two full batches: no flush, no close, no further send().
        offsets = [f.get(30).offset for f in futures]
        assert offsets == list(range(2 * per_batch))


@pytest.mark.parametrize("acks", [1, "all"], ids=["acks-1", "idempotent"])
def test_keyed_and_keyless_records_of_many_threads_arrive_once_in_order(
    broker_address: str, topic_name: str, lanes: bool, acks: int | str
) -> None:
    """Threads send keyed records and keyless ones (every third) to one topic,
    whose sticky partition's batches both kinds reach: every record arrives
    exactly once, keyed ones on their key's partition, at the offset its
    future reports, each thread's records of a partition (so each key's) in
    its send order; and keyless records took the sticky batch's lane that
    keyed records take too."""
    _create(broker_address, topic_name)
    threads, count = 3, 4_000
    plans: list[Plan] = [
        [
            (
                None if i % 3 == t else KEYS[(7 * i + t) % len(KEYS)],
                b"%d:%06d" % (t, i),
                None,
                None,
            )
            for i in range(count)
        ]
        for t in range(threads)
    ]
    futures: list[list] = [[] for _ in range(threads)]  # type: ignore[type-arg]
    shared_lane_taken: list[bool] = []
    failed: list[BaseException] = []

    with Producer(broker_address, linger_ms=50, acks=acks) as producer:
        acc = producer._acc

        def produce(t: int) -> None:
            try:
                for key, value, _, _ in plans[t]:
                    futures[t].append(producer.send(topic_name, value, key=key))
                    if key is None and not shared_lane_taken:
                        lane = acc.lanes.get(topic_name)
                        # The topic's lane a keyed record's locked append opened.
                        if lane is not None and lane.keyed and lane.used:
                            shared_lane_taken.append(True)
            except BaseException as exc:  # reported below, not lost with the thread
                failed.append(exc)

        workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert not failed, failed
        metadata = [[f.get(60) for f in fs] for fs in futures]
    assert bool(shared_lane_taken) == lanes
    for t in range(threads):
        for p in range(PARTITIONS):
            offsets = [md.offset for md in metadata[t] if md.partition == p]
            assert offsets == sorted(offsets)  # this thread's records in send order
    # In offset order, for _check: each record at its future's offset, on its
    # key's partition, each partition's offsets dense (none lost or twice).
    rows = sorted(
        ((md.partition, md.offset), row, md)
        for t in range(threads)
        for row, md in zip(plans[t], metadata[t], strict=True)
    )
    assert len({place for place, _, _ in rows}) == threads * count
    _check(broker_address, topic_name, [r for _, r, _ in rows], [md for _, _, md in rows])
