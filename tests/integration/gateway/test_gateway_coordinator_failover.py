"""A member's Heartbeat stream relayed by the gateway survives the loss of
the coordinator replica it was relayed to: the gateway ends the client's
stream with UNAVAILABLE, the member re-attaches through the gateway, which
relays it to a replica that answers; consumption and commits carry on."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tidelog import AdminClient, Consumer, NewTopic, Producer

from tests.support.cluster import ClusterProcesses
from tests.support.coordinator import start_coordinator
from tests.support.gateway import GatewayProcess

pytestmark = pytest.mark.timeout(120)


def test_member_carries_on_when_its_coordinator_is_killed(
    cluster: ClusterProcesses, gateway: GatewayProcess, tmp_path: Path, names: tuple[str, str]
) -> None:
    topic, group = names
    # "a0" sorts before the cluster's "c0": the gateway relays to it first.
    doomed = start_coordinator(
        cluster.etcd.endpoint, tmp_path, prefix=cluster.prefix, coordinator_id="a0"
    )
    try:
        deadline = time.monotonic() + 30
        while len(cluster.describe(cluster.coordinators[0].address).coordinators) < 2:
            assert time.monotonic() < deadline, "the second coordinator did not register"
            time.sleep(0.1)
        with AdminClient(gateway.address) as admin:
            admin.create_topics([NewTopic(topic, 2)])
        with (
            Producer(gateway.address, linger_ms=2) as producer,
            Consumer(
                topic,
                bootstrap_servers=gateway.address,
                group_id=group,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                session_timeout_ms=10_000,
            ) as consumer,
        ):
            seen: set[bytes] = set()

            def consume_until(count: int) -> None:
                deadline = time.monotonic() + 60
                while len(seen) < count and time.monotonic() < deadline:
                    for records in consumer.poll(timeout_ms=200).values():
                        seen.update(r.value or b"" for r in records)
                consumer.commit()

            for i in range(50):
                producer.send(topic, b"%d" % i)
            producer.flush()
            consume_until(50)
            doomed.kill()
            for i in range(50, 100):
                producer.send(topic, b"%d" % i)
            producer.flush()
            consume_until(100)
        assert seen == {b"%d" % i for i in range(100)}
        with AdminClient(gateway.address) as admin:
            offsets = admin.list_consumer_group_offsets(group)
        assert sum(o.offset for o in offsets.values()) == 100
    finally:
        doomed.kill()
