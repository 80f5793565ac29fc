"""The Spark source's numbers: ``python -m bench.spark_bench`` (run by ``make bench``).

Measured in one run, on one machine:

1. Rows per second into Spark's ``noop`` sink, reading N records of 100 bytes (10 million by
   default, ``--records``) spread over ``--partitions`` partitions, by a Trigger.AvailableNow
   stream and by a batch read (``spark.read``):
   - the Tidelog source (``format("tidelog")``) from a local Tidelog broker;
   - the baseline: Spark's own Kafka source (``format("kafka")``, spark-sql-kafka-0-10) reading
     the same number of records of the same size from Apache Kafka 4.4 on this machine
     (bench/kafka_baseline.py runs Kafka; ProducerPerformance writes the records).
   One SparkSession (local[2], loopback, UI off) serves both, in alternating order, ``--repeat``
   times; the report gives each run and the best. The goal (issue 11): Tidelog >= 1.0x Kafka's
   source and >= 1M rows/s.
2. The SDK's columnar read (``Consumer.poll_arrow``: a pyarrow RecordBatch per fetch) against its
   per-record consumer (``Consumer.poll``) on the same Tidelog log, records per second.

Spark's Kafka connector comes from Maven Central (bench/spark-kafka/pom.xml): the version of
pyspark if served, else the nearest one (4.3.0 is not; 4.2.0 is), cached under
``~/.cache/tidelog/spark-kafka-<version>/``. Without Java, Maven or Kafka the baseline is
skipped with the reason printed, and the Tidelog figures are still measured. Results go to
``bench/results/spark.json``. A missed goal prints BELOW; it never fails the run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidelog import Consumer, TopicPartition

from bench import kafka_baseline as kb
from bench import workloads
from bench._processes import tidelog_broker, tmpdir

ROOT = Path(__file__).resolve().parents[1]
POM = ROOT / "bench" / "spark-kafka" / "pom.xml"
#: The connector version: pyspark's own (4.3.0) is not on Maven Central.
CONNECTOR_VERSION = os.environ.get("TIDELOG_SPARK_KAFKA_VERSION", "4.2.0")
RECORD_BYTES = 100


class BaselineUnavailable(Exception):
    pass


def connector_jars(version: str = CONNECTOR_VERSION) -> list[Path]:
    """spark-sql-kafka-0-10 and the jars it needs that pyspark does not ship,
    resolved with Maven once into a cache (a marker holds the pom's hash)."""
    import pyspark

    if shutil.which("java") is None:
        raise BaselineUnavailable("no `java` on PATH (Spark needs Java 17+)")
    cache = Path.home() / ".cache" / "tidelog" / f"spark-kafka-{version}"
    jars = cache / "jars"
    marker = cache / ".resolved"
    want = json.dumps({"version": version, "pom_sha256": kb._sha256(POM)})
    if not (marker.is_file() and marker.read_text() == want):
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BaselineUnavailable("no `mvn` on PATH: Maven fetches spark-sql-kafka-0-10")
        shutil.rmtree(jars, ignore_errors=True)
        cache.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "-f",
                str(POM),
                f"-Dspark.kafka.version={version}",
                "dependency:copy-dependencies",
                f"-DoutputDirectory={jars}",
                "-DincludeScope=runtime",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if proc.returncode != 0:
            raise BaselineUnavailable(
                f"Maven could not fetch spark-sql-kafka-0-10 {version}: {proc.stdout[-2000:]}"
            )
        marker.write_text(want)
    # Only what pyspark lacks: the same library twice on the class path
    # (scala-library, spark-tags) would be a conflict.
    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return sorted(p for p in jars.glob("*.jar") if _artifact(p.name) not in shipped)


def _artifact(jar: str) -> str:
    """`kafka-clients-3.9.2.jar` -> `kafka-clients`."""
    parts = jar.removesuffix(".jar").split("-")
    while parts and parts[-1][:1].isdigit():
        parts.pop()
    return "-".join(parts)


def spark_session(scratch: Path, jars: list[Path]) -> Any:
    os.environ.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
    )
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName("tidelog-spark-bench")
        .master("local[2]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.local.dir", str(scratch))
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "2")
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def noop_stream(spark: Any, fmt: str, options: dict[str, str], checkpoint: Path) -> dict[str, Any]:
    """A Trigger.AvailableNow stream from the start into the noop sink."""
    reader = spark.readStream.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    t0 = time.perf_counter()
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    # The micro-batches alone, without the query's start (planning, the
    # Python source process): Spark's own durations.
    batches_s = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress) / 1000
    return {
        "rows": rows,
        "seconds": round(seconds, 2),
        "rows_per_s": round(rows / seconds),
        "batches_s": round(batches_s, 2),
        "batch_rows_per_s": round(rows / batches_s) if batches_s else None,
    }


def noop_batch(spark: Any, fmt: str, options: dict[str, str]) -> dict[str, Any]:
    """spark.read from the start to the end into the noop sink."""
    reader = spark.read.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    df = reader.load()
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - t0
    return {"seconds": round(seconds, 2)}


def sdk_read(address: str, topic: str, partitions: int, count: int, columnar: bool) -> dict:
    """One Consumer reading the whole topic: poll_arrow or poll, counting rows."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer = Consumer(bootstrap_servers=address, max_poll_records=1_000_000)
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got = 0
        t0 = time.perf_counter()
        deadline = t0 + 600
        while got < count and time.perf_counter() < deadline:
            if columnar:
                for batches in consumer.poll_arrow(timeout_ms=1000).values():
                    got += sum(b.num_rows for b in batches)
            else:
                for records in consumer.poll(timeout_ms=1000).values():
                    got += len(records)
        seconds = time.perf_counter() - t0
    finally:
        consumer.close()
    return {"rows": got, "seconds": round(seconds, 2), "rows_per_s": round(got / seconds)}


def repeat_alternating(
    runs: int, first: Callable[[], dict], second: Callable[[], dict] | None
) -> tuple[list[dict], list[dict]]:
    a: list[dict] = []
    b: list[dict] = []
    for i in range(runs):
        order = [(first, a), (second, b)] if i % 2 == 0 else [(second, b), (first, a)]
        for fn, out in order:
            if fn is not None:
                out.append(fn())
    return a, b


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_bench", description=__doc__)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-kafka", action="store_true", help="skip the Kafka baseline")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    n, parts = args.records, args.partitions
    topic = "spark-bench"
    result: dict[str, Any] = {"records": n, "record_bytes": RECORD_BYTES, "partitions": parts}
    jars: list[Path] = []
    kafka_reason = "--no-kafka" if args.no_kafka else None
    if kafka_reason is None:
        try:
            jars = connector_jars()
            install = kb.ensure_kafka()
        except (BaselineUnavailable, kb.KafkaUnavailable) as exc:
            kafka_reason = str(exc)
    result["connector"] = None if kafka_reason else f"spark-sql-kafka-0-10 {CONNECTOR_VERSION}"
    with tidelog_broker() as broker, tmpdir("tidelog-spark-bench-") as scratch:
        workloads.create_topic(broker.address, topic, parts)
        produced = workloads.produce(
            broker.address, broker.proc.pid if broker.proc else 0, topic, n, RECORD_BYTES,
            workload="spark_bench_produce",
        )  # fmt: skip
        print(f"tidelog: produced {n:,} records of {RECORD_BYTES} B "
              f"({produced['records_per_s']:,.0f}/s)", flush=True)  # fmt: skip
        result["sdk_per_record"] = sdk_read(broker.address, topic, parts, n, columnar=False)
        result["sdk_columnar"] = sdk_read(broker.address, topic, parts, n, columnar=True)
        kafka: kb.KafkaCluster | None = None
        try:
            if kafka_reason is None:
                kafka = kb.KafkaCluster(install)
                kafka.start()
                kb.create_topic(kafka.bootstrap, topic, parts, install=install)
                kb.producer_perf(
                    kafka.bootstrap, topic, n, RECORD_BYTES, acks="1",
                    batch_size=262_144, linger_ms=5, install=install,
                )  # fmt: skip
                print(f"kafka: produced {n:,} records of {RECORD_BYTES} B", flush=True)
            spark = spark_session(scratch / "spark", jars)
            tidelog_options = {
                "tidelog.bootstrap.servers": broker.address,
                "subscribe": topic,
                "startingOffsets": "earliest",
            }
            kafka_options = (
                {
                    "kafka.bootstrap.servers": kafka.bootstrap,
                    "subscribe": topic,
                    "startingOffsets": "earliest",
                }
                if kafka is not None
                else {}
            )
            counter = iter(range(1_000_000))

            def stream_of(fmt: str, options: dict[str, str]) -> Callable[[], dict]:
                return lambda: noop_stream(spark, fmt, options, scratch / f"cp{next(counter)}")

            def batch_of(fmt: str, options: dict[str, str]) -> Callable[[], dict]:
                def run() -> dict:
                    out = noop_batch(spark, fmt, options)
                    out["rows_per_s"] = round(n / out["seconds"])
                    return out

                return run

            # A first small read of each warms the JVM and the Python workers.
            warm = {"endingOffsets": json.dumps({topic: {str(p): 1000 for p in range(parts)}})}
            noop_batch(spark, "tidelog", {**tidelog_options, **warm})
            if kafka is not None:
                noop_batch(spark, "kafka", {**kafka_options, **warm})
            for mode, make in (("stream", stream_of), ("batch", batch_of)):
                ours, theirs = repeat_alternating(
                    args.repeat,
                    make("tidelog", tidelog_options),
                    make("kafka", kafka_options) if kafka is not None else None,
                )
                result[f"{mode}_tidelog"] = ours
                result[f"{mode}_kafka"] = theirs
            spark.stop()
        finally:
            if kafka is not None:
                kafka.stop()
    if kafka_reason:
        result["kafka_skipped"] = kafka_reason
    report(result)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "spark.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


def report(result: dict[str, Any]) -> None:
    n = result["records"]
    print(f"\nSpark source, {n:,} records of {result['record_bytes']} B in "
          f"{result['partitions']} partitions, noop sink, local[2]:")  # fmt: skip
    for mode in ("stream", "batch"):
        ours = [r["rows_per_s"] for r in result.get(f"{mode}_tidelog", [])]
        theirs = [r["rows_per_s"] for r in result.get(f"{mode}_kafka", [])]
        if not ours:
            continue
        line = f"  {mode:6} tidelog {max(ours):>12,} rows/s (runs: {ours})"
        if mode == "stream":
            inner = [r["batch_rows_per_s"] for r in result[f"{mode}_tidelog"]]
            inner_k = [r["batch_rows_per_s"] for r in result.get(f"{mode}_kafka", [])]
            print(f"  stream, micro-batches only (Spark's triggerExecution): tidelog {inner}, "
                  f"kafka source {inner_k}")  # fmt: skip
        if theirs:
            ratio = max(ours) / max(theirs)
            line += f"; kafka source {max(theirs):>12,} rows/s (runs: {theirs}); {ratio:.2f}x"
            if ratio < 1.0:
                line += "  BELOW the 1.0x goal"
        if max(ours) < 1_000_000:
            line += "  BELOW the 1M rows/s goal"
        print(line)
    if "kafka_skipped" in result:
        print(f"  (Kafka baseline skipped: {result['kafka_skipped']})")
    per_record, columnar = result["sdk_per_record"], result["sdk_columnar"]
    print(f"SDK, one Consumer reading the same log: poll_arrow {columnar['rows_per_s']:,} rows/s, "
          f"poll {per_record['rows_per_s']:,} records/s "
          f"({columnar['rows_per_s'] / per_record['rows_per_s']:.1f}x)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
