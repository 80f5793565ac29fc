"""Creating a topic of many partitions costs no broker its etcd session
(real etcd, a coordinator and three brokers as processes).

Each broker used to open its share of the new logs (~1-3 ms of file-system
work each) and write each new leader's epoch history on its event loop,
back to back: with a few hundred partitions per broker its lease keepalive
did not run for longer than the session TTL, the lease expired, the
controller moved the broker's partitions and shrank their ISRs, and some
were left without a leader for seconds (issue 15's "Found: creating a
topic of thousands of partitions costs brokers their etcd session").

The brokers run with the shortest session TTL etcd allows (2 s, the
brokers' default) so that a starved keepalive shows. A lost session shows
as a new registration: its lease differs from the one before the topic.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from tidelog import AdminClient, NewTopic
from tidelog_server.etcd import connect
from tidelog_server.etcd.keys import Keys

from tests.support.cluster import ClusterProcesses, start_cluster
from tests.support.etcd import EtcdProcess

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

#: On the old code, on this 2-core machine shared with other work: 800 cost
#: a broker its session in 1 of 2 runs, 1,000 in 2 of 2 (all three brokers
#: lost theirs), 1,500 and 3,000 too. ~670 replicas per broker.
PARTITIONS = 1000
TOPIC = "wide"
DEADLINE_S = 120.0
PREFIX = "/wide"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterProcesses]:
    etcd = EtcdProcess.start(tmp_path / "etcd")
    try:
        processes = start_cluster(
            tmp_path / "cluster",
            etcd=etcd,
            prefix=PREFIX,
            brokers=3,
            broker_args=["--session-ttl-s", "2"],  # after the fixtures' 3: it wins
        )
        try:
            yield processes
        finally:
            processes.stop()
    finally:
        etcd.stop()


async def _leases(endpoint: str, broker_ids: list[int]) -> dict[int, int]:
    """Each registered broker's lease id (a missing broker is left out)."""
    client = connect(endpoint)
    keys = Keys(PREFIX)
    try:
        found = {}
        for broker_id in broker_ids:
            got = await client.get(keys.broker(broker_id))
            if got is not None:
                found[broker_id] = got.lease
        return found
    finally:
        await client.close()


def hosted_count(log_path: Path) -> int:
    """How many partitions of TOPIC the broker last said it hosts."""
    counts = re.findall(rf"hosting (\d+) partitions of {TOPIC}\b", log_path.read_text())
    return int(counts[-1]) if counts else 0


def test_creating_a_topic_of_many_partitions_costs_no_broker_its_session(
    cluster: ClusterProcesses,
) -> None:
    ids = [broker.broker_id for broker in cluster.brokers]
    before = asyncio.run(_leases(cluster.etcd.endpoint, ids))
    assert sorted(before) == ids
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 2)])
        replicas = Counter(
            r for p in admin.describe_topics([TOPIC])[0].partitions for r in p.replicas
        )
    # Until every broker has opened all its replicas (or lost its session
    # meanwhile: hosting goes on after that, as its registration does).
    deadline = time.monotonic() + DEADLINE_S
    while any(hosted_count(b.log_path) < replicas[b.broker_id] for b in cluster.brokers):
        assert time.monotonic() < deadline, [hosted_count(b.log_path) for b in cluster.brokers]
        time.sleep(0.5)
    after = asyncio.run(_leases(cluster.etcd.endpoint, ids))
    lost = [
        b.broker_id for b in cluster.brokers if "lost its etcd session" in b.log_path.read_text()
    ]
    assert (after, lost) == (before, [])
