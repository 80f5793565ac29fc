"""Property test: a compacted log against a model (a dict of the latest value
per key). Any sequence of puts, deletes (tombstones), segment rolls, clock
moves, cleaning rounds (with a random offset-map bound) and reopenings reads
back as the model says: the latest value of every key, tombstones gone once
a round ran after their delete.retention.ms, offsets strictly increasing, and
each key at most once below the clean offset. Time is a ManualClock."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tidelog_broker.storage import LogConfig, ManualClock, PartitionLog, cleaner
from tidelog_broker.storage.partition_log import unlink_files

from tests.unit.broker.storage.compaction_helpers import put, read_records

SEGMENT_MS = 1_000
DELETE_RETENTION_MS = 5_000
KEYS = [b"k%d" % i for i in range(12)]

_op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.binary(min_size=0, max_size=40)),
    st.tuples(st.just("delete"), st.sampled_from(KEYS), st.none()),
    st.tuples(st.just("roll"), st.none(), st.none()),
    st.tuples(st.just("tick"), st.integers(1, 3_000), st.none()),
    st.tuples(st.just("clean"), st.integers(1, 30), st.none()),
    st.tuples(st.just("reopen"), st.booleans(), st.none()),
)


def _check(log: PartitionLog, model: dict[bytes, bytes | None], gone: set[bytes]) -> None:
    records = read_records(log)
    offsets = [r[0] for r in records]
    assert offsets == sorted(set(offsets)), "offsets must strictly increase"
    last: dict[bytes, bytes | None] = {}
    below_clean: list[bytes] = []
    for offset, key, value, _ in records:
        assert key is not None
        last[key] = value
        if offset < log.clean_offset:
            below_clean.append(key)
    assert len(below_clean) == len(set(below_clean)), "a key twice below the clean offset"
    for key, value in model.items():
        if key in gone:
            assert key not in last, f"expired tombstone of {key!r} still there"
        elif value is None:
            assert last.get(key) is None
        else:
            assert last.get(key) == value, f"{key!r}: {last.get(key)!r} != {value!r}"
    assert set(last) <= set(model)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(_op, min_size=1, max_size=80))
def test_compacted_log_matches_the_model(ops: list[tuple]) -> None:
    config = dataclasses.replace(
        LogConfig(),
        segment_bytes=600,
        segment_ms=SEGMENT_MS,
        index_interval_bytes=100,
        cleanup_policy="compact",
        min_cleanable_dirty_ratio=0.0,
        delete_retention_ms=DELETE_RETENTION_MS,
    )
    clock = ManualClock()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "model-0"
        log = PartitionLog.open(directory, "model", 0, config, clock)
        # key -> latest value (None: deleted); tombstone key -> (offset, timestamp)
        model: dict[bytes, bytes | None] = {}
        tombstones: dict[bytes, tuple[int, int]] = {}
        gone: set[bytes] = set()
        try:
            for op, a, b in ops:
                if op == "put":
                    put(log, a, b, clock.time_ms())
                    model[a] = b
                    tombstones.pop(a, None)
                    gone.discard(a)
                elif op == "delete":
                    offset = put(log, a, None, clock.time_ms())
                    model[a] = None
                    tombstones[a] = (offset, clock.time_ms())
                    gone.discard(a)
                elif op == "roll":
                    clock.advance(SEGMENT_MS)
                elif op == "tick":
                    clock.advance(a)
                elif op == "clean":
                    plan = log.plan_cleaning(a, force=True)
                    result = None
                    if plan is not None:
                        try:
                            result = cleaner.clean(plan)
                        finally:
                            unlink_files(log.finish_cleaning(result))
                    if result is not None:
                        for key, (offset, ts) in tombstones.items():
                            if offset < result.clean_offset and ts < plan.delete_horizon_ms:
                                gone.add(key)
                    _check(log, model, gone)
                elif op == "reopen":
                    if a:
                        log.close()
                    else:
                        for segment in log.segments:
                            segment.close()  # a crash: nothing flushed, no marker
                    log = PartitionLog.open(directory, "model", 0, config, clock)
            _check(log, model, gone)
        finally:
            for segment in log.segments:
                segment.close()
