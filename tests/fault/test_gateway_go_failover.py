"""Brokers SIGKILLed while the Go example produces through the gateway's
record-level API with acks=all on a replication-factor-3 topic: every record
the gateway acknowledged to the Go client can be read back at the offset it
was acknowledged with, with its key and value (issue 10).

The Go example (`tidelog-go-example produce`, examples/go/produce.go) prints
one line per acknowledged record (partition, offset, seq); a leader of a
random partition is SIGKILLed every few seconds and restarted meanwhile.
Skipped, with the reason, where Go is not installed (examples/go/build.sh
exits 3)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from tidelog import Consumer, TopicPartition

from tests.fault.replication_support import LeaderKiller, ReplicatedCluster
from tests.integration.clients.conftest import build
from tests.support.gateway import GatewayProcess

TOPIC = "go-payments"
PARTITIONS = 3
PRODUCE_S = 15


@pytest.fixture
def go_example() -> Path:
    return build("examples/go/build.sh")


def _read_all(address: str, timeout_s: float) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    """(partition, offset) -> (key, value) of every record of the topic."""
    out: dict[tuple[int, int], tuple[bytes, bytes]] = {}
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    with Consumer(bootstrap_servers=address, enable_auto_commit=False) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(consumer.position(tp) >= ends[tp] for tp in tps):
                break
            for batch in consumer.poll(timeout_ms=500, max_records=100_000).values():
                for r in batch:
                    out[(r.partition, r.offset)] = (r.key or b"", r.value or b"")
    return out


@pytest.mark.timeout(300)
def test_go_client_acks_all_through_the_gateway_loses_nothing_while_leaders_are_killed(
    go_example: Path, cluster: ReplicatedCluster, gateway: GatewayProcess, tmp_path: Path
) -> None:
    cluster.create_topic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
    killer = LeaderKiller(cluster, TOPIC, 3)
    stdout = tmp_path / "go-produce.out"
    command = [
        str(go_example), "produce",
        "-gateway", gateway.address,
        "-topic", TOPIC,
        "-acks", "all",
        "-duration", f"{PRODUCE_S}s",
        "-timeout", "200s",
    ]  # fmt: skip
    with stdout.open("w") as out:
        go = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            killer.start()
            _, stderr = go.communicate(timeout=240)
        finally:
            killer.join()
            if go.poll() is None:
                go.kill()
                go.wait()
    assert killer.error is None, killer.error
    assert go.returncode == 0, stderr
    lines = stdout.read_text().splitlines()
    assert lines and lines[-1].startswith("done "), (lines[-3:], stderr)
    acked = [tuple(int(x) for x in line.split()[1:]) for line in lines if line.startswith("acked ")]
    failed = sum(1 for line in lines if line.startswith("failed "))

    cluster.wait_full_isr(TOPIC, 3, 30)
    stored = _read_all(gateway.address, 60)
    lost = [
        (partition, offset, seq)
        for partition, offset, seq in acked
        if stored.get((partition, offset)) != (b"key-%d" % seq, b"value-%d" % seq)
    ]
    print(
        f"\nGo client through the gateway, acks=all: kills={killer.kills} acked={len(acked)} "
        f"failed={failed} stored={len(stored)} lost={len(lost)} ({lines[-1]})"
    )
    assert killer.kills >= 2
    assert len(acked) > 0
    assert lost == [], lost[:10]
    # Each acknowledged record once: no two acknowledgements name one offset.
    assert len({(p, o) for p, o, _ in acked}) == len(acked)
