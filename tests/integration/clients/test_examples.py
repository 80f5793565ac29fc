"""The Go, Java and TypeScript example programs (examples/go, examples/java,
examples/typescript), built by their build scripts from protos/ and run
against a real cluster through the gateway: each produces keyed records with
headers through `tidelog.v1.Records` (the Go one also through the batch-level
`Log`, with its own record-batch encoder) and consumes them back as a member
of a consumer group, committing as it goes, and exits non-zero naming what did
not come back intact. The Python SDK then reads the same topic, so the records
are checked by a second client too, not only by the program that wrote them;
and the group's committed offsets must be the log end offsets (every record
was committed)."""

from __future__ import annotations

import subprocess
import time

import pytest
from tidelog import AdminClient, Consumer, OffsetSpec, TopicPartition
from tidelog.partitioner import partition_for_key

from tests.integration.clients.conftest import build
from tests.support.gateway import GatewayProcess

# Generous: the first run on a machine builds the tools and the example (minutes).
pytestmark = pytest.mark.timeout(900)

RECORDS = 1000
PARTITIONS = 3
RUN_TIMEOUT_S = 120


def run_example(command: list[str]) -> str:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    assert result.returncode == 0, f"{command[0]} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def read_with_python(gateway: GatewayProcess, topic: str, count: int) -> list:
    """The first `count` records of the topic's 3 partitions, read with the Python SDK."""
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    got = []
    with Consumer(bootstrap_servers=gateway.address) as consumer:
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                got.extend(records)
    return got


def assert_group_committed_everything(gateway: GatewayProcess, group: str, topic: str) -> None:
    """The group's committed offsets are the topic's log end offsets."""
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with AdminClient(bootstrap_servers=gateway.address) as admin:
        ends = admin.list_offsets(dict.fromkeys(partitions, OffsetSpec.latest()))
        committed = admin.list_consumer_group_offsets(group, partitions)
    # A partition the group never committed is absent (or at -1): None here.
    got = {tp.partition: getattr(committed.get(tp), "offset", None) for tp in partitions}
    assert got == {tp.partition: ends[tp].offset for tp in partitions}, f"group {group}"
    assert sum(ends[tp].offset for tp in partitions) == RECORDS


@pytest.mark.parametrize(
    ("language", "api"),
    [("go", "records"), ("go", "log"), ("java", "records"), ("typescript", "records")],
)
def test_example_produces_and_consumes_through_the_gateway(
    request: pytest.FixtureRequest, language: str, api: str
) -> None:
    # Built before the cluster starts: a machine without the toolchain skips at once.
    if language == "go":
        program = [str(build("examples/go/build.sh")), "-api", api]
    elif language == "typescript":
        program = ["node", str(build("examples/typescript/build.sh"))]
    else:
        program = ["java", "-jar", str(build("examples/java/build.sh"))]
    gateway: GatewayProcess = request.getfixturevalue("gateway")
    topic = f"{language}-{api}-example"
    group = f"{topic}-group"
    # Go's flag package takes -name and --name alike; the Java example takes --name.
    command = [*program, "--gateway", gateway.address, "--topic", topic, "--group", group]
    out = run_example([*command, "--records", str(RECORDS)])
    assert (
        f"produced and consumed {RECORDS} records in {PARTITIONS} partitions in group {group}, "
        "committed" in out
    )
    assert_group_committed_everything(gateway, group, topic)

    # What the program wrote, as another client reads it: with the program's
    # value and headers, keyed by Kafka's partitioner through Records (the
    # Log path chooses partitions itself: record i in partition i % 3).
    records = read_with_python(gateway, topic, RECORDS)
    assert sorted(r.key for r in records) == sorted(f"key-{i}".encode() for i in range(RECORDS))
    for r in records:
        i = int(r.key.removeprefix(b"key-"))
        if api == "records":
            assert r.partition == partition_for_key(r.key, PARTITIONS)
        else:
            assert r.partition == i % PARTITIONS
        assert r.value == f"value-{i}".encode()
        assert list(r.headers) == [
            ("seq", str(i).encode()),
            ("client", language.encode()),
        ]
