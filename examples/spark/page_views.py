"""The Kafka paper's pipeline on Spark: page views counted per page and window.

    page-views (topic)  --Structured Streaming-->  page-view-counts (topic)  -->  printed

1. `produce_page_views`: page-view events (JSON: page, user, event time in ms)
   produced into a topic at a given rate, keyed by page;
2. `count_views`: a Structured Streaming job that reads them with
   `readStream.format("tidelog")`, counts views per page in event-time
   windows with a watermark, and writes each window's final count back with
   `writeStream.format("tidelog")` (key: the page; value: JSON with the
   window, the page and the count), exactly once. Append mode: a window's
   count is written once the watermark has passed the window's end (Spark's
   Python data sources take no Update mode; `foreachBatch` with
   `df.write.format("tidelog").option("writerId", ...)` does updates);
3. `follow_counts`: a plain consumer that prints the counts as they arrive.

Run against a cluster (`make run` in another terminal):

    .venv/bin/python examples/spark/page_views.py --events 5000 --rate 1000

It creates the two topics if missing, starts the job, produces the events,
prints the counts, and at the end how long an event took from being produced
to the first count that includes it appearing in the output topic (p50, p99).
`make demo-spark` runs a larger version on a throwaway cluster
(bench/spark_pipeline_bench.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidelog import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tidelog.errors import TopicAlreadyExistsError

#: The event's JSON, as Spark reads it.
EVENT_SCHEMA = "page STRING, user STRING, time_ms LONG"


@dataclass
class SentEvent:
    """What the producer remembers of one event, to measure latency."""

    page: str
    window_start_ms: int
    sent_at: float


@dataclass
class Counts:
    """The counts seen in the output topic: (page, window start) -> [(count, seen at)]."""

    updates: dict[tuple[str, int], list[tuple[int, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def final(self) -> dict[tuple[str, int], int]:
        return {group: max(c for c, _ in seen) for group, seen in self.updates.items()}


def create_topics(bootstrap: str, *topics: str, partitions: int = 2) -> None:
    with AdminClient(bootstrap_servers=bootstrap) as admin:
        for topic in topics:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics([NewTopic(topic, partitions, 1)])


def produce_page_views(
    bootstrap: str,
    topic: str,
    *,
    events: int,
    rate: float,
    window_s: int,
    pages: int = 20,
    seed: int = 0,
    event_time_ms: Callable[[int], int] | None = None,
) -> list[SentEvent]:
    """Produce `events` page views at `rate` per second (keyed by page, so a
    page's views stay in order). Event time: now, or `event_time_ms(i)`."""
    rng = random.Random(seed)
    sent: list[SentEvent] = []
    interval = 1.0 / rate
    start = time.monotonic()
    with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=1) as producer:
        for i in range(events):
            delay = start + i * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            page = f"/page/{min(int(rng.expovariate(0.25)), pages - 1)}"
            sent_at = time.time()
            now_ms = int(sent_at * 1000)
            at_ms = event_time_ms(i) if event_time_ms else now_ms
            value = json.dumps({"page": page, "user": f"u{rng.randrange(1000)}", "time_ms": at_ms})
            producer.send(topic, value.encode(), key=page.encode(), timestamp_ms=now_ms)
            sent.append(SentEvent(page, at_ms - at_ms % (window_s * 1000), sent_at))
        producer.flush(timeout=60)
    return sent


def count_views(
    spark: Any,
    bootstrap: str,
    source: str,
    sink: str,
    checkpoint: str,
    *,
    window: str = "2 seconds",
    watermark: str = "1 second",
    trigger: str = "0 seconds",
) -> Any:
    """Start the streaming job; returns the StreamingQuery."""
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("tidelog")
        .option("tidelog.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
        .select("e.page", F.timestamp_millis("e.time_ms").alias("event_time"))
    )
    counts = (
        events.withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window), "page")
        .count()
    )
    out = counts.select(
        F.col("page").cast("binary").alias("key"),
        F.to_json(
            F.struct(
                F.unix_millis("window.start").alias("window_start_ms"),
                F.unix_millis("window.end").alias("window_end_ms"),
                "page",
                "count",
            )
        ).alias("value"),
    )
    return (
        out.writeStream.format("tidelog")
        .option("tidelog.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
        .trigger(processingTime=trigger)
        .queryName(f"page-view-counts-{sink}")
        .start()
    )


def close_windows(bootstrap: str, topic: str, event_time_ms: int) -> None:
    """Produce one event on the page "/_tick" at `event_time_ms`, so that
    the watermark moves past the last windows and their counts are written
    (in append mode a window closes only when later events arrive)."""
    value = json.dumps({"page": "/_tick", "user": "-", "time_ms": event_time_ms})
    with Producer(bootstrap_servers=bootstrap, acks="all") as producer:
        producer.send(topic, value.encode(), key=b"/_tick").get(timeout=30)


def follow_counts(
    bootstrap: str,
    topic: str,
    stop: threading.Event,
    counts: Counts,
    *,
    partitions: int = 2,
    echo: Callable[[str], None] | None = print,
) -> None:
    """Read the counts topic from the beginning until `stop` is set, printing
    each count (when `echo`) and recording when it was seen."""
    with Consumer(bootstrap_servers=bootstrap) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        while not stop.is_set():
            for records in consumer.poll(timeout_ms=200).values():
                seen_at = time.time()
                for record in records:
                    count = json.loads(record.value)
                    group = (count["page"], count["window_start_ms"])
                    counts.updates[group].append((count["count"], seen_at))
                    if echo is not None:
                        start = time.strftime("%H:%M:%S", time.gmtime(group[1] / 1000))
                        echo(f"{start}  {count['page']:<10} {count['count']:>6} views")


def latencies(sent: list[SentEvent], counts: Counts) -> list[float]:
    """Seconds from producing each event to the first count including it
    (a page's views are counted in the order produced: one key, one
    partition). Events never counted are left out (see `missing`)."""
    by_group: dict[tuple[str, int], list[SentEvent]] = defaultdict(list)
    for event in sent:
        by_group[(event.page, event.window_start_ms)].append(event)
    out = []
    for group, group_events in by_group.items():
        seen = sorted(counts.updates.get(group, []), key=lambda u: u[1])
        for k, event in enumerate(group_events):
            first = next((at for count, at in seen if count >= k + 1), None)
            if first is not None:
                out.append(max(0.0, first - event.sent_at))
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def wait_for_counts(
    sent: list[SentEvent], counts: Counts, timeout_s: float, query: Any = None
) -> dict[tuple[str, int], int]:
    """Until every event is counted (the final counts equal what was sent),
    or the query stopped; returns the groups still short."""
    expected: dict[tuple[str, int], int] = defaultdict(int)
    for event in sent:
        expected[(event.page, event.window_start_ms)] += 1
    deadline = time.monotonic() + timeout_s
    while True:
        final = counts.final()
        short = {g: n for g, n in expected.items() if final.get(g, 0) != n}
        if not short or time.monotonic() > deadline:
            return short
        if query is not None and not query.isActive:
            raise RuntimeError(f"the counting query stopped: {query.exception()}")
        time.sleep(0.2)


def spark_session() -> Any:
    """A local Spark session bound to loopback, its UI off."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.appName("tidelog-page-views")
        .master("local[2]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def run(
    spark: Any,
    bootstrap: str,
    *,
    events: int,
    rate: float,
    source: str = "page-views",
    sink: str = "page-view-counts",
    window_s: int = 2,
    watermark_s: int = 1,
    trigger: str = "0 seconds",
    echo: Callable[[str], None] | None = print,
    timeout_s: float = 120,
) -> dict[str, Any]:
    """The whole pipeline once; returns what it measured."""
    create_topics(bootstrap, source, sink)
    counts = Counts()
    stop = threading.Event()
    follower = threading.Thread(
        target=follow_counts, args=(bootstrap, sink, stop, counts), kwargs={"echo": echo}
    )
    with tempfile.TemporaryDirectory(prefix="page-views-checkpoint-") as checkpoint:
        query = count_views(
            spark,
            bootstrap,
            source,
            sink,
            checkpoint,
            window=f"{window_s} seconds",
            trigger=trigger,
        )
        follower.start()
        try:
            # Let the first (slow) micro-batch pass before measuring.
            while query.lastProgress is None and query.isActive:
                time.sleep(0.2)
            sent = produce_page_views(
                bootstrap, source, events=events, rate=rate, window_s=window_s
            )
            last_ms = max(e.window_start_ms for e in sent)
            close_windows(bootstrap, source, last_ms + (2 * window_s + watermark_s) * 1000)
            short = wait_for_counts(sent, counts, timeout_s, query)
            progress = query.recentProgress
        finally:
            stop.set()
            follower.join()
            query.stop()
    measured = latencies(sent, counts)
    batch_ms = sorted(p["durationMs"].get("triggerExecution", 0) for p in progress)
    return {
        "events": len(sent),
        "rate": rate,
        "groups": len(counts.updates),
        "uncounted_groups": len(short),
        "latency_p50_s": percentile(measured, 0.50) if measured else None,
        "latency_p99_s": percentile(measured, 0.99) if measured else None,
        # A count waits for its window to close and then for micro-batches.
        "micro_batch_median_ms": batch_ms[len(batch_ms) // 2] if batch_ms else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--bootstrap", default=os.environ.get("TIDELOG_BOOTSTRAP", "127.0.0.1:9392")
    )
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=1000.0, help="events per second")
    parser.add_argument("--window-s", type=int, default=2)
    parser.add_argument("--watermark-s", type=int, default=1)
    parser.add_argument("--source", default="page-views")
    parser.add_argument("--sink", default="page-view-counts")
    args = parser.parse_args(argv)
    spark = spark_session()
    try:
        result = run(
            spark,
            args.bootstrap,
            events=args.events,
            rate=args.rate,
            source=args.source,
            sink=args.sink,
            window_s=args.window_s,
            watermark_s=args.watermark_s,
        )
    finally:
        spark.stop()
    print(
        f"{result['events']} events at {result['rate']:.0f}/s, {result['groups']} (page, window) "
        f"counts; produce -> count in the output topic: p50 {result['latency_p50_s']:.3f} s, "
        f"p99 {result['latency_p99_s']:.3f} s (micro-batches: median "
        f"{result['micro_batch_median_ms']} ms)"
    )
    return 1 if result["uncounted_groups"] else 0


if __name__ == "__main__":
    sys.exit(main())
