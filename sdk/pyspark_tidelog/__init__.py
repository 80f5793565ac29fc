"""`format("tidelog")` without a register call.

PySpark looks, when a session starts, for installed top-level modules named
`pyspark_<name>` that define `DefaultSource` (a DataSource subclass), and
registers each under its `name()`. This module is that hook for Tidelog's
data source (`tidelog.spark`); `spark.dataSource.register(TidelogDataSource)`
does the same by hand.
"""

from tidelog.spark.datasource import TidelogDataSource as DefaultSource

__all__ = ["DefaultSource"]
