"""The garbage collector and the records a consumer decodes
(`tidelog._subscription._gc_paused`): records go to the oldest generation
untraversed, garbage cycles are still collected, and an application's own
gc.freeze() is left alone."""

from __future__ import annotations

import gc
import weakref
from collections import deque
from collections.abc import Iterator

import pytest
from tidelog import _subscription
from tidelog._subscription import SubscriptionState
from tidelog.config import ConsumerConfig
from tidelog.records import encode_batch
from tidelog.types import ConsumerRecord, TopicPartition

pytestmark = pytest.mark.timeout(30)

TP = TopicPartition("t", 0)


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def _gc_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        if not was:
            gc.disable()


def _decode(count: int = 1_000) -> list[ConsumerRecord]:
    buf = encode_batch([b"v%d" % i for i in range(count)])
    state = SubscriptionState(
        ConsumerConfig(bootstrap_servers="127.0.0.1:1"), deque(), lambda name, args: None
    )
    records, error = state._decode(TP, buf, 0)
    assert error is None and len(records) == count
    return records


def _in_generation(obj: object, generation: int) -> bool:
    return any(o is obj for o in gc.get_objects(generation))


def test_decoded_records_go_to_the_oldest_generation_untraversed() -> None:
    gc.collect()
    young_collections = gc.get_stats()[0]["collections"]
    records = _decode()
    # A tuple subclass stays tracked (CPython untracks exact tuples only) ...
    assert gc.is_tracked(records[0])
    # ... so the records skip the young generations, where every young
    # collection would traverse them again.
    assert not _in_generation(records[-1], 0) and not _in_generation(records[-1], 1)
    assert _in_generation(records[-1], 2)
    assert gc.get_stats()[0]["collections"] - young_collections <= 1
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_garbage_cycle_made_before_a_poll_is_still_collected() -> None:
    cycle = _Cycle()
    alive = weakref.ref(cycle)
    del cycle
    _decode()  # promotes the cycle along with the records
    assert alive() is not None
    gc.collect()
    assert alive() is None


def test_enough_promotions_force_a_full_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_subscription, "_PROMOTED_BEFORE_FULL_COLLECTION", 5_000)
    monkeypatch.setattr(_subscription, "_promoted", 0)
    cycle = _Cycle()
    alive = weakref.ref(cycle)
    del cycle
    for _ in range(10):
        _decode()
        if alive() is None:
            break
    assert alive() is None, "no full collection after 10,000 promoted records"


def test_an_application_that_froze_objects_keeps_them_frozen() -> None:
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        records = _decode(count=1_000)
        # Neither frozen by the SDK (+1,000 and more) nor unfrozen (0). Not
        # exactly equal: in a process with other threads (a test worker),
        # a frozen object they free meanwhile leaves the count (seen: -1).
        assert frozen - 500 < gc.get_freeze_count() <= frozen
        assert gc.isenabled()
        assert records[0].value == b"v0"
    finally:
        gc.unfreeze()
