"""The paper's pipeline (examples/spark/page_views.py), small, in `make test`:
page views produced, counted per page and event-time window by a Structured
Streaming job reading and writing with format("tidelog"), the counts read
back by a consumer and compared with the counts of what was produced."""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(300)

EXAMPLE = Path(__file__).parents[2] / "examples" / "spark" / "page_views.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("page_views_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_page_views_are_counted_per_page_and_window(
    spark: Any, tidelog_bootstrap: str, new_topic: Any, tmp_path: Path
) -> None:
    example = load_example()
    source = new_topic(partitions=2, suffix="-views")
    sink = new_topic(partitions=2, suffix="-counts")
    base_ms = 1_767_225_600_000  # a window boundary (2026-01-01T00:00:00Z)
    # 300 events over 30 s of event time: three 10 s windows.
    sent = example.produce_page_views(
        tidelog_bootstrap,
        source,
        events=300,
        rate=5000,
        window_s=10,
        pages=5,
        event_time_ms=lambda i: base_ms + i * 100,
    )
    expected = Counter((e.page, e.window_start_ms) for e in sent)
    assert {w for _, w in expected} == {base_ms, base_ms + 10_000, base_ms + 20_000}

    counts = example.Counts()
    stop = threading.Event()
    printed: list[str] = []
    follower = threading.Thread(
        target=example.follow_counts,
        args=(tidelog_bootstrap, sink, stop, counts),
        kwargs={"echo": printed.append},
    )
    follower.start()
    query = example.count_views(
        spark,
        tidelog_bootstrap,
        source,
        sink,
        str(tmp_path / "checkpoint"),
        window="10 seconds",
        watermark="1 second",
        trigger="1 second",
    )
    try:
        # The watermark passes the last window: every window's final count is written.
        example.close_windows(tidelog_bootstrap, source, base_ms + 45_000)
        short = example.wait_for_counts(sent, counts, timeout_s=180, query=query)
    finally:
        query.stop()
        stop.set()
        follower.join()
    assert not short, f"counts not reached: {short}"
    # Append mode: one count per (page, window), its final one.
    assert counts.final() == dict(expected)
    assert all(len(seen) == 1 for seen in counts.updates.values())
    assert any(line.endswith(" views") and "/page/" in line for line in printed)
    # The latency computation finds every event counted.
    assert len(example.latencies(sent, counts)) == len(sent)
