"""The "tidelog" data source: what Spark asks for by format name.

Spark creates a `TidelogDataSource` with the options of `format("tidelog")`,
asks it for the schema, then for a reader (`spark.read`), a stream reader
(`spark.readStream`) or, for the sink, a writer. The readers check their
options when created, on the driver, so a bad option fails the query at
start. The instance is pickled to Spark's Python workers: it holds only the
options.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidelog.spark import options as source_options

NAME = "tidelog"

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
#: The rows of Spark's Kafka source (`headers` only with includeHeaders=true).
SOURCE_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
SOURCE_SCHEMA_WITH_HEADERS = StructType(
    [*SOURCE_SCHEMA.fields, StructField("headers", HEADERS_TYPE)]
)


class TidelogDataSource(DataSource):
    """`format("tidelog")`: Tidelog topics as Spark rows (see tidelog.spark)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        include_headers = (source_options.get(self.options, "includeHeaders") or "").strip()
        if include_headers.lower() == "true":
            return SOURCE_SCHEMA_WITH_HEADERS
        return SOURCE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        from tidelog.spark.batch_reader import TidelogBatchReader

        return TidelogBatchReader(source_options.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from tidelog.spark.stream_reader import TidelogStreamReader

        return TidelogStreamReader(source_options.parse(self.options, streaming=True))

    # The sink (tidelog.spark.sink): columns and options checked on the driver.
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from tidelog.spark.sink import TidelogBatchWriter, start

        return TidelogBatchWriter(start(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from tidelog.spark.sink import TidelogStreamWriter, start

        return TidelogStreamWriter(start(self.options, schema, overwrite, streaming=True))
