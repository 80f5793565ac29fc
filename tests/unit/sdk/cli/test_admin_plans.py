"""The admin commands' pure parts: the decommission plan, the JSON files
(Kafka's formats, with limits and errors naming the entry), and the
describe filters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tidelog.cli._json_files import (
    MAX_FILE_BYTES,
    plan_json,
    read_offsets,
    read_partitions,
    read_reassignment_plan,
)
from tidelog.cli.brokers import decommission_plan
from tidelog.cli.topics import in_trouble
from tidelog.errors import InvalidRequestError
from tidelog.types import PartitionInfo, TopicDescription, TopicPartition

A, B, C = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def test_decommission_replaces_the_broker_in_place_on_the_least_loaded_broker() -> None:
    racks: dict[int, str | None] = {0: None, 1: None, 2: None, 3: None}
    plan = decommission_plan(1, {A: [1, 0], B: [0, 1], C: [2, 3]}, racks)
    # Broker 1 replaced where it stood (the preferred leader stays first);
    # the load spreads: 2 and 3 each get one.
    assert set(plan) == {A, B}
    assert plan[A][1:] == [0] and plan[B][0] == 0
    assert {plan[A][0], plan[B][1]} == {2, 3}


def test_decommission_keeps_the_rack_when_it_can() -> None:
    racks = {0: "r1", 1: "r2", 2: "r1", 3: "r2"}
    assert decommission_plan(1, {A: [1, 0]}, racks) == {A: [3, 0]}


def test_decommission_refuses_a_partition_on_every_broker() -> None:
    with pytest.raises(InvalidRequestError, match=r"a-0 off broker 1.*every other live broker"):
        decommission_plan(1, {A: [0, 1, 2]}, {0: None, 1: None, 2: None})


def write(tmp_path: Path, data: object) -> str:
    path = tmp_path / "f.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def test_reassignment_plan_round_trips_and_is_checked(tmp_path: Path) -> None:
    plan = {A: [2, 3], C: [1]}
    assert read_reassignment_plan(write(tmp_path, json.loads(plan_json(plan)))) == plan
    entry = {"topic": "a", "partition": 0, "replicas": [1], "log_dirs": ["any"]}
    assert read_reassignment_plan(write(tmp_path, {"partitions": [entry]})) == {A: [1]}
    for bad, message in [
        ("{", "not JSON"),
        ({"version": 1}, '"partitions" list'),
        ({"partitions": [{"topic": "a", "partition": -1, "replicas": [1]}]}, "partition"),
        ({"partitions": [{"topic": "a", "partition": 0, "replicas": []}]}, "a-0.*replicas"),
        ({"partitions": [entry, entry]}, "a-0 twice"),
    ]:
        with pytest.raises(ValueError, match=message):
            read_reassignment_plan(write(tmp_path, bad))


def test_offsets_and_partitions_files(tmp_path: Path) -> None:
    offsets = {"partitions": [{"topic": "a", "partition": 1, "offset": -1}], "version": 1}
    assert read_offsets(write(tmp_path, offsets)) == {B: -1}
    with pytest.raises(ValueError, match="offset"):
        read_offsets(write(tmp_path, {"partitions": [{"topic": "a", "partition": 1}]}))
    assert read_partitions(write(tmp_path, {"partitions": [{"topic": "b", "partition": 0}]})) == [C]


def test_files_over_the_limit_are_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(ValueError, match=f"at most {MAX_FILE_BYTES}"):
        read_offsets(str(path))


def info(leader: int, replicas: list[int], isr: list[int]) -> PartitionInfo:
    return PartitionInfo(0, leader, replicas, isr, 0, 0, 0, 0, 1)


def test_describe_filters() -> None:
    topic = TopicDescription("t", [], {"min.insync.replicas": "2"})
    live = {0, 1}
    healthy, lagging, alone = (
        info(0, [0, 1, 2], [0, 1, 2]),
        info(0, [0, 1, 2], [0, 1]),
        info(0, [0, 1, 2], [0]),
    )
    under = "--under-replicated-partitions"
    assert not in_trouble(under, topic, healthy, live) and in_trouble(under, topic, lagging, live)
    assert in_trouble("--under-min-isr-partitions", topic, alone, live)
    assert not in_trouble("--under-min-isr-partitions", topic, lagging, live)
    assert in_trouble("--at-min-isr-partitions", topic, lagging, live)
    assert in_trouble("--unavailable-partitions", topic, info(-1, [0], [0]), live)
    assert in_trouble("--unavailable-partitions", topic, info(2, [2], [2]), live)  # dead leader
    assert not in_trouble("--unavailable-partitions", topic, healthy, live)
