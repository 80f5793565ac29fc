"""The settings of every Spark driver in these tests: the session fixture's
(conftest.py) and those of the driver processes tests start themselves
(stream_driver.py): local[2], bound to loopback, UI off, Python workers
running this interpreter, scratch space where the test says."""

from __future__ import annotations

import sys
from pathlib import Path


def spark_environment() -> dict[str, str]:
    """What a Spark driver process of these tests needs in its environment."""
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def spark_builder_config(scratch: Path) -> dict[str, str]:
    """The session's settings (also used by the driver processes that
    tests start themselves)."""
    return {
        "spark.master": "local[2]",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.local.dir": str(scratch),
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={scratch}",
    }
