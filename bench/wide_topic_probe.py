"""What creating one topic of thousands of partitions does to a cluster:
whether brokers keep their etcd sessions while they host the new
partitions (issue 15's "Found: creating a topic of thousands of partitions
costs brokers their etcd session").

Creates a topic of `--partitions` partitions (replication factor 2) on three
brokers with the default session TTL, describes it at 0, 1, 3, 10 and 40 s
(partitions without a leader, partitions whose ISR lost a replica), and
prints how many times a broker lost its session (its log says so) and how
long each broker took to host its replicas (from the creation to its last
"hosting N partitions of wide" line, N its replica count).

    .venv/bin/python -m bench.wide_topic_probe [--partitions 3000]

Starts its own etcd, coordinator and brokers (tests/support), stops them by PID.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from tidelog import AdminClient, NewTopic

from bench.replication_bench import start
from tests.support.etcd import EtcdProcess

#: What a broker logs when etcd said its session lease was gone.
LOST = "lost its etcd session"
#: What a broker logs when a refresh of its lease failed (late or refused).
REFRESH_FAILED = "refreshing lease"
PROBE_TIMES_S = (0, 1, 3, 10, 40)
#: A broker's log line saying how many partitions of the topic it hosts now.
HOSTING = re.compile(r"^(\S+ \S+) INFO tidelog.broker: hosting (\d+) partitions of wide")


def count_in_logs(paths: list[Path], needle: str) -> list[int]:
    return [path.read_text(errors="replace").count(needle) for path in paths]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", type=int, default=3000)
    parser.add_argument("--keep", action="store_true", help="keep the logs and data")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tidelog-wide-probe-"))
    etcd = EtcdProcess.start(root)
    coordinator, brokers = start(root, etcd)
    bootstrap = ",".join(b.address for b in brokers)
    logs = [b.log_path for b in brokers]
    try:
        with AdminClient(bootstrap_servers=bootstrap) as admin:
            lost_before = count_in_logs(logs, LOST)
            created_at = datetime.now()
            created = time.monotonic()
            admin.create_topics([NewTopic("wide", args.partitions, 2)])
            for at_s in PROBE_TIMES_S:
                while time.monotonic() - created < at_s:
                    time.sleep(0.2)
                parts = admin.describe_topics(["wide"])[0].partitions
                leaderless = sum(1 for p in parts if p.leader < 0)
                shrunk = sum(1 for p in parts if len(p.isr) < len(p.replicas))
                print(
                    f"t={at_s:>2} s: {len(parts)} partitions, {leaderless} without a leader, "
                    f"{shrunk} with a shrunk ISR",
                    flush=True,
                )
            lost = [a - b for a, b in zip(count_in_logs(logs, LOST), lost_before, strict=True)]
            failed = count_in_logs(logs, REFRESH_FAILED)
            print(f"sessions lost per broker: {lost}; lease refreshes failed: {failed}")
            hosted = [hosting_time_s(path, created_at) for path in logs]
            print(
                "seconds from the creation until each broker hosted all its replicas: "
                + str(hosted)
            )
    finally:
        for broker in brokers:
            broker.stop()
        coordinator.stop()  # type: ignore[attr-defined]
        etcd.stop()
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def hosting_time_s(log_path: Path, created_at: datetime) -> float | None:
    """Seconds from `created_at` to the broker's last hosting line with the
    most partitions of the topic (None: it hosted none)."""
    last: tuple[int, datetime] | None = None
    for line in log_path.read_text(errors="replace").splitlines():
        match = HOSTING.match(line)
        if match:
            count, at = int(match[2]), datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f")
            if last is None or count >= last[0]:
                last = (count, at)
    return None if last is None else round((last[1] - created_at).total_seconds(), 2)


if __name__ == "__main__":
    sys.exit(main())
