"""The Spark pipeline's numbers: ``python -m bench.spark_pipeline_bench`` (``make demo-spark``).

On a throwaway cluster (etcd, a coordinator, one broker; loopback) and one
local[2] Spark session (loopback, UI off), it measures and prints:

1. the example pipeline (examples/spark/page_views.py) at a steady event
   rate (default 1,000 events/s): the time from producing a page view to the
   first count that includes it appearing in the output topic, p50 and p99.
   Windows of 2 s, a watermark of 1 s, append mode: a view waits for its
   window to close (on average half a window plus the watermark) and then for
   a micro-batch or two, so these figures are mostly the window's;
2. the sink's throughput: rows per second written by
   ``df.write.format("tidelog")`` (100-byte values, no key: round-robin over
   4 partitions), beside ``format("noop")`` on the same DataFrame (what Spark
   itself costs to make and hand over the rows), and the sink's task writer
   alone, fed Arrow batches in one process (no Spark);
3. the baseline: Spark's own Kafka sink (``format("kafka")``, spark-sql-kafka-0-10
   from Maven Central, as bench/spark_bench.py gets it) writing the same
   DataFrame to Apache Kafka 4.4 on this machine, with the Kafka producer's
   defaults (acks=all); skipped, saying why, without Java, Maven or Kafka
   (or with ``--no-kafka``).

``--demo`` (``make demo-spark``) prints every count as the consumer sees it.
Writes ``bench/results/spark_pipeline.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bench import kafka_baseline as kb
from bench import spark_bench
from bench._processes import tidelog_cluster, tmpdir

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "spark" / "page_views.py"
RESULTS = ROOT / "bench" / "results" / "spark_pipeline.json"
VALUE_BYTES = 100
SINK_PARTITIONS = 4


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("page_views_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def sink_throughput(
    spark: Any, bootstrap: str, rows: int, kafka_bootstrap: str | None, kafka_topic: str
) -> dict[str, float]:
    """Rows per second into format("noop"), format("tidelog") and (with a
    Kafka) format("kafka"), warm (the better of two runs each)."""
    from pyspark.sql import functions as F
    from tidelog import AdminClient, NewTopic

    topic = f"sink-bench-{uuid.uuid4().hex[:8]}"
    with AdminClient(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(topic, SINK_PARTITIONS, 1)])
    df = spark.range(rows, numPartitions=2).select(
        F.lpad(F.col("id").cast("string"), VALUE_BYTES, "x").cast("binary").alias("value")
    )
    out: dict[str, float] = {}
    writers: list[tuple[str, Callable[[], None]]] = [
        ("noop", lambda: df.write.format("noop").mode("overwrite").save()),
        (
            "tidelog",
            lambda: (
                df.write.format("tidelog")
                .mode("append")
                .option("tidelog.bootstrap.servers", bootstrap)
                .option("topic", topic)
                .save()
            ),
        ),
    ]
    if kafka_bootstrap is not None:
        writers.append(
            (
                "kafka",
                lambda: (
                    df.write.format("kafka")
                    .mode("append")
                    .option("kafka.bootstrap.servers", kafka_bootstrap)
                    .option("topic", kafka_topic)
                    .save()
                ),
            )
        )
    for name, write in writers:
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            write()
            best = min(best, time.perf_counter() - start)
        out[name] = rows / best
    return out


def task_writer_throughput(bootstrap: str, rows: int) -> float:
    """Rows per second through the sink's task writer alone (Arrow batches of
    10,000 rows, one process, no Spark)."""
    import pyarrow as pa
    from tidelog import AdminClient, NewTopic
    from tidelog.config import ProducerConfig
    from tidelog.spark.sink_task import run_task

    topic = f"task-bench-{uuid.uuid4().hex[:8]}"
    with AdminClient(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(topic, SINK_PARTITIONS, 1)])
    batch = pa.RecordBatch.from_arrays(
        [pa.array([b"x" * VALUE_BYTES] * 10_000, pa.binary())], names=["value"]
    )
    config = ProducerConfig(bootstrap_servers=bootstrap, acks="all")
    start = time.perf_counter()
    result = run_task(config, topic, f"bench-{uuid.uuid4()}", iter([batch] * (rows // 10_000)))
    elapsed = time.perf_counter() - start
    return result.total / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="page views per second")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to produce")
    parser.add_argument("--sink-rows", type=int, default=2_000_000)
    parser.add_argument("--demo", action="store_true", help="print every count as it arrives")
    parser.add_argument("--no-kafka", action="store_true", help="skip Kafka's sink")
    args = parser.parse_args(argv)

    example = load_example()
    results: dict[str, Any] = {}
    jars: list[Path] = []
    kafka_reason = "--no-kafka" if args.no_kafka else None
    if kafka_reason is None:
        try:
            jars = spark_bench.connector_jars()
            install = kb.ensure_kafka()
        except (spark_bench.BaselineUnavailable, kb.KafkaUnavailable) as exc:
            kafka_reason = str(exc)
    kafka: kb.KafkaCluster | None = None
    with tidelog_cluster(brokers=1) as cluster, tmpdir("tidelog-spark-pipeline-") as scratch:
        spark = spark_bench.spark_session(scratch, jars)
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        try:
            print(
                f"pipeline: {args.rate:.0f} page views/s for {args.seconds:.0f} s "
                "(2 s windows, 1 s watermark, append mode) ...",
                flush=True,
            )
            pipeline = example.run(
                spark,
                cluster.bootstrap,
                events=int(args.rate * args.seconds),
                rate=args.rate,
                echo=print if args.demo else None,
                timeout_s=120,
            )
            results["pipeline"] = pipeline
            print(
                f"pipeline: {pipeline['events']} events, {pipeline['groups']} (page, window) "
                f"counts, {pipeline['uncounted_groups']} short; produce -> count in the output "
                f"topic p50 {pipeline['latency_p50_s']:.3f} s, p99 "
                f"{pipeline['latency_p99_s']:.3f} s (micro-batches: median "
                f"{pipeline['micro_batch_median_ms']} ms)",
                flush=True,
            )
            print(f"sink: {args.sink_rows:,} rows of {VALUE_BYTES} B ...", flush=True)
            kafka_topic = "spark-sink-bench"
            if kafka_reason is None:
                kafka = kb.KafkaCluster(install)
                kafka.start()
                kb.create_topic(kafka.bootstrap, kafka_topic, SINK_PARTITIONS, install=install)
            sink = sink_throughput(
                spark,
                cluster.bootstrap,
                args.sink_rows,
                kafka.bootstrap if kafka is not None else None,
                kafka_topic,
            )
        finally:
            spark.stop()
            if kafka is not None:
                kafka.stop()
        task = task_writer_throughput(cluster.bootstrap, args.sink_rows)
    results["sink_rows_per_s"] = {**sink, "task_writer_alone": task}
    print(f"  format('noop')        {sink['noop']:>12,.0f} rows/s  (Spark alone)")
    print(f"  format('tidelog')     {sink['tidelog']:>12,.0f} rows/s  (exactly once, acks=all)")
    if "kafka" in sink:
        ratio = sink["tidelog"] / sink["kafka"]
        print(
            f"  format('kafka')       {sink['kafka']:>12,.0f} rows/s  (at least once, Kafka 4.4, "
            f"spark-sql-kafka {spark_bench.CONNECTOR_VERSION}); tidelog/kafka {ratio:.2f}x"
        )
    else:
        results["kafka_sink_skipped"] = kafka_reason
        print(f"  format('kafka')       skipped: {kafka_reason}")
    print(f"  task writer, no Spark {task:>12,.0f} rows/s")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 1 if pipeline["uncounted_groups"] else 0


if __name__ == "__main__":
    sys.exit(main())
