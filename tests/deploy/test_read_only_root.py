"""The services run as the chart runs them: on a read-only root filesystem,
writing only to their data volume (brokers) and a scratch directory (the
chart's emptyDir at /tmp, HOME and TMPDIR).

Real processes: etcd runs as usual; a broker, a coordinator and a gateway
each run in their own mount namespace (`unshare --mount`) where every mount
is remounted read-only except the directories bind-mounted writable for it.
Through the gateway a topic is created, produced to and consumed by a group
that commits; each service then stops cleanly (exit 0) on SIGTERM. Skipped
where mount namespaces cannot be made (not root, no `unshare`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from tidelog import AdminClient, Consumer, NewTopic, Producer

from tests.support.etcd import EtcdProcess, running_etcd
from tests.support.processes import ServiceProcess, free_port, spawn_service

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

DEADLINE_S = 60.0
PREFIX = "/readonly"

#: Remount every mount read-only (not /proc, /sys, /dev), then bind-mount the
#: directories in $TIDELOG_WRITABLE writable again, then run the service.
READ_ONLY_ROOT = r"""
set -e
for m in $(awk '$2 !~ "^/(proc|sys|dev)" {print $2}' /proc/mounts); do
  mount -o remount,bind,ro "$m" 2>/dev/null || true
done
for d in $TIDELOG_WRITABLE; do
  mount --bind "$d" "$d"
  mount -o remount,bind,rw "$d"
done
exec "$@"
"""


def read_only(argv: Sequence[str]) -> list[str]:
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        READ_ONLY_ROOT,
        "sh",
        *argv,
    ]


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) (util-linux) to make a read-only mount namespace")
    path = tmp_path / "scratch"
    path.mkdir()
    # What the chart's pods get (tidelog.podEnv): HOME on the emptyDir.
    monkeypatch.setenv("HOME", str(path))
    monkeypatch.setenv("TMPDIR", str(path))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("TIDELOG_WRITABLE", str(path))
    probe = subprocess.run(
        read_only([sys.executable, "-c", f"open({str(tmp_path / 'x')!r}, 'w')"]),
        capture_output=True,
        text=True,
        check=False,
    )
    if "Read-only file system" not in probe.stderr:
        pytest.skip(f"cannot make a read-only mount namespace here: {probe.stderr[-300:]}")
    return path


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    with running_etcd(tmp_path / "etcd") as process:
        yield process


def start(what: str, argv: list[str], log_dir: Path) -> ServiceProcess:
    address = next(a.split("=", 1)[1] for a in argv if a.startswith("--listen="))
    log_path = log_dir / f"{what}.log"
    proc = spawn_service(what, read_only(argv), address, log_path, DEADLINE_S)
    return ServiceProcess(proc, address, log_path)


def test_services_run_on_a_read_only_root_filesystem(
    scratch: Path, etcd: EtcdProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "broker-data"
    data.mkdir()
    common = [f"--etcd={etcd.endpoint}"]
    services: list[ServiceProcess] = []
    try:
        services.append(
            start(
                "coordinator",
                [sys.executable, "-m", "tidelog_coordinator", f"--listen=127.0.0.1:{free_port()}",
                 *common, f"--prefix={PREFIX}", "--session-ttl-s=3"],
                tmp_path,
            )
        )  # fmt: skip
        # The broker may also write to its data volume.
        monkeypatch.setenv("TIDELOG_WRITABLE", f"{scratch} {data}")
        services.append(
            start(
                "broker",
                [sys.executable, "-m", "tidelog_broker", f"--listen=127.0.0.1:{free_port()}",
                 f"--data-dir={data}/data", *common, f"--etcd-prefix={PREFIX}", "--broker-id=0",
                 "--session-ttl-s=3"],
                tmp_path,
            )
        )  # fmt: skip
        monkeypatch.setenv("TIDELOG_WRITABLE", str(scratch))
        gateway = start(
            "gateway",
            [sys.executable, "-m", "tidelog_gateway", f"--listen=127.0.0.1:{free_port()}",
             *common, f"--prefix={PREFIX}", "--drain-timeout-s=2"],
            tmp_path,
        )  # fmt: skip
        services.append(gateway)

        with AdminClient(gateway.address, request_timeout_ms=int(DEADLINE_S * 1000)) as admin:
            admin.create_topics([NewTopic("read-only", 2, 1)])
        with Producer(gateway.address, acks="all") as producer:
            futures = [producer.send("read-only", b"v%d" % i) for i in range(200)]
            producer.flush()
            for future in futures:
                future.get(timeout=DEADLINE_S)
        with Consumer(
            "read-only", bootstrap_servers=gateway.address, group_id="ro", enable_auto_commit=False
        ) as consumer:
            got, deadline = 0, time.monotonic() + DEADLINE_S
            while got < 200 and time.monotonic() < deadline:
                got += sum(len(r) for r in consumer.poll(timeout_ms=500).values())
            assert got == 200
            consumer.commit()
        with AdminClient(gateway.address) as admin:
            assert sum(o.offset for o in admin.list_consumer_group_offsets("ro").values()) == 200
        assert list((data / "data").iterdir()), "the broker wrote its log to its volume"
    finally:
        codes = {s.log_path.stem: s.stop() for s in reversed(services)}
    assert codes == {"gateway": 0, "broker": 0, "coordinator": 0}, codes
    for service in services:
        assert "Read-only file system" not in service.log_path.read_text(errors="replace")
