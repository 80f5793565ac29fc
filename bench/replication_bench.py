"""Replication numbers (issue 5): produce throughput with acks=all and
replication factor 3 on three local brokers against acks=1 with one replica,
fail-over time from a leader's SIGKILL to the producer's next
acknowledged write (p50 and worst over 10 kills), with default settings, and
the fail-over of a broker among thousands of partitions: from its SIGKILL
until none of them is led by it or leaderless (the controller's election
pass and every broker taking up its new roles; the one-partition fail-over
of the same run is the baseline).

    .venv/bin/python -m bench.replication_bench [--records 200000] [--kills 10]
        [--wide-partitions 3000]

Starts its own etcd, coordinator and brokers (tests/support), stops them by PID.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from tidelog import AdminClient, NewTopic, Producer

from tests.support.coordinator import start_coordinator
from tests.support.etcd import EtcdProcess
from tests.support.processes import BrokerProcess, start_broker

VALUE = b"x" * 100


def start(root: Path, etcd: EtcdProcess) -> tuple[object, list[BrokerProcess]]:
    coordinator = start_coordinator(
        etcd.endpoint, root / "logs", prefix="/bench", coordinator_id="c0"
    )
    brokers = [
        start_broker(
            root / f"broker-{i}",
            extra_args=["--etcd", etcd.endpoint, "--etcd-prefix", "/bench"],  # default TTL
            broker_id=i,
        )
        for i in range(3)
    ]
    time.sleep(2)
    return coordinator, brokers


def throughput(bootstrap: str, topic: str, records: int, acks: int | str) -> float:
    with Producer(bootstrap_servers=bootstrap, acks=acks, linger_ms=5) as producer:
        started = time.perf_counter()
        for i in range(records):
            producer.send(topic, value=VALUE, partition=i % 3)
        producer.flush()
        return records / (time.perf_counter() - started)


def leader_of(bootstrap: str, topic: str) -> int:
    with AdminClient(bootstrap_servers=bootstrap) as admin:
        return admin.describe_topics([topic])[0].partitions[0].leader


def failover(bootstrap: str, brokers: list[BrokerProcess], kills: int) -> list[float]:
    topic = "failover"
    acked: list[tuple[float, float]] = []  # (sent, acked)
    lock = threading.Lock()
    stop = threading.Event()

    def produce() -> None:
        with Producer(
            bootstrap_servers=bootstrap, acks="all", linger_ms=0, retry_backoff_ms=20
        ) as producer:
            while not stop.is_set():
                sent = time.monotonic()

                def done(_md: object, sent: float = sent) -> None:
                    with lock:
                        acked.append((sent, time.monotonic()))

                producer.send(topic, value=VALUE, partition=0).add_callback(done)
                time.sleep(0.002)
            producer.flush()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    time.sleep(2)
    times = []
    for _ in range(kills):
        leader = leader_of(bootstrap, topic)
        victim = brokers[leader]
        killed = time.monotonic()
        victim.kill()
        while True:
            with lock:
                after = [a for s, a in acked if s > killed]
            if after:
                times.append(min(after) - killed)
                break
            if time.monotonic() - killed > 30:
                times.append(float("inf"))
                break
            time.sleep(0.01)
        victim.spawn()
        time.sleep(3)  # back in the ISR before the next kill
    stop.set()
    thread.join(30)
    return times


def wide_failover(bootstrap: str, brokers: list[BrokerProcess], partitions: int) -> float:
    """Seconds from a broker's SIGKILL until every partition of a topic of
    `partitions` (replication factor 2) is led by a live broker."""
    topic = "wide"
    with AdminClient(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(topic, partitions, 2)])

        def leaders() -> list[int]:
            return [p.leader for p in admin.describe_topics([topic])[0].partitions]

        deadline = time.monotonic() + 120
        while len(found := leaders()) < partitions or min(found) < 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: not every partition has a leader after 120 s")
            time.sleep(0.5)
        victim = brokers[0]
        # Partitions of the victim whose ISR had already lost a replica: if
        # only the victim was left in it, no live broker may lead (no unclean
        # election), and the fail-over cannot finish for them.
        before = admin.describe_topics([topic])[0].partitions
        alone = sum(1 for p in before if p.isr == [victim.broker_id])
        shrunk = sum(1 for p in before if len(p.isr) < len(p.replicas))
        print(
            f"wide fail-over: before the kill, {shrunk} partitions with a shrunk ISR, "
            f"{alone} with only broker {victim.broker_id} (the victim) in it",
            flush=True,
        )
        killed = time.monotonic()
        victim.kill()
        try:
            while True:
                found = leaders()
                if all(leader >= 0 and leader != victim.broker_id for leader in found):
                    return time.monotonic() - killed
                if time.monotonic() - killed > 120:
                    # Say what is left: leaderless partitions (their ISR held
                    # only the victim) or partitions still led by it.
                    leaderless = sum(1 for leader in found if leader < 0)
                    print(
                        f"wide fail-over: after 120 s, {leaderless} partitions without a "
                        f"leader, {sum(1 for leader in found if leader == victim.broker_id)} "
                        f"still led by the killed broker {victim.broker_id}",
                        flush=True,
                    )
                    stuck = [
                        p
                        for p in admin.describe_topics([topic])[0].partitions
                        if p.leader < 0 or p.leader == victim.broker_id
                    ]
                    for p in stuck[:5]:
                        print(
                            f"  partition {p.partition}: leader {p.leader}, replicas "
                            f"{p.replicas}, ISR {p.isr}",
                            flush=True,
                        )
                    return float("inf")
                time.sleep(0.1)
        finally:
            victim.spawn()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--wide-partitions", type=int, default=3000)
    parser.add_argument(
        "--keep", action="store_true", help="keep the cluster's directory (logs, data) at the end"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tidelog-replication-bench-"))
    etcd = EtcdProcess.start(root)
    coordinator, brokers = start(root, etcd)
    bootstrap = ",".join(b.address for b in brokers)
    try:
        with AdminClient(bootstrap_servers=bootstrap) as admin:
            admin.create_topics(
                [
                    NewTopic("rf3", 3, 3, topic_configs={"min.insync.replicas": "2"}),
                    NewTopic("rf1", 3, 1),
                    NewTopic("failover", 1, 3, topic_configs={"min.insync.replicas": "2"}),
                ]
            )
        time.sleep(2)
        throughput(bootstrap, "rf1", 20_000, 1)  # warm up
        rf1 = throughput(bootstrap, "rf1", args.records, 1)
        rf3 = throughput(bootstrap, "rf3", args.records, "all")
        print(f"acks=1   RF 1: {rf1:,.0f} records/s (100 B values)")
        print(f"acks=all RF 3: {rf3:,.0f} records/s = {rf3 / rf1:.2f} of acks=1 RF 1")
        times = failover(bootstrap, brokers, args.kills) if args.kills > 0 else []
        if times:
            print(
                "fail-over, SIGKILL of the leader -> next acknowledged write: "
                f"p50 {statistics.median(times):.2f} s, worst {max(times):.2f} s over "
                f"{len(times)} kills: {[round(t, 2) for t in times]}"
            )
        if args.wide_partitions:
            wide = wide_failover(bootstrap, brokers, args.wide_partitions)
            against = (
                f" = {wide / statistics.median(times):.1f}x the one-partition p50" if times else ""
            )
            print(
                f"fail-over of a broker among {args.wide_partitions:,} partitions (RF 2), "
                f"SIGKILL -> every partition led by a live broker: {wide:.2f} s{against}"
            )
    finally:
        for broker in brokers:
            broker.stop()
        coordinator.stop()  # type: ignore[attr-defined]
        etcd.stop()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)  # 100-500 MB of logs per run
    return 0


if __name__ == "__main__":
    sys.exit(main())
