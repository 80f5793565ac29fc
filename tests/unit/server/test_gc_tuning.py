"""tune_gc: the young-generation threshold a service runs with (see
tidelog_server/gc_tuning.py for the measurement behind it)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from tidelog_server.gc_tuning import YOUNG_THRESHOLD, tune_gc


@pytest.fixture
def thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


@pytest.mark.usefixtures("thresholds")
def test_raises_the_young_threshold_and_keeps_the_older_ones() -> None:
    gc.set_threshold(700, 10, 10)
    tune_gc()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)


@pytest.mark.usefixtures("thresholds")
def test_keeps_a_larger_young_threshold() -> None:
    gc.set_threshold(YOUNG_THRESHOLD * 5, 7, 3)
    tune_gc()
    assert gc.get_threshold() == (YOUNG_THRESHOLD * 5, 7, 3)
