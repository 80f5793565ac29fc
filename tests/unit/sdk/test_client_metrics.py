"""The windows behind the SDK's metrics(): totals for life, rates, averages
and maxima over the last 30-60 s."""

from __future__ import annotations

import pytest
from tidelog._client_metrics import WINDOW_S, ConsumerMetrics, ProducerMetrics, Stat
from tidelog.types import TopicPartition


def test_totals_averages_and_maxima() -> None:
    stat = Stat()
    start = stat._since[0]
    for value in (10.0, 30.0, 20.0):
        stat.record(value)
    seconds, count, total, maximum = stat.window(start + 2.0)
    assert seconds == pytest.approx(2.0) and (count, total, maximum) == (3, 60.0, 30.0)
    assert stat.avg(start + 2.0) == 20.0 and stat.rate(start + 2.0) == pytest.approx(30.0)


def test_the_window_moves_on_and_old_maxima_age_out() -> None:
    stat = Stat()
    start = stat._since[0]
    stat.record(100.0)
    stat.window(start + WINDOW_S)  # first rotation: the max moves to the old window
    stat.record(1.0)
    assert stat.maximum(start + WINDOW_S + 1) == 100.0
    stat.window(start + 2 * WINDOW_S + 1)  # second rotation: 100 is gone
    assert stat.maximum(start + 2 * WINDOW_S + 2) == 1.0
    assert stat.total == 101.0 and stat.count == 2  # totals count from the start


def test_producer_snapshot_shape() -> None:
    metrics = ProducerMetrics()
    metrics.batch_sent("orders", 10, 500)
    metrics.batch_failed("orders", 3)
    metrics.requests.add(1)
    metrics.request_latency_ms.record(4.0)
    snapshot = metrics.snapshot()
    overall = snapshot["producer-metrics"]
    assert overall["record-send-total"] == 10 and overall["byte-total"] == 500
    assert overall["record-error-total"] == 3 and overall["records-per-request-avg"] == 10
    assert overall["request-latency-avg"] == 4.0 and overall["batch-size-max"] == 500
    assert snapshot["producer-topic-metrics.orders"]["record-error-total"] == 3


def test_consumer_snapshot_lag() -> None:
    metrics = ConsumerMetrics()
    lags = [(TopicPartition("t", 0), 5), (TopicPartition("t", 1), 12)]
    snapshot = metrics.snapshot(lags, assigned=3)
    assert snapshot["consumer-fetch-manager-metrics"]["records-lag-max"] == 12
    assert snapshot["consumer-fetch-manager-metrics.t-1"]["records-lag"] == 12
    assert snapshot["consumer-coordinator-metrics"]["assigned-partitions"] == 3
