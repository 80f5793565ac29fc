"""The cluster-wide partition limit checked at topic creation, and how a
broker derives its limit from its open-file limit (issue 16, item 7)."""

from __future__ import annotations

import pytest
from tidelog.errors import InvalidPartitionsError
from tidelog_broker.resources import (
    DESCRIPTORS_PER_PARTITION,
    RESERVED_DESCRIPTORS,
    partition_capacity,
)
from tidelog_coordinator.placement import BrokerSlot, check_capacity, place_replicas


def test_a_broker_derives_its_limit_from_its_open_file_limit() -> None:
    assert partition_capacity(1024, 0) == (1024 - RESERVED_DESCRIPTORS) // DESCRIPTORS_PER_PARTITION
    assert partition_capacity(64, 0) == 0
    assert partition_capacity(1024, 50) == 50  # max.partitions wins


def test_a_placement_within_every_brokers_limit_passes() -> None:
    placement = place_replicas("t", [BrokerSlot(0), BrokerSlot(1), BrokerSlot(2)], 30, 3)
    check_capacity("t", placement, {0: 70, 1: 70, 2: 70}, {0: 100, 1: 100, 2: 100})


def test_a_placement_past_a_brokers_limit_is_refused_naming_it() -> None:
    slots = [BrokerSlot(0), BrokerSlot(1), BrokerSlot(2)]
    placement = place_replicas("t", slots, 7000, 3)
    with pytest.raises(InvalidPartitionsError) as info:
        check_capacity("t", placement, {0: 10}, {0: 4000, 1: 4000, 2: 4000})
    message = str(info.value)
    assert "21000 partition replicas (7000 partitions)" in message
    assert "broker 0 would host 7010, over its limit of 4000" in message
    assert "room for 11990 more" in message


def test_brokers_that_report_no_limit_are_not_limited() -> None:
    placement = place_replicas("t", [BrokerSlot(0)], 500, 1)
    check_capacity("t", placement, {0: 10_000}, {0: None})
