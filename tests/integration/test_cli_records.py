"""`tidelog produce` and `tidelog consume` as Kafka and kcat users type them,
against a real broker: headers, tombstones and timestamps in, a format
string, JSON lines and the print options out, exit at the end of the
partitions, offsets relative to the end, client properties, and the global
option before the subcommand."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest
from tidelog import Producer

from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(90)


def tidelog(
    broker: BrokerProcess, *args: str, stdin: bytes = b"", code: int = 0
) -> subprocess.CompletedProcess[bytes]:
    """The global option first, as kafka-topics users type it."""
    result = subprocess.run(
        [sys.executable, "-m", "tidelog.cli", "--bootstrap-server", broker.address, *args],
        input=stdin,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == code, result.stderr.decode()
    return result


def test_headers_tombstones_and_timestamps_in_json_lines_out(
    broker: BrokerProcess, topic_name: str
) -> None:
    tidelog(broker, "topics", "create", topic_name)
    lines = (
        b"source:cli,trace:NULL\t1700000000000\tk1:hello\n"
        b"\t1700000000001\tk1:NULL\n"  # a tombstone for k1, no headers
    )
    produced = tidelog(
        broker, "produce", topic_name, "--parse-headers", "--property", "parse.timestamp=true",
        "--key-separator", ":", "--null-marker", "NULL", stdin=lines,
    )  # fmt: skip
    assert produced.stdout.strip() == b"2 records acknowledged"
    with Producer(bootstrap_servers=broker.address) as producer:
        producer.send(topic_name, b"\xff\xfe binary", key=b"k2").get(timeout=30)
        producer.send(topic_name, b"two\nlines", key=b"k3").get(timeout=30)
        producer.send(topic_name, b"null", key=None).get(timeout=30)

    out = tidelog(broker, "consume", topic_name, "--from-beginning", "-e", "--output", "json")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == 5, out.stdout  # one line per record: the newline stayed escaped
    first, tombstone, binary, multiline, text_null = rows
    assert first["headers"] == [
        {"key": "source", "value": "cli", "value_encoding": "utf8"},
        {"key": "trace", "value": None, "value_encoding": None},
    ]
    assert (first["key"], first["value"], first["timestamp"]) == ("k1", "hello", 1700000000000)
    assert tombstone["value"] is None and tombstone["key"] == "k1" and tombstone["headers"] == []
    assert tombstone["timestamp"] == 1700000000001
    assert binary["value_encoding"] == "base64"
    assert base64.b64decode(binary["value"]) == b"\xff\xfe binary"
    assert multiline["value"] == "two\nlines"
    assert text_null["value"] == "null" and text_null["key"] is None
    assert [row["offset"] for row in rows] == [0, 1, 2, 3, 4]


def test_format_string_and_print_options(broker: BrokerProcess, topic_name: str) -> None:
    tidelog(broker, "topics", "create", topic_name)
    tidelog(
        broker, "produce", topic_name, "--parse-headers", "--timestamp", "1700000000000",
        "--key-separator", "=", stdin=b"h:1\tk=v\n",
    )  # fmt: skip
    kcat = tidelog(
        broker, "consume", topic_name, "--from-beginning", "-e",
        "-f", r"%t/%p/%o key=%k(%K) value=%s(%S) at %T [%h]\n",
    )  # fmt: skip
    assert kcat.stdout == f"{topic_name}/0/0 key=k(1) value=v(1) at 1700000000000 [h=1]\n".encode()
    kafka = tidelog(
        broker, "consume", topic_name, "--from-beginning", "-e", "--print-timestamp",
        "--print-headers", "--print-key", "--print-offset",
    )  # fmt: skip
    assert kafka.stdout == b"CreateTime:1700000000000\t0:0\th:1\tk\tv\n"


def test_exit_at_end_and_offsets_relative_to_the_end(
    broker: BrokerProcess, topic_name: str
) -> None:
    tidelog(broker, "topics", "create", topic_name, "--partitions", "2")
    for partition in (0, 1):
        lines = "".join(f"p{partition}-{i}\n" for i in range(5)).encode()
        tidelog(broker, "produce", topic_name, "--partition", str(partition), stdin=lines)
    # No --timeout-ms: -e alone ends the command (a hang fails on the test's timeout).
    everything = tidelog(broker, "consume", topic_name, "--from-beginning", "--exit-at-end")
    assert sorted(everything.stdout.splitlines()) == sorted(
        f"p{p}-{i}".encode() for p in (0, 1) for i in range(5)
    )
    last_two = tidelog(broker, "consume", topic_name, "--offset", "-2", "-e")
    assert sorted(last_two.stdout.splitlines()) == [b"p0-3", b"p0-4", b"p1-3", b"p1-4"]
    more_than_there_is = tidelog(broker, "consume", topic_name, "-o", "-50", "-p", "1", "-e")
    assert more_than_there_is.stdout.splitlines() == [f"p1-{i}".encode() for i in range(5)]
    at_the_end = tidelog(broker, "consume", topic_name, "-e")  # starts at the end: nothing
    assert at_the_end.stdout == b""


def test_client_properties_and_their_errors(broker: BrokerProcess, topic_name: str) -> None:
    tidelog(broker, "topics", "create", topic_name)
    tidelog(
        broker, "produce", topic_name, "--producer-property", "linger.ms=0",
        "--producer-property", "enable.idempotence=true", "--acks", "all",
        stdin=b"a\nb\nc\n",
    )  # fmt: skip
    one_per_poll = tidelog(
        broker, "consume", topic_name, "--from-beginning", "-e",
        "--consumer-property", "max.poll.records=1", "--max-messages", "2",
    )  # fmt: skip
    assert one_per_poll.stdout == b"a\nb\n"
    bad = tidelog(
        broker, "produce", topic_name, "--producer-property", "linger.ms=soon",
        stdin=b"x\n", code=2,
    )  # fmt: skip
    assert b"linger.ms" in bad.stderr
    unknown = tidelog(
        broker, "consume", topic_name, "--consumer-property", "fetch.max.wait=1", code=2
    )
    assert b"unknown property 'fetch.max.wait'" in unknown.stderr
    bad_line = tidelog(
        broker, "produce", topic_name, "--parse-headers", stdin=b"h:1\tok\nno headers\n", code=2
    )
    assert b"line 2" in bad_line.stderr and b"1 records acknowledged" in bad_line.stdout
