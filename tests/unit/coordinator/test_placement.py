"""Replica placement: (start + i + j) mod n, rack-aware when racks are given."""

from __future__ import annotations

import collections

import pytest
from tidelog.errors import InvalidReplicationFactorError
from tidelog_coordinator.placement import BrokerSlot, place_replicas


def test_leaders_and_replicas_spread_evenly() -> None:
    brokers = [BrokerSlot(i) for i in (3, 1, 2)]
    placement = place_replicas("orders", brokers, 12, 3)
    assert all(len(set(r)) == 3 for r in placement)
    assert collections.Counter(r[0] for r in placement) == {1: 4, 2: 4, 3: 4}
    ids = [1, 2, 3]
    first = ids.index(placement[0][0])
    for i, replicas in enumerate(placement):
        assert replicas == [ids[(first + i + j) % 3] for j in range(3)]


def test_rack_aware_puts_each_replica_in_another_rack() -> None:
    brokers = [BrokerSlot(1, "a"), BrokerSlot(2, "a"), BrokerSlot(3, "b"), BrokerSlot(4, "b"),
               BrokerSlot(5, "c"), BrokerSlot(6, "c")]  # fmt: skip
    rack = {b.broker_id: b.rack for b in brokers}
    placement = place_replicas("t", brokers, 30, 3)
    for replicas in placement:
        assert len({rack[b] for b in replicas}) == 3
    assert max(collections.Counter(r[0] for r in placement).values()) == 5


def test_replication_factor_larger_than_brokers_is_refused() -> None:
    with pytest.raises(InvalidReplicationFactorError, match="2 live brokers"):
        place_replicas("t", [BrokerSlot(1), BrokerSlot(2)], 3, 3)
