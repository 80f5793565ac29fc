"""A Spark driver in its own process, for the test that kills one with SIGKILL.

Reads a topic with the tidelog source and writes each micro-batch into an
idempotent sink: `foreachBatch` writes the batch's (partition, offset,
value) rows to `<out>/batch-<id>.json` through a temp file and a rename, so a
batch that Spark replays after a crash (same id, same offsets) replaces its
file instead of adding one. Between reading the rows and writing the file it
sleeps `--batch-sleep` seconds, so a kill lands in the middle of a batch.
Prints one JSON line per event on stdout ({"event": "batch-start"|
"batch-done", "id": N}) and {"event": "finished"} when an AvailableNow run
ends.

    python -m tests.spark.stream_driver --bootstrap H:P --topic T \\
        --checkpoint DIR --out DIR --scratch DIR [--available-now] \\
        [--max-offsets N] [--batch-sleep S]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tests.spark.session import spark_builder_config, spark_environment


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scratch", type=Path, required=True)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--max-offsets", default="100")
    parser.add_argument("--batch-sleep", type=float, default=0.0)
    args = parser.parse_args()
    os.environ.update(spark_environment())
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("tidelog-stream-driver")
    for key, value in spark_builder_config(args.scratch).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    args.out.mkdir(parents=True, exist_ok=True)

    def write(batch: Any, batch_id: int) -> None:
        say("batch-start", id=batch_id)
        rows = [[r.partition, r.offset, r.value.decode()] for r in batch.collect()]
        time.sleep(args.batch_sleep)
        tmp = args.out / f".batch-{batch_id}.tmp"
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, args.out / f"batch-{batch_id:05d}.json")
        say("batch-done", id=batch_id, rows=len(rows))

    df = (
        spark.readStream.format("tidelog")
        .option("tidelog.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.max_offsets)
        .load()
    )
    writer = df.writeStream.foreachBatch(write).option("checkpointLocation", str(args.checkpoint))
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="100 milliseconds")
    query = writer.start()
    query.awaitTermination()
    say("finished")
    spark.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
