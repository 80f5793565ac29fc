"""Leaders SIGKILLed while the SDK produces through the gateway (acks=all,
replication factor 3): nothing acknowledged is lost, nothing is written
twice. Same workload and checks as test_replication_failover, with the
clients given only the gateway's address (issue 10)."""

from __future__ import annotations

import pytest

from tests.fault.replication_support import (
    AckedProducer,
    LeaderKiller,
    ReplicatedCluster,
    compare,
    read_back,
)
from tests.support.gateway import GatewayProcess

TOPIC = "payments"
PARTITIONS = 3


@pytest.mark.timeout(150)
def test_acks_all_through_the_gateway_loses_nothing_while_leaders_are_killed(
    cluster: ReplicatedCluster, gateway: GatewayProcess
) -> None:
    cluster.create_topic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
    producer = AckedProducer(
        gateway.address,
        TOPIC,
        PARTITIONS,
        60_000,
        12,
        acks="all",
        linger_ms=5,
        delivery_timeout_ms=120_000,
    )
    killer = LeaderKiller(cluster, TOPIC, 3)
    producer.start()
    killer.start()
    producer.join(12 + 120)
    killer.join()
    assert producer.error is None, producer.error
    assert killer.error is None, killer.error
    cluster.wait_full_isr(TOPIC, 3, 30)
    read = read_back(gateway.address, TOPIC, PARTITIONS, 60)
    verdict = compare(producer.acked, read)
    print(f"\nthrough the gateway: kills={killer.kills} failed_sends={producer.failed} {verdict}")
    assert killer.kills >= 2
    assert verdict.acked > 0
    assert verdict.lost == 0, verdict
    # The idempotent producer (on with acks=all) writes each record once and
    # in order through the gateway too, retries included.
    assert verdict.duplicates == 0, verdict
    assert verdict.out_of_order == 0, verdict
