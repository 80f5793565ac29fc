"""Tidelog for Apache Spark: a Python data source named "tidelog" (the `spark` extra).

    spark.readStream.format("tidelog")
        .option("tidelog.bootstrap.servers", "127.0.0.1:9392")
        .option("subscribe", "events")
        .load()

The options, semantics and row schema are those of Spark's Kafka source
(`tidelog.spark.options` lists them), so a job moves from Kafka by changing
the format name and the servers option. The installed module
`pyspark_tidelog` makes `format("tidelog")` work without registering;
`spark.dataSource.register(TidelogDataSource)` does it by hand.

- `datasource`: the DataSource (schema, readers; the sink's writers);
- `options`: the options, checked when a query starts;
- `offsets`: the driver's view of partitions and offsets, and the planning
  of offset ranges into Spark tasks;
- `stream_reader`, `batch_reader`: `spark.readStream` and `spark.read`;
- `read`: what a Spark task runs: one offset range as Arrow record batches
  (`tidelog.columnar`), no Python object per record.
"""

from tidelog.spark.datasource import TidelogDataSource

__all__ = ["TidelogDataSource"]
