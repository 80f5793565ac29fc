"""A Spark driver process for tests/spark/test_sink_driver_kill.py: a stream
from one topic to another through the tidelog sink, run to its end
(Trigger.AvailableNow, 100 records per micro-batch).

With `--hang-in-commit N` the sink's commit of batch N writes `--marker` and
then waits forever: the batch's records are written, and Spark has not
recorded the batch as done; the test kills this process there (SIGKILL).

    python tests/spark/sink_driver.py BOOTSTRAP SOURCE SINK CHECKPOINT SCRATCH \
        [--hang-in-commit N --marker PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.spark.session import spark_builder_config, spark_environment


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "source", "sink", "checkpoint", "scratch"):
        parser.add_argument(name)
    parser.add_argument("--hang-in-commit", type=int, default=-1)
    parser.add_argument("--marker", default="")
    args = parser.parse_args()

    os.environ.update(spark_environment())
    from pyspark.sql import SparkSession
    from tidelog.spark.datasource import TidelogDataSource
    from tidelog.spark.sink import TidelogStreamWriter

    hang_in, marker = args.hang_in_commit, args.marker

    # Defined in __main__: pickled by value to the process running commit().
    class HangInCommit(TidelogStreamWriter):
        def commit(self, messages: list[Any], batchId: int) -> None:
            if batchId == hang_in:
                Path(marker).write_text(str(batchId))
                while True:
                    time.sleep(1)
            super().commit(messages, batchId)

    class HangingSink(TidelogDataSource):
        @classmethod
        def name(cls) -> str:
            return "tidelog_hangs_in_commit"

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            writer = super().streamWriter(schema, overwrite)
            return HangInCommit(writer._options)

    builder = SparkSession.builder.appName("tidelog-sink-driver")
    for key, value in spark_builder_config(Path(args.scratch)).items():
        builder = builder.config(key, value)
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(HangingSink)
    query = (
        spark.readStream.format("tidelog")
        .option("tidelog.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 100)
        .load()
        .select("key", "value")
        .writeStream.format("tidelog_hangs_in_commit" if hang_in >= 0 else "tidelog")
        .option("tidelog.bootstrap.servers", args.bootstrap)
        .option("topic", args.sink)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    # Progress in the log, for a test that fails.
    while not query.awaitTermination(2):
        progress = query.lastProgress
        print("progress:", progress and progress["batchId"], query.status["message"], flush=True)
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    spark.stop()


if __name__ == "__main__":
    main()
