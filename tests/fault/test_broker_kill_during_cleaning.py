"""Kill -9 the broker at random moments while its cleaner and retention run,
restart it, and check both logs against a model of what was acknowledged.

Small segments (segment.bytes=1024), a cleaner and a retention check every
20 ms, and an offset map of ~25 entries (so most rounds are partial) keep
both background tasks busy, so a random kill lands in the middle of a round
or a swap often. Seeded: a failure prints the seed, and TIDELOG_FAULT_SEED
replays it.

- compacted topic: the last record read for each key is the model's latest
  value (a deleted key is absent or ends with its tombstone), offsets strictly
  increase, and nothing acknowledged is lost at the end of the log. The
  cleaner keeps running while the test reads: with delete.retention.ms=0 a
  swap between two Fetches of a scan can remove a value the scan has read and
  the tombstone it has yet to read (as in Kafka, a scan sees every tombstone
  only within delete.retention.ms), so the latest values are checked on a
  scan that no swap overlapped (the broker logs each swap as it makes it);
- retained topic (retention.bytes): what is left is a dense suffix of what was
  acknowledged, each offset with the value produced there.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tidelog import records
from tidelog.v1 import admin_pb2, admin_pb2_grpc, log_pb2, log_pb2_grpc

from tests.support.processes import BrokerProcess, start_broker

pytestmark = pytest.mark.timeout(90)

ROUNDS = 10
KEYS = 40
COMPACTED = "fault-compacted"
RETAINED = "fault-retained"
#: Scans of the compacted log read again because a swap overlapped them; with
#: no new writes the cleaner runs out of dirty segments long before.
OVERLAPPED_SCANS_MAX = 100


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = start_broker(
        tmp_path / "data",
        extra_args=(
            "--set",
            "log.segment.bytes=1024",
            "--set",
            "log.retention.check.interval.ms=20",
            "--set",
            "log.cleaner.backoff.ms=20",
            "--set",
            "log.cleaner.dedupe.buffer.size=3600",
        ),
    )
    try:
        yield process
    finally:
        process.stop()


def _create_topics(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        response = admin_pb2_grpc.AdminStub(channel).CreateTopics(
            admin_pb2.CreateTopicsRequest(
                topics=[
                    admin_pb2.NewTopic(
                        name=COMPACTED,
                        partitions=1,
                        configs={
                            "cleanup.policy": "compact",
                            "min.cleanable.dirty.ratio": "0.01",
                            "delete.retention.ms": "0",
                        },
                    ),
                    admin_pb2.NewTopic(
                        name=RETAINED, partitions=1, configs={"retention.bytes": "4096"}
                    ),
                ]
            ),
            timeout=10,
        )
    assert not any(t.HasField("error") for t in response.topics), response


def _produce(stub: log_pb2_grpc.LogStub, topic: str, batch: bytes) -> int:
    request = log_pb2.ProduceRequest(
        correlation_id=1,
        acks=1,
        partitions=[log_pb2.PartitionRecords(topic=topic, partition=0, records=batch)],
    )
    (response,) = list(stub.Produce(iter([request]), timeout=10))
    result = response.partitions[0]
    assert not result.HasField("error"), result.error
    return result.base_offset


def _offsets(stub: log_pb2_grpc.LogStub, topic: str) -> tuple[int, int]:
    response = stub.ListOffsets(
        log_pb2.ListOffsetsRequest(
            partitions=[
                log_pb2.ListOffsetsPartition(topic=topic, partition=0, timestamp_ms=ts)
                for ts in (-2, -1)
            ]
        ),
        timeout=10,
    )
    return response.partitions[0].offset, response.partitions[1].offset


def _read_all(
    stub: log_pb2_grpc.LogStub, topic: str
) -> tuple[int, int, list[tuple[int, bytes | None, bytes | None]]]:
    start, end = _offsets(stub, topic)
    out: list[tuple[int, bytes | None, bytes | None]] = []
    offset = start
    while offset < end:
        call = stub.Fetch(
            iter(
                [
                    log_pb2.FetchRequest(
                        positions=[
                            log_pb2.FetchPosition(topic=topic, partition=0, fetch_offset=offset)
                        ],
                        credit_bytes=1 << 24,
                        max_bytes=1 << 22,
                        max_wait_ms=50,
                    )
                ]
            ),
            timeout=10,
        )
        data = next(call).partitions[0]
        call.cancel()
        if data.error.code:
            # Retention moved the start between ListOffsets and Fetch: restart.
            start, end = _offsets(stub, topic)
            out, offset = [], start
            continue
        for batch in records.decode_batches(data.records):
            out.extend(
                (o, k, v)
                for o, k, v in zip(batch.offsets, batch.keys, batch.values, strict=True)
                if o >= offset
            )
        offset = data.next_offset
    return start, end, out


def test_kill_during_cleaning_and_retention(broker: BrokerProcess) -> None:
    seed = int(os.environ.get("TIDELOG_FAULT_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"TIDELOG_FAULT_SEED={seed}")
    _create_topics(broker.address)
    latest: dict[bytes, bytes | None] = {}
    retained: dict[int, bytes] = {}
    acked_end = {COMPACTED: 0, RETAINED: 0}
    overlapped_scans = 0
    started = time.monotonic()
    for round_ in range(ROUNDS):
        with grpc.insecure_channel(broker.address) as channel:
            stub = log_pb2_grpc.LogStub(channel)
            for i in range(rng.randrange(60, 200)):
                key = b"key-%d" % rng.randrange(KEYS)
                value = None if rng.random() < 0.1 else b"r%d-%d-" % (round_, i) + b"v" * 40
                offset = _produce(
                    stub, COMPACTED, records.encode_batch([value], keys=[key], base_timestamp=1)
                )
                latest[key] = value
                acked_end[COMPACTED] = offset + 1
                payload = b"o-%d-" % acked_end[RETAINED] + b"p" * 60
                offset = _produce(stub, RETAINED, records.encode_batch([payload]))
                retained[offset] = payload
                acked_end[RETAINED] = offset + 1
        time.sleep(rng.uniform(0, 0.15))  # the cleaner and retention are at work
        broker.kill()
        broker.spawn()
        with grpc.insecure_channel(broker.address) as channel:
            stub = log_pb2_grpc.LogStub(channel)
            overlapped_scans += _check_compacted(stub, broker, latest, acked_end[COMPACTED], seed)
            _check_retained(stub, retained, acked_end[RETAINED], seed)
    elapsed = time.monotonic() - started
    broker_log = broker.log_path.read_text(errors="replace")
    cleaned = broker_log.count(": cleaned ")
    print(
        f"{ROUNDS} kills in {elapsed:.1f} s; {cleaned} swaps; "
        f"{broker_log.count('completed an interrupted swap')} interrupted swaps completed; "
        f"{broker_log.count('retention deleted')} retention passes; "
        f"{overlapped_scans} scans overlapped by a swap and read again"
    )
    assert cleaned > ROUNDS, f"the cleaner swapped only {cleaned} times (seed {seed})"


def _swaps(broker: BrokerProcess) -> int:
    return broker.log_path.read_text(errors="replace").count(": cleaned ")


def _check_compacted(
    stub: log_pb2_grpc.LogStub,
    broker: BrokerProcess,
    latest: dict[bytes, bytes | None],
    acked_end: int,
    seed: int,
) -> int:
    """Check the compacted log; returns how many scans a swap overlapped."""
    # With no new writes the cleaner runs out of dirty segments within a few
    # rounds; a scan overlapped by a swap is read again.
    overlapped = 0
    while True:
        swaps_before = _swaps(broker)
        _, end, read = _read_all(stub, COMPACTED)
        assert end == acked_end, f"seed {seed}: log end {end}, acknowledged {acked_end}"
        offsets = [o for o, _, _ in read]
        assert offsets == sorted(set(offsets)), f"seed {seed}: duplicate or unordered offsets"
        if _swaps(broker) == swaps_before:
            break
        overlapped += 1
        assert overlapped < OVERLAPPED_SCANS_MAX, f"seed {seed}: the cleaner never stopped swapping"
    last: dict[bytes, bytes | None] = {}
    for _, key, value in read:
        assert key is not None
        last[key] = value
    for key, value in latest.items():
        if value is None:
            assert last.get(key) is None, f"seed {seed}: deleted {key!r} came back"
        else:
            assert last.get(key) == value, f"seed {seed}: {key!r} is {last.get(key)!r}"
    # The active segment is never cleaned: the last acknowledged record is there.
    assert read[-1][0] == acked_end - 1, f"seed {seed}: the last record is gone"
    return overlapped


def _check_retained(
    stub: log_pb2_grpc.LogStub, retained: dict[int, bytes], acked_end: int, seed: int
) -> None:
    start, end, read = _read_all(stub, RETAINED)
    assert end == acked_end, f"seed {seed}: log end {end}, acknowledged {acked_end}"
    assert [o for o, _, _ in read] == list(range(start, end)), f"seed {seed}: not dense"
    assert all(retained[o] == v for o, _, v in read), f"seed {seed}: wrong value"
    assert start > 0 or end < 100  # retention.bytes=4096 keeps only the tail
