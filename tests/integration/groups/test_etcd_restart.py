"""etcd restarted in the middle of a group's life: nothing else is restarted.

Its own module, so its own cluster (the `cluster` fixture is per module):
restarting etcd must not disturb other tests.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.integration.groups.conftest import (
    ConsumerProcess,
    create_topic,
    produce,
    wait_until,
)
from tests.support.cluster import ClusterProcesses

pytestmark = pytest.mark.timeout(90)


def test_members_watches_controller_and_brokers_recover_from_an_etcd_restart(
    cluster: ClusterProcesses,
    consumers: Callable[..., ConsumerProcess],
    names: tuple[str, str],
) -> None:
    topic, group = names
    create_topic(cluster, topic, 6)
    a, b = consumers(group, topic), consumers(group, topic)
    wait_until(lambda: len(a.assignment()) == len(b.assignment()) == 3, 30, "assigned")
    produce(cluster, topic, 6, 10)
    wait_until(lambda: len(a.processed() | b.processed()) == 60, 30, "60 processed")

    cluster.etcd.restart()

    # Brokers are registered again and the controller is elected again.
    def recovered() -> bool:
        reply = cluster.describe(cluster.coordinators[0].address)
        return len(reply.brokers) == 3 and bool(reply.controller_id)

    wait_until(recovered, 30, "3 brokers registered and a controller after the restart")
    # Members keep their partitions and keep consuming.
    produce(cluster, topic, 6, 10)
    wait_until(lambda: len(a.processed() | b.processed()) == 120, 30, "120 processed")
    # Watches work: a new member triggers a rebalance that completes.
    c = consumers(group, topic)
    wait_until(
        lambda: all(len(m.assignment()) == 2 for m in (a, b, c)), 30, "rebalanced to 3 members"
    )
    assert a.count("lost") == 0 and b.count("lost") == 0
