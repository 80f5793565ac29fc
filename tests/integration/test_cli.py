"""The `tidelog` command line, run as a user would: the README's tour against
a real broker, and `tidelog dev` (what `make run` runs) started and stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.processes import BrokerProcess, free_port

pytestmark = pytest.mark.timeout(90)


def tidelog(
    *args: str, bootstrap: str, stdin: bytes = b"", check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run(
        [sys.executable, "-m", "tidelog.cli", *args, "--bootstrap-server", bootstrap],
        input=stdin,
        capture_output=True,
        timeout=60,
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
    assert result.returncode == 1
    message = result.stderr.decode()
    assert "InvalidTopicError" in message and "Traceback" not in message
    missing = tidelog(
        "consume", "no-such-topic", "--timeout-ms", "200", bootstrap=broker.address, check=False
    )
    assert missing.returncode == 1 and "does not exist" in missing.stderr.decode()


def test_dev_starts_a_cluster_and_stops_it_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "dev"
    dev = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidelog.cli",
            "dev",
            "--data-dir",
            str(data_dir),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert dev.stdout is not None
        banner = b""
        deadline = time.monotonic() + 30
        while b"Ctrl-C stops everything" not in banner and time.monotonic() < deadline:
            line = dev.stdout.readline()
            if not line:
                break
            banner += line
        assert b"Tidelog is running" in banner, banner.decode()
        assert f"127.0.0.1:{port}".encode() in banner
        children = psutil.Process(dev.pid).children(recursive=True)
        assert children, "dev should have started a broker process"

        bootstrap = f"127.0.0.1:{port}"
        tidelog("produce", "auto-created", bootstrap=bootstrap, stdin=b"one\ntwo\n")
        consumed = tidelog(
            "consume", "auto-created", "--from-beginning", "--timeout-ms", "1000",
            bootstrap=bootstrap,
        )  # fmt: skip
        assert consumed.stdout == b"one\ntwo\n"

        dev.send_signal(signal.SIGINT)
        assert dev.wait(timeout=20) == 0
        for child in children:
            assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
        # Three brokers in cluster mode: the partition lives on its leader only.
        assert any((data_dir / f"broker-{i}" / "auto-created-0").is_dir() for i in range(3))
        assert (data_dir / "etcd").is_dir()
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
