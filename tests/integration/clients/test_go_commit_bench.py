"""The Go example's `commit-bench` (examples/go/commitbench.go), the load
generator of bench/group_bench.py's members' commits from Go clients, against
a real coordinator: driven as the bench drives it ("ready", then a line on
stdin), its commits are really committed (each group's offsets, read back
with the Python SDK, are the number of commits its member made, which the
program's figures add up to), and its members leave when it is done."""

from __future__ import annotations

import json
import subprocess

import pytest
from tidelog import AdminClient, NewTopic, TopicPartition

from tests.integration.clients.conftest import build
from tests.support.cluster import ClusterProcesses

# Generous: the first run on a machine builds the tools and the example (minutes).
pytestmark = pytest.mark.timeout(900)

MEMBERS = 3
PARTITIONS = 2
RUN_TIMEOUT_S = 120


def test_go_commit_bench_commits_what_it_counts(request: pytest.FixtureRequest) -> None:
    # Built before the cluster starts: a machine without Go skips at once.
    program = build("examples/go/build.sh")
    cluster: ClusterProcesses = request.getfixturevalue("cluster")
    coordinator = cluster.coordinators[0].address
    topic, prefix = "go-commit-bench", "go-commit-bench-"
    groups = [f"{prefix}{i}" for i in range(MEMBERS)]
    with AdminClient(bootstrap_servers=coordinator) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])

    command = [str(program), "commit-bench", "-coordinator", coordinator, "-topic", topic,
               "-partitions", str(PARTITIONS), "-members", str(MEMBERS), "-seconds", "1",
               "-group-prefix", prefix]  # fmt: skip
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None and process.stdin is not None
            ready = process.stdout.readline()
            assert ready == "ready\n", f"{ready!r}: {process.stderr and process.stderr.read()}"
            # Every member owns the partitions it will commit before the go-ahead.
            with AdminClient(bootstrap_servers=coordinator) as admin:
                described = admin.describe_consumer_groups(groups)
            for group in groups:
                (member,) = described[group].members
                assert {tp.partition for tp in member.owned} >= set(range(PARTITIONS)), group
            process.stdin.write("go\n")
            process.stdin.flush()
            out, err = process.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0, f"commit-bench failed:\n{out}\n{err}"
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["errors"] == 0
    assert figures["requests"] >= MEMBERS
    assert figures["partition_offsets"] == figures["requests"] * PARTITIONS

    # One commit in flight per member, offsets 1, 2, ...: each group's
    # committed offset is its member's number of commits.
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with AdminClient(bootstrap_servers=coordinator) as admin:
        committed = {g: admin.list_consumer_group_offsets(g, partitions) for g in groups}
        after = admin.describe_consumer_groups(groups)
    commits = {g: committed[g][partitions[0]].offset for g in groups}
    assert all(n >= 1 for n in commits.values()), commits
    for g in groups:
        assert {committed[g][tp].offset for tp in partitions} == {commits[g]}, g
    assert sum(commits.values()) == figures["requests"]
    assert all(not after[g].members for g in groups), "the members left"
