"""The benchmark's columnar consume (bench/workloads.py `consume_arrow`)
against a real broker: it counts every row of a log once, and its check
fails on a log whose values are not the ones it expects, so a fast figure
cannot come from data it skipped or misread."""

from __future__ import annotations

import pytest
from tidelog import Producer

from bench import workloads
from tests.support.processes import BrokerProcess


def write(address: str, topic: str, values: list[bytes]) -> None:
    with Producer(address, batch_size=4096, linger_ms=5) as producer:
        for value in values:
            producer.send(topic, value)
        producer.flush(30)


def test_every_row_is_counted_once_and_checked(broker: BrokerProcess, topic_name: str) -> None:
    write(broker.address, topic_name, [b"v" * 100] * 3000)
    result = workloads.consume_arrow(
        broker.address, broker.pid, topic_name, 2500, 100, workload="w", fetch_bytes=16 * 1024
    )
    assert result["records"] == 2500  # the last batch cut at the count
    assert result["detail"]["checked"]["rows"] == 2500
    assert result["detail"]["checked"]["value_bytes"] == 2500 * 100
    assert "short_by" not in result["detail"]


def test_a_value_that_differs_fails_the_check(broker: BrokerProcess, topic_name: str) -> None:
    values = [b"v" * 100] * 2000
    values[1500] = b"w" * 100
    write(broker.address, topic_name, values)
    with pytest.raises(RuntimeError, match="do not match"):
        workloads.consume_arrow(broker.address, broker.pid, topic_name, 2000, 100, workload="w")
