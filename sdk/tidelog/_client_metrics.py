"""What `Producer.metrics()` and `Consumer.metrics()` (and the asyncio twins)
report, in kafka-python's shape: metric group -> metric name -> value.

The hot paths only add numbers to plain attributes, once per batch, request
or fetch response, never per record: no lock, no clock read beyond the one a
latency needs. Rates, averages and maxima are worked out when metrics() is
asked, over a window of the last WINDOW_S to 2 x WINDOW_S seconds (Kafka's
two samples of metrics.sample.window.ms = 30 s), or since the client started
when it is younger; totals count from the start.

Thread-safety: the I/O side (on the client's event loop) writes, the caller's
thread reads. Each value is one Python int or float, so a read sees a whole
value; two values read together may be one update apart, which metrics
tolerate.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from tidelog.types import TopicPartition

#: Kafka's metrics.sample.window.ms (two samples are kept).
WINDOW_S = 30.0

Metrics = dict[str, dict[str, float]]


class Stat:
    """Count, sum and max of recorded values; a counter when only add() is
    used. Windowed figures come from marks taken at read time."""

    __slots__ = ("_last", "_max_before", "_since", "count", "max", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        now = time.monotonic()
        # Marks of (time, count, total) taken at reads: the window runs from
        # `_since`; `_last` becomes `_since` once it is WINDOW_S old.
        self._since: tuple[float, int, float] = (now, 0, 0.0)
        self._last: tuple[float, int, float] = (now, 0, 0.0)
        self._max_before = 0.0

    def record(self, value: float) -> None:
        self.count += 1
        self.total += value
        if value > self.max:
            self.max = value

    def add(self, amount: float) -> None:
        self.count += 1
        self.total += amount

    def window(self, now: float) -> tuple[float, int, float, float]:
        """(seconds, count, total, max) since the window's start."""
        if now - self._last[0] >= WINDOW_S:
            self._since, self._last = self._last, (now, self.count, self.total)
            self._max_before, self.max = self.max, 0.0
        start, count, total = self._since
        return (
            max(now - start, 1e-9),
            self.count - count,
            self.total - total,
            max(self.max, self._max_before),
        )

    def rate(self, now: float) -> float:
        seconds, _, total, _ = self.window(now)
        return total / seconds

    def count_rate(self, now: float) -> float:
        seconds, count, _, _ = self.window(now)
        return count / seconds

    def avg(self, now: float) -> float:
        _, count, total, _ = self.window(now)
        return total / count if count else 0.0

    def maximum(self, now: float) -> float:
        return self.window(now)[3]


class _TopicSends:
    __slots__ = ("bytes", "errors", "records")

    def __init__(self) -> None:
        self.records = Stat()
        self.bytes = Stat()
        self.errors = Stat()


class ProducerMetrics:
    """Fed by the sender (per batch and per request); read by metrics()."""

    def __init__(self) -> None:
        self.records_sent = Stat()  # add(records) per acknowledged batch
        self.records_failed = Stat()
        self.records_retried = Stat()
        self.bytes_sent = Stat()  # add(bytes) per acknowledged batch
        self.batch_size = Stat()  # record(bytes) per acknowledged batch
        self.queue_time_ms = Stat()  # record(ms from batch creation to its first send)
        self.requests = Stat()  # record(batches) per request answered
        self.request_latency_ms = Stat()
        self.topics: dict[str, _TopicSends] = {}

    def batch_sent(self, topic: str, records: int, size: int) -> None:
        self.records_sent.add(records)
        self.bytes_sent.add(size)
        self.batch_size.record(size)
        sends = self.topics.get(topic)
        if sends is None:
            sends = self.topics[topic] = _TopicSends()
        sends.records.add(records)
        sends.bytes.add(size)

    def batch_failed(self, topic: str, records: int) -> None:
        self.records_failed.add(records)
        sends = self.topics.get(topic)
        if sends is None:
            sends = self.topics[topic] = _TopicSends()
        sends.errors.add(records)

    def snapshot(self) -> Metrics:
        now = time.monotonic()
        requests_answered = self.requests
        out: Metrics = {
            "producer-metrics": {
                "record-send-total": self.records_sent.total,
                "record-send-rate": self.records_sent.rate(now),
                "record-error-total": self.records_failed.total,
                "record-error-rate": self.records_failed.rate(now),
                "record-retry-total": self.records_retried.total,
                "record-retry-rate": self.records_retried.rate(now),
                "byte-total": self.bytes_sent.total,
                "byte-rate": self.bytes_sent.rate(now),
                "batch-size-avg": self.batch_size.avg(now),
                "batch-size-max": self.batch_size.maximum(now),
                "records-per-request-avg": _ratio(
                    self.records_sent.window(now)[2], requests_answered.window(now)[1]
                ),
                "record-queue-time-avg": self.queue_time_ms.avg(now),
                "record-queue-time-max": self.queue_time_ms.maximum(now),
                "request-total": float(requests_answered.count),
                "request-rate": requests_answered.count_rate(now),
                "request-latency-avg": self.request_latency_ms.avg(now),
                "request-latency-max": self.request_latency_ms.maximum(now),
            }
        }
        for topic, sends in list(self.topics.items()):
            out[f"producer-topic-metrics.{topic}"] = {
                "record-send-total": sends.records.total,
                "record-send-rate": sends.records.rate(now),
                "byte-total": sends.bytes.total,
                "byte-rate": sends.bytes.rate(now),
                "record-error-total": sends.errors.total,
                "record-error-rate": sends.errors.rate(now),
            }
        return out


class ConsumerMetrics:
    """Fed by the fetcher (per response) and the subscription (per partition
    of a response, as it decodes); read by metrics()."""

    def __init__(self) -> None:
        self.records_consumed = Stat()  # add(records) per partition decoded
        self.bytes_consumed = Stat()  # add(bytes) per partition taken
        #: record(ms) per fetch response: how long the stream waited for it
        #: since its last request or response (a long-poll included, as
        #: Kafka's fetch latency includes fetch.max.wait.ms).
        self.fetch_latency_ms = Stat()

    def snapshot(self, lags: Iterable[tuple[TopicPartition, int]], assigned: int) -> Metrics:
        """`lags`: (partition, records behind its high watermark) of each
        assigned partition whose position and high watermark are known."""
        now = time.monotonic()
        fetches = self.fetch_latency_ms
        consumed_bytes = self.bytes_consumed.window(now)[2]
        lag_groups: dict[str, dict[str, float]] = {}
        lag_max = 0
        for tp, lag in lags:
            lag_max = max(lag_max, lag)
            lag_groups[f"consumer-fetch-manager-metrics.{tp.topic}-{tp.partition}"] = {
                "records-lag": float(lag)
            }
        out: Metrics = {
            "consumer-fetch-manager-metrics": {
                "records-consumed-total": self.records_consumed.total,
                "records-consumed-rate": self.records_consumed.rate(now),
                "bytes-consumed-total": self.bytes_consumed.total,
                "bytes-consumed-rate": self.bytes_consumed.rate(now),
                "fetch-total": float(fetches.count),
                "fetch-rate": fetches.count_rate(now),
                "fetch-size-avg": _ratio(consumed_bytes, fetches.window(now)[1]),
                "records-per-request-avg": _ratio(
                    self.records_consumed.window(now)[2], fetches.window(now)[1]
                ),
                "fetch-latency-avg": self.fetch_latency_ms.avg(now),
                "fetch-latency-max": self.fetch_latency_ms.maximum(now),
                "records-lag-max": float(lag_max),
            },
            "consumer-coordinator-metrics": {"assigned-partitions": float(assigned)},
        }
        out.update(lag_groups)
        return out


def _ratio(total: float, count: int) -> float:
    return total / count if count else 0.0


def lags_of(states: Iterable[Any]) -> Iterable[tuple[TopicPartition, int]]:
    """(partition, lag) from subscription states that know both their
    position and high watermark."""
    for state in states:
        position = state.position()
        highwater = state.highwater
        if position is not None and highwater is not None:
            yield state.tp, max(0, highwater - position)
