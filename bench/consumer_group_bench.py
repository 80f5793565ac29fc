"""Numbers for issue 4 with real SDK consumers (run by hand; it prints a small table).

    .venv/bin/python -m bench.consumer_group_bench

bench/group_bench.py (in `make bench`) measures the coordinator alone; this
one the whole path, consumers in their own processes with records flowing.

1. Rebalance time, 3 -> 4 members over 24 partitions, real SDK consumers in
   their own processes, cooperative-sticky, records flowing the whole time:
   from the 4th member's subscribe() to the moment every member owns its
   final share and the 4th has processed records from each of its
   partitions ("every member consuming again"). The three old members never
   stop consuming the partitions they keep.
2. Offset commit throughput through one coordinator on one etcd:
   partition-offsets per second, commits of 1 and of 24 partitions, one at a
   time and 16 in flight.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import threading
import time
from pathlib import Path

from tidelog import Producer
from tidelog.group import GroupMembership
from tidelog.types import TopicPartition

from tests.integration.groups.conftest import ConsumerProcess, create_topic, wait_until
from tests.support.cluster import ClusterProcesses, start_cluster
from tests.support.etcd import EtcdProcess

PARTITIONS = 24
ROUNDS = 3


def _produce_forever(cluster: ClusterProcesses, topic: str, stop: threading.Event) -> None:
    with Producer(cluster.bootstrap, linger_ms=5) as producer:
        i = 0
        while not stop.is_set():
            for p in range(PARTITIONS):
                producer.send(topic, value=b"x" * 100, partition=p)
            i += 1
            time.sleep(0.02)


def rebalance_round(cluster: ClusterProcesses, root: Path, n: int) -> float:
    topic, group = f"measure-{n}", f"measure-g{n}"
    create_topic(cluster, topic, PARTITIONS)
    stop = threading.Event()
    producer = threading.Thread(target=_produce_forever, args=(cluster, topic, stop))
    producer.start()
    members = [
        ConsumerProcess([cluster.bootstrap, group, topic, "10000"], root / f"c{n}-{i}.log")
        for i in range(3)
    ]
    try:
        wait_until(
            lambda: (
                sum(len(m.assignment()) for m in members) == PARTITIONS
                and all(m.processed() for m in members)
            ),
            60,
            "3 members consuming",
        )
        fourth = ConsumerProcess([cluster.bootstrap, group, topic, "10000"], root / f"c{n}-3.log")
        members.append(fourth)

        def settled() -> bool:
            owned = [m.assignment() for m in members]
            if sum(map(len, owned)) != PARTITIONS or any(len(o) != 6 for o in owned):
                return False
            seen = {p for p, _ in fourth.processed()}
            return owned[3] <= seen

        wait_until(settled, 60, "4 members consuming")
        start = next(e["t"] for e in fourth.snapshot() if e["event"] == "subscribing")
        # The first records of each of its partitions, as the 4th printed them.
        firsts: dict[int, float] = {}
        for e in fourth.snapshot():
            if e["event"] == "records":
                for p, _ in e["records"]:
                    firsts.setdefault(p, e["t"])
        return max(firsts[p] for p in fourth.assignment()) - start
    finally:
        stop.set()
        producer.join()
        for m in members:
            m.kill()


async def commit_throughput(coordinator: str) -> list[tuple[str, float]]:
    topic = "measure-commits"
    member = GroupMembership(coordinator, "measure-commits", topics=[topic])
    await member.start()
    await member.wait_for(lambda m: bool(m.member_id), 20)
    out = []
    for width in (1, 24):
        for in_flight in (1, 16):
            tps = [TopicPartition(topic, p) for p in range(width)]
            counter = [0]
            deadline = time.monotonic() + 3

            async def worker(
                tps: list[TopicPartition], deadline: float, counter: list[int]
            ) -> None:
                while time.monotonic() < deadline:
                    await member.commit(dict.fromkeys(tps, counter[0]))
                    counter[0] += 1

            start = time.monotonic()
            await asyncio.gather(*(worker(tps, deadline, counter) for _ in range(in_flight)))
            elapsed = time.monotonic() - start
            label = f"{width} partition(s)/commit, {in_flight} in flight"
            out.append((label, counter[0] * width / elapsed))
    await member.close()
    return out


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="tidelog-measure-"))
    etcd = EtcdProcess.start(root)
    cluster = start_cluster(root, etcd=etcd, brokers=3)
    try:
        create_topic(cluster, "measure-commits", PARTITIONS)
        times = [rebalance_round(cluster, root, n) for n in range(ROUNDS)]
        print(
            f"rebalance 3 -> 4 members, {PARTITIONS} partitions (subscribe() to the new "
            f"member consuming all its partitions): median {statistics.median(times):.2f} s, "
            f"all {', '.join(f'{t:.2f}' for t in times)}"
        )
        for label, rate in asyncio.run(commit_throughput(cluster.coordinators[0].address)):
            print(f"offset commits, {label}: {rate:,.0f} partition-offsets/s")
    finally:
        cluster.stop()
        etcd.stop()


if __name__ == "__main__":
    main()
