"""The columnar consume workloads of the benchmark (bench/workloads.py
`consume_arrow`, bench/report.py): the read check counts only the rows a
batch holds, and a `_arrow` workload is compared with the same consume
workload's Kafka run."""

from __future__ import annotations

import crc32c
import pyarrow as pa
import pytest

from bench import report, workloads


@pytest.mark.parametrize(("value", "times"), [(b"x" * 100, 0), (b"ab", 1), (b"v" * 1024, 5000)])
def test_repeated_crc_is_the_crc_of_the_repeated_value(value: bytes, times: int) -> None:
    assert workloads._repeated_crc32c(value, times) == crc32c.crc32c(value * times)


def test_the_value_span_is_the_rows_of_a_sliced_batch() -> None:
    batch = pa.RecordBatch.from_pydict(
        {"key": [None] * 4, "value": [b"a", b"bb", b"ccc", b"dddd"]},
        schema=pa.schema([("key", pa.binary()), ("value", pa.binary())]),
    )
    batch = pa.RecordBatch.from_arrays(
        [batch.column(0), batch.column(1), *([pa.array([0, 1, 2, 3])] * 3)],
        names=["key", "value", "a", "b", "c"],
    )
    assert bytes(workloads._value_span(batch)) == b"abbcccdddd"
    assert bytes(workloads._value_span(batch.slice(1, 2))) == b"bbccc"


def test_an_arrow_workload_is_compared_with_the_kafka_run_of_its_consume_workload() -> None:
    def row(workload: str, system: str, rps: float) -> dict[str, object]:
        return {"workload": workload, "system": system, "records_per_s": rps}

    results = [
        row("consume_100B_5M", "tidelog", 1_000_000.0),
        row("consume_100B_5M_arrow", "tidelog", 5_000_000.0),
        row("consume_100B_5M", "kafka", 2_000_000.0),
    ]
    got = {e["workload"]: e["records_per_s"] for e in report.ratios(results, "kafka")}
    assert got == {"consume_100B_5M": 0.5, "consume_100B_5M_arrow": 2.5}
