"""The `tidelog` command line, run as a user would: the README's tour against
a real broker, and `tidelog dev` (what `make run` runs) started and stopped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import psutil
import pytest
from tidelog import AdminClient, AsyncConsumer, Consumer, NewTopic, TopicPartition, records
from tidelog.errors import UnknownTopicOrPartitionError
from tidelog.v1 import log_pb2, log_pb2_grpc

from tests.support.processes import BrokerProcess, free_port, free_ports_in_a_row, start_broker

pytestmark = pytest.mark.timeout(90)


def tidelog(
    *args: str, bootstrap: str, stdin: bytes = b"", check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run(
        [sys.executable, "-m", "tidelog.cli", *args, "--bootstrap-server", bootstrap],
        input=stdin,
        capture_output=True,
        timeout=timeout,
    )
    if check:
        assert result.returncode == 0, result.stderr.decode()
    return result


def test_readme_tour(broker: BrokerProcess, topic_name: str) -> None:
    bootstrap = broker.address
    created = tidelog("topics", "create", topic_name, "--partitions", "3", bootstrap=bootstrap)
    assert f"created topic {topic_name}" in created.stdout.decode()

    lines = b"alice:hello\nbob:hi\ncarol:hey\nalice:how are you\n"
    produced = tidelog(
        "produce", topic_name, "--key-separator", ":", bootstrap=bootstrap, stdin=lines
    )
    assert produced.stdout.decode().strip() == "4 records acknowledged"

    everything = tidelog(
        "consume", topic_name, "--from-beginning", "--print-key", "--print-offset",
        "--timeout-ms", "1500", bootstrap=bootstrap,
    )  # fmt: skip
    rows = everything.stdout.decode().splitlines()
    assert sorted(row.split("\t", 1)[1] for row in rows) == sorted(
        ["alice\thello", "bob\thi", "carol\they", "alice\thow are you"]
    )
    # Records of one key stay in order in one partition.
    alice = [row.split("\t")[0] for row in rows if "\talice\t" in row]
    alice_partitions = {position.split(":")[0] for position in alice}
    assert len(alice_partitions) == 1

    described = tidelog("topics", "describe", topic_name, bootstrap=bootstrap).stdout.decode()
    assert "partition" in described and "segments" in described

    partition = alice_partitions.pop()
    rewound = tidelog(
        "consume", topic_name, "--partition", partition, "--offset", "1", "--timeout-ms", "1000",
        bootstrap=bootstrap,
    )  # fmt: skip
    in_partition = [row for row in rows if row.startswith(f"{partition}:")]
    assert len(rewound.stdout.decode().splitlines()) == len(in_partition) - 1

    again = tidelog(
        "consume", topic_name, "--from-beginning", "--max-messages", "2", bootstrap=bootstrap
    )
    assert len(again.stdout.decode().splitlines()) == 2

    listed = tidelog("topics", "list", bootstrap=bootstrap).stdout.decode().split()
    assert topic_name in listed


def test_errors_are_one_clear_line(broker: BrokerProcess) -> None:
    result = tidelog("topics", "create", "bad name", bootstrap=broker.address, check=False)
    assert result.returncode == 2  # usage: an invalid name
    message = result.stderr.decode()
    assert "InvalidTopicError" in message and "Traceback" not in message
    missing = tidelog(
        "consume", "no-such-topic", "--timeout-ms", "200", bootstrap=broker.address, check=False
    )
    assert missing.returncode == 3 and "does not exist" in missing.stderr.decode()  # not found


def one_line_error(result: subprocess.CompletedProcess[bytes], code: int) -> str:
    """The single stderr line of a failed command (no traceback, no debug dump)."""
    message = result.stderr.decode()
    assert result.returncode == code, message
    assert len(message.strip().splitlines()) == 1, message
    assert "Traceback" not in message and "debug_error_string" not in message, message
    return message


#: Well below the 60 s the CLI used to wait before an error: these errors are
#: known at once, so a generous bound still tells waiting apart.
PROMPT_S = 30


def test_a_partition_that_does_not_exist_is_an_error_at_once(
    broker: BrokerProcess, topic_name: str
) -> None:
    tidelog("topics", "create", topic_name, "--partitions", "3", bootstrap=broker.address)
    # No --timeout-ms: it used to spin at 100% CPU forever.
    missing = tidelog(
        "consume", topic_name, "--partition", "7",
        bootstrap=broker.address, check=False, timeout=PROMPT_S,
    )  # fmt: skip
    message = one_line_error(missing, 3)
    assert "partition 7" in message and "0 to 2" in message
    negative = tidelog(
        "consume", topic_name, "--partition", "-1",
        bootstrap=broker.address, check=False, timeout=PROMPT_S,
    )  # fmt: skip
    assert "--partition" in one_line_error(negative, 2)
    produced = tidelog(
        "produce", topic_name, "--partition", "3",
        bootstrap=broker.address, stdin=b"x\n", check=False, timeout=PROMPT_S,
    )  # fmt: skip
    assert "partition 3" in one_line_error(produced, 3)


def test_the_sdk_consumer_refuses_a_partition_that_does_not_exist(
    broker: BrokerProcess, topic_name: str
) -> None:
    with AdminClient(broker.address) as admin:
        admin.create_topics([NewTopic(topic_name, 3)])
    with (
        Consumer(bootstrap_servers=broker.address) as consumer,
        pytest.raises(UnknownTopicOrPartitionError, match="0 to 2"),
    ):
        consumer.assign([TopicPartition(topic_name, 7)])


def test_the_fetcher_reports_a_partition_that_does_not_exist(
    broker: BrokerProcess, topic_name: str
) -> None:
    """AsyncConsumer.assign() checks only cached metadata; the fetcher finds
    out, and getmany() raises instead of the fetcher spinning."""
    with AdminClient(broker.address) as admin:
        admin.create_topics([NewTopic(topic_name, 3)])

    async def consume() -> None:
        async with AsyncConsumer(bootstrap_servers=broker.address) as consumer:
            consumer.assign([TopicPartition(topic_name, 7)])
            deadline = asyncio.get_running_loop().time() + PROMPT_S
            while asyncio.get_running_loop().time() < deadline:
                await consumer.getmany(timeout_ms=500)

    with pytest.raises(UnknownTopicOrPartitionError, match="partition 7"):
        asyncio.run(consume())


def test_user_mistakes_are_one_line_errors(broker: BrokerProcess, topic_name: str) -> None:
    bootstrap = broker.address
    tidelog("topics", "create", topic_name, bootstrap=bootstrap)
    offset = tidelog(
        "consume", topic_name, "--offset", "5", bootstrap=bootstrap, check=False,
    )  # fmt: skip
    assert "--partition" in one_line_error(offset, 2)  # an offset N >= 0 is per partition
    no_host = tidelog("topics", "list", bootstrap="29392", check=False)
    assert "host:port" in one_line_error(no_host, 2)
    zero = tidelog("topics", "create", f"{topic_name}-0", "--partitions", "0",
                   bootstrap=bootstrap, check=False)  # fmt: skip
    assert "--partitions" in one_line_error(zero, 2)
    assert f"{topic_name}-0" not in tidelog("topics", "list", bootstrap=bootstrap).stdout.decode()
    config = tidelog(
        "topics", "create", f"{topic_name}-1", "--config", "retention.ms=" + "9" * 400,
        bootstrap=bootstrap, check=False,
    )  # fmt: skip
    assert "retention.ms" in one_line_error(config, 2)


def test_a_wrong_port_is_an_error_naming_the_address_at_once() -> None:
    nobody = f"127.0.0.1:{free_port()}"
    listed = tidelog("topics", "list", bootstrap=nobody, check=False, timeout=PROMPT_S)
    assert nobody in one_line_error(listed, 4)  # unavailable
    produced = tidelog(
        "produce", "greetings", bootstrap=nobody, stdin=b"x\n", check=False, timeout=PROMPT_S
    )
    assert nobody in one_line_error(produced, 4)


def test_a_topic_that_does_not_exist_is_an_error_naming_it(
    broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    # Consumers never create topics, whatever the broker allows.
    for args in ([], ["--group", "g"], ["--partition", "0"]):
        consumed = tidelog(
            "consume", topic_name, "--timeout-ms", "200", *args,
            bootstrap=broker.address, check=False, timeout=PROMPT_S,
        )  # fmt: skip
        message = one_line_error(consumed, 3)
        assert topic_name in message and "does not exist" in message
    # A broker without auto.create.topics.enable (the default): produce too.
    plain = start_broker(tmp_path / "plain", extra_args=())
    try:
        produced = tidelog(
            "produce", "greetngs", bootstrap=plain.address, stdin=b"x\n",
            check=False, timeout=PROMPT_S,
        )  # fmt: skip
        message = one_line_error(produced, 3)
        assert "'greetngs'" in message and "does not exist" in message
    finally:
        plain.stop()


def test_the_sdk_reads_tidelog_bootstrap(
    broker: BrokerProcess, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDELOG_BOOTSTRAP", broker.address)
    with AdminClient() as admin:
        admin.create_topics([NewTopic(topic_name, 1)])
    with AdminClient(broker.address) as admin:
        assert topic_name in admin.list_topics()


def start_dev(
    data_dir: Path, port: int, *extra: str, ignore_sigint: bool = False
) -> subprocess.Popen[bytes]:
    """`tidelog dev` as a user starts it; with ignore_sigint, as a shell
    starts a background job (SIGINT ignored, inherited by the child)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidelog.cli",
            "dev",
            "--data-dir",
            str(data_dir),
            "--port",
            str(port),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        if ignore_sigint
        else None,
    )


def wait_banner(dev: subprocess.Popen[bytes]) -> bytes:
    assert dev.stdout is not None
    banner = b""
    # Generous: on a loaded CI machine the cluster (etcd, a coordinator,
    # brokers, the gateway) took ~60 s to come up, and a deadline hit between
    # the banner's lines cut it after its first.
    deadline = time.monotonic() + 180
    while b"Ctrl-C stops everything" not in banner and time.monotonic() < deadline:
        line = dev.stdout.readline()
        if not line:
            break
        banner += line
    assert b"Tidelog is running" in banner, banner.decode() + _dev_state(dev)
    return banner


def _dev_state(dev: subprocess.Popen[bytes]) -> str:
    """For a failed start: whether `tidelog dev` still runs, and the end of
    each of its services' logs (its output names them, not what they say)."""
    try:
        dev.wait(timeout=5)
    except subprocess.TimeoutExpired:
        state = "\n[tidelog dev is still running]"
    else:
        state = f"\n[tidelog dev exited with code {dev.returncode}]"
    args = [str(a) for a in dev.args]  # type: ignore[union-attr]
    data_dir = Path(args[args.index("--data-dir") + 1])
    for log in sorted(data_dir.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-15:]
        state += f"\n[{log.name} ends]\n" + "\n".join(tail)
    return state


def kill_dev(dev: subprocess.Popen[bytes], children: list[psutil.Process]) -> None:
    """After a test, pass or fail: no process it started may be left."""
    if dev.poll() is None:
        dev.kill()
        dev.wait()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.is_running():
                child.kill()


def test_dev_children_end_when_dev_is_killed(tmp_path: Path) -> None:
    dev = start_dev(tmp_path / "dev", free_ports_in_a_row(2), "--brokers", "1")
    children: list[psutil.Process] = []
    try:
        wait_banner(dev)
        children = psutil.Process(dev.pid).children(recursive=True)
        assert len(children) >= 3, children  # etcd, the coordinator, a broker
        dev.kill()  # no handler runs: the kernel must end the children
        dev.wait()
        _gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"still running after tidelog dev was killed: {alive}"
    finally:
        kill_dev(dev, children)


def test_dev_starts_a_cluster_and_stops_it_on_ctrl_c(tmp_path: Path) -> None:
    port = free_ports_in_a_row(4)  # three brokers (the default) and the gateway
    data_dir = tmp_path / "dev"
    # Started as `make test &` starts it: SIGINT ignored from the shell.
    dev = start_dev(data_dir, port, ignore_sigint=True)
    children: list[psutil.Process] = []
    try:
        banner = wait_banner(dev)
        assert f"127.0.0.1:{port}".encode() in banner
        children = psutil.Process(dev.pid).children(recursive=True)
        assert children, "dev should have started a broker process"

        bootstrap = f"127.0.0.1:{port}"
        # Automatic creation is off, as on a broker: a typo is an error naming it.
        typo = tidelog("produce", "greetngs", bootstrap=bootstrap, stdin=b"x\n", check=False)
        assert "'greetngs'" in one_line_error(typo, 3)
        for name in ("bad/name", ""):  # INVALID_TOPIC, not 61 s of retries
            bad = tidelog(
                "produce", name, bootstrap=bootstrap, stdin=b"x\n", check=False, timeout=PROMPT_S
            )
            assert "InvalidTopicError" in one_line_error(bad, 2)
        tidelog("topics", "create", "greetings", bootstrap=bootstrap)
        tidelog("produce", "greetings", bootstrap=bootstrap, stdin=b"one\ntwo\n")
        consumed = tidelog(
            "consume", "greetings", "--from-beginning", "--timeout-ms", "1000",
            bootstrap=bootstrap,
        )  # fmt: skip
        assert consumed.stdout == b"one\ntwo\n"
        # The gateway it started and named serves the same cluster.
        gateway = re.search(rb"gateway: (127\.0\.0\.1:\d+)", banner)
        assert gateway is not None, banner.decode()
        through_gateway = tidelog(
            "consume", "greetings", "--from-beginning", "--timeout-ms", "1000",
            bootstrap=gateway.group(1).decode(),
        )  # fmt: skip
        assert through_gateway.stdout == b"one\ntwo\n"
        # Each service's Prometheus endpoint is printed and answers.
        metrics = dict(re.findall(rb"    (\w[\w ]*): (http://127\.0\.0\.1:\d+/metrics)", banner))
        assert sorted(metrics) == [
            b"broker 0",
            b"broker 1",
            b"broker 2",
            b"coordinator",
            b"gateway",
        ]
        with urllib.request.urlopen(metrics[b"broker 0"].decode(), timeout=10) as answer:
            assert b"tidelog_broker_partitions" in answer.read()

        dev.send_signal(signal.SIGINT)
        assert dev.wait(timeout=20) == 0
        for child in children:
            assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
        # Three brokers in cluster mode: the partition lives on its leader only.
        assert any((data_dir / f"broker-{i}" / "greetings-0").is_dir() for i in range(3))
        assert not any((data_dir / f"broker-{i}" / "greetngs-0").exists() for i in range(3))
        assert (data_dir / "etcd").is_dir()
    finally:
        kill_dev(dev, children)


def stored_batches(address: str, topic: str, partition: int) -> list[records.BatchHeader]:
    """The headers of the batches the broker stores, as a raw Fetch returns them."""
    with grpc.insecure_channel(address) as channel:
        call = log_pb2_grpc.LogStub(channel).Fetch(
            iter(
                [
                    log_pb2.FetchRequest(
                        positions=[
                            log_pb2.FetchPosition(topic=topic, partition=partition, fetch_offset=0)
                        ],
                        credit_bytes=1 << 24,
                        max_bytes=1 << 22,
                        max_wait_ms=50,
                    )
                ]
            ),
            timeout=10,
        )
        data = next(call).partitions[0]
        call.cancel()
    assert not data.error.code, data.error.message
    return [header for _, header in records.iter_batches(data.records)]


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_compression_is_what_the_broker_stores(
    broker: BrokerProcess, topic_name: str, codec: str
) -> None:
    tidelog("topics", "create", topic_name, bootstrap=broker.address)
    lines = b"".join(b"line %d of a compressible text\n" % i for i in range(200))
    produced = tidelog(
        "produce", topic_name, "--partition", "0", "--compression", codec,
        bootstrap=broker.address, stdin=lines,
    )  # fmt: skip
    assert produced.stdout.decode().strip() == "200 records acknowledged"
    headers = stored_batches(broker.address, topic_name, 0)
    assert {h.compression.name.lower() for h in headers} == {codec}
    consumed = tidelog(
        "consume", topic_name, "--from-beginning", "--timeout-ms", "1500",
        bootstrap=broker.address,
    )  # fmt: skip
    assert consumed.stdout == lines


@pytest.mark.parametrize(("acks", "idempotent"), [("0", False), ("1", False), ("all", True)])
def test_produce_acks(broker: BrokerProcess, topic_name: str, acks: str, idempotent: bool) -> None:
    """Each --acks stores every line; acks=all reaches the producer, as the
    idempotence it turns on by default shows in the stored batches (a
    producer id and sequence), which acks 0 and 1 leave out."""
    tidelog("topics", "create", topic_name, bootstrap=broker.address)
    lines = b"".join(b"r%d\n" % i for i in range(50))
    produced = tidelog("produce", topic_name, "--acks", acks, bootstrap=broker.address, stdin=lines)
    assert produced.stdout.decode().strip() == "50 records acknowledged"
    consumed = tidelog(
        "consume", topic_name, "--from-beginning", "--max-messages", "50",
        bootstrap=broker.address, timeout=PROMPT_S,
    )  # fmt: skip
    assert consumed.stdout == lines
    headers = stored_batches(broker.address, topic_name, 0)
    assert {h.producer_id >= 0 and h.base_sequence >= 0 for h in headers} == {idempotent}
    bad = tidelog(
        "produce", topic_name, "--acks", "2", bootstrap=broker.address, stdin=b"x\n", check=False
    )
    assert "--acks" in one_line_error(bad, 2)


def test_topics_alter_sets_and_removes_overrides(broker: BrokerProcess, topic_name: str) -> None:
    bootstrap = broker.address
    tidelog("topics", "create", topic_name, bootstrap=bootstrap)
    with AdminClient(bootstrap) as admin:
        default = admin.describe_configs([topic_name])[topic_name]["retention.ms"].value
    altered = tidelog(
        "topics", "alter", topic_name, "--config", "retention.ms=3600000",
        "--config", "max.message.bytes=65536", bootstrap=bootstrap,
    )  # fmt: skip
    assert altered.stdout.decode().strip() == (
        f"altered configs of topic {topic_name}: retention.ms=3600000, max.message.bytes=65536"
    )
    with AdminClient(bootstrap) as admin:
        configs = admin.describe_configs([topic_name])[topic_name]
    assert configs["retention.ms"].value == "3600000" and configs["retention.ms"].is_override
    assert configs["max.message.bytes"].value == "65536"
    described = tidelog("topics", "describe", topic_name, "--configs", bootstrap=bootstrap)
    assert "*retention.ms=3600000" in described.stdout.decode()

    removed = tidelog(
        "topics", "alter", topic_name, "--delete-config", "retention.ms", bootstrap=bootstrap
    )
    assert f"altered configs of topic {topic_name}: -retention.ms" in removed.stdout.decode()
    with AdminClient(bootstrap) as admin:
        configs = admin.describe_configs([topic_name])[topic_name]
    assert configs["retention.ms"].value == default and not configs["retention.ms"].is_override
    assert configs["max.message.bytes"].value == "65536"  # the other override stays

    bad = tidelog(
        "topics", "alter", topic_name, "--config", "retention.ms=-5",
        bootstrap=bootstrap, check=False,
    )  # fmt: skip
    assert "retention.ms" in one_line_error(bad, 2)
    nothing = tidelog("topics", "alter", topic_name, bootstrap=bootstrap, check=False)
    assert "--config" in one_line_error(nothing, 2)
    missing = tidelog(
        "topics", "alter", f"{topic_name}-missing", "--config", "retention.ms=1000",
        bootstrap=bootstrap, check=False,
    )  # fmt: skip
    assert f"{topic_name}-missing" in one_line_error(missing, 3)
    with AdminClient(bootstrap) as admin:
        configs = admin.describe_configs([topic_name])[topic_name]
    assert configs["retention.ms"].value == default  # refused changes changed nothing


def test_topics_delete_removes_the_topic_and_its_data(
    broker: BrokerProcess, topic_name: str
) -> None:
    bootstrap = broker.address
    tidelog("topics", "create", topic_name, "--partitions", "2", bootstrap=bootstrap)
    tidelog("produce", topic_name, bootstrap=bootstrap, stdin=b"a\nb\nc\n")
    assert (broker.data_dir / f"{topic_name}-0").is_dir()
    deleted = tidelog("topics", "delete", topic_name, bootstrap=bootstrap)
    assert deleted.stdout.decode().strip() == f"deleted topic {topic_name}"
    assert topic_name not in tidelog("topics", "list", bootstrap=bootstrap).stdout.decode().split()
    assert not any((broker.data_dir / f"{topic_name}-{p}").exists() for p in range(2))
    consumed = tidelog(
        "consume", topic_name, "--timeout-ms", "200", bootstrap=bootstrap, check=False
    )
    assert "does not exist" in one_line_error(consumed, 3)
    again = tidelog("topics", "delete", topic_name, bootstrap=bootstrap, check=False)
    assert topic_name in one_line_error(again, 3)
    # The name is free again, and the new topic starts empty.
    tidelog("topics", "create", topic_name, bootstrap=bootstrap)
    with AdminClient(bootstrap) as admin:
        (description,) = admin.describe_topics([topic_name])
    assert [p.log_end_offset for p in description.partitions] == [0]
