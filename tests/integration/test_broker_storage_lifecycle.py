"""Storage lifecycle through a real broker process: topic configs (describe,
alter, cluster defaults from the config file, persisted, live), retention and
compaction run by the broker's background tasks, forced compression, keyless
records refused by compacted topics, LogAppendTime end to end, and
`tidelog consume --from-time`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from tidelog import records
from tidelog.admin import AdminClient
from tidelog.compression import CompressionType
from tidelog.errors import InvalidConfigError
from tidelog.types import NewTopic
from tidelog.v1 import common_pb2, log_pb2, log_pb2_grpc

from tests.support.processes import BrokerProcess, start_broker

pytestmark = pytest.mark.timeout(120)

HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def lifecycle_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with cluster defaults from a config file and fast background tasks."""
    root = tmp_path_factory.mktemp("lifecycle")
    config_file = root / "broker.properties"
    config_file.write_text(
        "# cluster-wide defaults, Kafka's names\n"
        "log.retention.ms=7200000\n"
        "log.segment.bytes=4096\n"
        "log.retention.check.interval.ms=100\n"
        "log.cleaner.backoff.ms=100\n"
    )
    process = start_broker(
        root / "data", extra_args=("--auto-create-topics", "--config", str(config_file))
    )
    try:
        yield process
    finally:
        process.stop()


def _produce(
    address: str, topic: str, batch: bytes, partition: int = 0
) -> log_pb2.PartitionProduceResult:
    request = log_pb2.ProduceRequest(
        correlation_id=1,
        acks=1,
        partitions=[log_pb2.PartitionRecords(topic=topic, partition=partition, records=batch)],
    )
    with grpc.insecure_channel(address) as channel:
        (response,) = list(log_pb2_grpc.LogStub(channel).Produce(iter([request]), timeout=10))
    return response.partitions[0]


def _list_offset(address: str, topic: str, timestamp_ms: int) -> log_pb2.ListOffsetsResult:
    with grpc.insecure_channel(address) as channel:
        response = log_pb2_grpc.LogStub(channel).ListOffsets(
            log_pb2.ListOffsetsRequest(
                partitions=[
                    log_pb2.ListOffsetsPartition(
                        topic=topic, partition=0, timestamp_ms=timestamp_ms
                    )
                ]
            ),
            timeout=10,
        )
    return response.partitions[0]


def _fetch(address: str, topic: str, offset: int) -> list[log_pb2.PartitionData]:
    """One Fetch response's partition data from `offset` (errors included)."""
    with grpc.insecure_channel(address) as channel:
        call = log_pb2_grpc.LogStub(channel).Fetch(
            iter(
                [
                    log_pb2.FetchRequest(
                        positions=[
                            log_pb2.FetchPosition(topic=topic, partition=0, fetch_offset=offset)
                        ],
                        credit_bytes=1 << 24,
                        max_bytes=1 << 24,
                        max_wait_ms=100,
                    )
                ]
            ),
            timeout=10,
        )
        response = next(call)
        call.cancel()
    return list(response.partitions)


def _read_all(address: str, topic: str) -> list[records.DecodedBatch]:
    start = _list_offset(address, topic, -2).offset
    end = _list_offset(address, topic, -1).offset
    out: list[records.DecodedBatch] = []
    offset = start
    while offset < end:
        (data,) = _fetch(address, topic, offset)
        assert not data.HasField("error"), data.error
        out.extend(records.decode_batches(data.records))
        offset = data.next_offset
    return out


def _wait_for(condition, timeout_s: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_configs_describe_alter_defaults_and_restart(
    lifecycle_broker: BrokerProcess, topic_name: str
) -> None:
    address = lifecycle_broker.address
    with AdminClient(bootstrap_servers=address) as admin:
        admin.create_topics([NewTopic(topic_name, topic_configs={"retention.bytes": "100000"})])
        configs = admin.describe_configs([topic_name])[topic_name]
        assert (configs["retention.bytes"].value, configs["retention.bytes"].source) == (
            "100000",
            "topic",
        )
        # From the broker's config file (log.retention.ms): a cluster-wide default.
        assert (configs["retention.ms"].value, configs["retention.ms"].source) == (
            "7200000",
            "broker",
        )
        assert configs["cleanup.policy"].source == "default"
        admin.alter_configs({topic_name: {"retention.ms": "60000", "retention.bytes": None}})
        configs = admin.describe_configs([topic_name])[topic_name]
        assert configs["retention.ms"].value == "60000" and configs["retention.ms"].is_override
        assert (
            configs["retention.bytes"].value == "-1" and not configs["retention.bytes"].is_override
        )
        with pytest.raises(InvalidConfigError, match=r"retention\.msec"):
            admin.alter_configs({topic_name: {"retention.msec": "1"}})
        with pytest.raises(InvalidConfigError, match=r"min.cleanable.dirty.ratio=1.5.*0.0 to 1.0"):
            admin.alter_configs({topic_name: {"min.cleanable.dirty.ratio": "1.5"}})
        with pytest.raises(InvalidConfigError, match=r"cleanup\.policy"):
            admin.alter_configs({topic_name: {"cleanup.policy": "shred"}})
    lifecycle_broker.restart()
    with AdminClient(bootstrap_servers=address) as admin:
        configs = admin.describe_configs([topic_name])[topic_name]
        assert configs["retention.ms"].value == "60000" and configs["retention.ms"].is_override


def test_retention_runs_in_the_broker_and_reads_below_start_are_out_of_range(
    lifecycle_broker: BrokerProcess, topic_name: str
) -> None:
    address = lifecycle_broker.address
    now_ms = int(time.time() * 1000)
    # Half an hour of data from 100 to 70 minutes ago (CreateTime in the
    # past; within the broker's default retention of 2 h), then fresh data.
    for i in range(60):
        ts = now_ms - 100 * 60_000 + i * 30_000
        _produce(address, topic_name, records.encode_batch([b"x" * 300] * 3, base_timestamp=ts))
    for _ in range(20):
        _produce(address, topic_name, records.encode_batch([b"y" * 300] * 3, base_timestamp=now_ms))
    assert _list_offset(address, topic_name, -2).offset == 0
    with AdminClient(bootstrap_servers=address) as admin:
        admin.alter_configs({topic_name: {"retention.ms": str(HOUR_MS)}})  # live, no restart
    _wait_for(lambda: _list_offset(address, topic_name, -2).offset > 0)
    start = _list_offset(address, topic_name, -2).offset
    assert start <= 180  # the fresh data stays
    (data,) = _fetch(address, topic_name, 0)
    assert data.error.code == common_pb2.OFFSET_OUT_OF_RANGE
    assert f"valid offsets are {start} to 240" in data.error.message
    # Time lookups still answer, from what is left.
    found = _list_offset(address, topic_name, now_ms - 3 * HOUR_MS)
    assert found.offset >= start
    assert _list_offset(address, topic_name, now_ms).offset == 180
    lifecycle_broker.restart()
    assert _list_offset(address, topic_name, -2).offset == start


def test_compaction_runs_in_the_broker(lifecycle_broker: BrokerProcess, topic_name: str) -> None:
    address = lifecycle_broker.address
    with AdminClient(bootstrap_servers=address) as admin:
        admin.create_topics(
            [
                NewTopic(
                    topic_name,
                    topic_configs={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"},
                )
            ]
        )
    now_ms = int(time.time() * 1000)
    for i in range(400):
        batch = records.encode_batch(
            [b"value-%d" % i + b"." * 50], keys=[b"key-%d" % (i % 10)], base_timestamp=now_ms
        )
        _produce(address, topic_name, batch)
    with AdminClient(bootstrap_servers=address) as admin:

        def compacted() -> bool:
            (topic,) = admin.describe_topics([topic_name])
            return topic.partitions[0].size_bytes < 12_000

        _wait_for(compacted)
    latest: dict[bytes, bytes] = {}
    offsets: list[int] = []
    for batch in _read_all(address, topic_name):
        for offset, key, value in zip(batch.offsets, batch.keys, batch.values, strict=True):
            assert key is not None and value is not None
            latest[key] = value
            offsets.append(offset)
    assert offsets == sorted(set(offsets)) and len(offsets) < 400
    assert latest == {b"key-%d" % k: b"value-%d" % (390 + k) + b"." * 50 for k in range(10)}
    # Compacted topics refuse records without a key.
    result = _produce(address, topic_name, records.encode_batch([b"no key"]))
    assert result.error.code == common_pb2.INVALID_RECORD
    assert "compacted topic cannot accept message without key" in result.error.message


def test_topic_compression_type_recompresses_batches(
    lifecycle_broker: BrokerProcess, topic_name: str
) -> None:
    address = lifecycle_broker.address
    with AdminClient(bootstrap_servers=address) as admin:
        admin.create_topics([NewTopic(topic_name, topic_configs={"compression.type": "zstd"})])
    values = [b'{"user": %d, "event": "click"}' % i for i in range(50)]
    keys = [b"u%d" % i for i in range(50)]
    timestamps = [1_700_000_000_000 + i for i in range(50)]
    codecs = (CompressionType.NONE, CompressionType.GZIP, CompressionType.ZSTD)
    for n, codec in enumerate(codecs):
        batch = records.encode_batch(
            values,
            keys=keys,
            timestamps=timestamps,
            headers=[[("h", b"1")]] * 50,
            codec=codec,
            producer_id=7,
            # Epoch 0: epochs above it move only through InitProducerId.
            producer_epoch=0,
            # Consecutive sequences: the broker drops a repeated one (idempotence).
            base_sequence=50 * n,
        )
        assert not _produce(address, topic_name, batch).HasField("error")
    decoded = _read_all(address, topic_name)
    assert len(decoded) == 3
    for i, batch in enumerate(decoded):
        assert batch.header.compression == CompressionType.ZSTD
        assert batch.values == values and batch.keys == keys and batch.timestamps == timestamps
        assert batch.headers == [[("h", b"1")]] * 50
        assert batch.offsets == list(range(50 * i, 50 * i + 50))
        assert (batch.header.producer_id, batch.header.producer_epoch) == (7, 0)
    # producer: batches are stored as sent.
    with AdminClient(bootstrap_servers=address) as admin:
        admin.alter_configs({topic_name: {"compression.type": "producer"}})
    _produce(address, topic_name, records.encode_batch(values, codec=CompressionType.LZ4))
    assert _read_all(address, topic_name)[-1].header.compression == CompressionType.LZ4


def test_log_append_time_end_to_end(lifecycle_broker: BrokerProcess, topic_name: str) -> None:
    address = lifecycle_broker.address
    with AdminClient(bootstrap_servers=address) as admin:
        admin.create_topics(
            [NewTopic(topic_name, topic_configs={"message.timestamp.type": "LogAppendTime"})]
        )
    before = int(time.time() * 1000)
    result = _produce(
        address,
        topic_name,
        records.encode_batch([b"a", b"b"], timestamps=[5, 6]),  # producer's times ignored
    )
    after = int(time.time() * 1000)
    assert before <= result.log_append_time_ms <= after
    (batch,) = _read_all(address, topic_name)
    assert batch.header.timestamp_type == records.LOG_APPEND_TIME
    assert batch.timestamps == [result.log_append_time_ms] * 2
    found = _list_offset(address, topic_name, before)
    assert (found.offset, found.timestamp_ms) == (0, result.log_append_time_ms)
    # CreateTime topics answer -1 and keep the producer's times.
    other = topic_name + "-ct"
    result = _produce(address, other, records.encode_batch([b"a"], base_timestamp=5))
    assert result.log_append_time_ms == -1
    assert _read_all(address, other)[0].timestamps == [5]


def test_cli_consume_from_time(lifecycle_broker: BrokerProcess, topic_name: str) -> None:
    address = lifecycle_broker.address
    base = int(time.time() * 1000) - 100 * 60_000  # within the default retention (2 h)
    for i in range(30):
        # Three minutes apart, across several segment rolls.
        ts = base + i * 180_000
        batch = records.encode_batch([b"e%d" % i + b"." * 300], base_timestamp=ts)
        _produce(address, topic_name, batch)
    at = datetime.fromtimestamp((base + 12 * 180_000 - 1) / 1000, tz=UTC)
    text = at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    env = {**os.environ, "TIDELOG_BOOTSTRAP": address}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidelog.cli",
            "consume",
            topic_name,
            "--from-time",
            text,
            "--print-offset",
            "--max-messages",
            "3",
            "--timeout-ms",
            "5000",
        ],
        capture_output=True,
        env=env,
        timeout=30,
        check=True,
    )
    lines = out.stdout.decode().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["0:12", "0:13", "0:14"]
    assert lines[0].split("\t")[1].startswith("e12")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        # A typo (Kafka's name is log.retention.hours) must not be ignored.
        ("log.retention.hourz=1", "unknown broker config 'log.retention.hourz'"),
        ("no.such.setting=1", "unknown broker config 'no.such.setting'"),
        ("log.retention.check.interval.ms=0", "log.retention.check.interval.ms=0 is out of range"),
    ],
)
def test_broker_config_file_rejects_unknown_keys_and_bad_values(
    tmp_path: Path, line: str, message: str
) -> None:
    config_file = tmp_path / "bad.properties"
    config_file.write_text(f"# a comment\nlog.segment.bytes=1048576\n{line}\n")
    data_dir = tmp_path / "data"
    proc = subprocess.run(
        [
            sys.executable, "-m", "tidelog_broker", "--config", str(config_file),
            "--data-dir", str(data_dir), "--listen", "127.0.0.1:0",
        ],
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr.decode()
    assert message.encode() in proc.stderr, proc.stderr.decode()
    assert not data_dir.exists()  # refused before it started serving
