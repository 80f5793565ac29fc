"""The JSON files the admin commands read, in Kafka's tools' formats:

- a reassignment plan (kafka-reassign-partitions' --reassignment-json-file):
  {"version": 1, "partitions": [{"topic": "t", "partition": 0,
  "replicas": [2, 3]}, ...]} ("log_dirs" is accepted and ignored);
- an offsets file (kafka-delete-records' --offset-json-file):
  {"version": 1, "partitions": [{"topic": "t", "partition": 0, "offset": 42}]};
- a partitions file (kafka-leader-election's --path-to-json-file):
  {"partitions": [{"topic": "t", "partition": 0}]}.

Each is read whole, at most MAX_FILE_BYTES, with at most
MAX_PARTITIONS_PER_REQUEST entries; anything malformed raises ValueError
naming the entry and what is wrong (the CLI exits with 2).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tidelog.request_limits import MAX_PARTITIONS_PER_REQUEST
from tidelog.types import TopicPartition

#: Largest JSON file read (a plan of 10,000 partitions is well under it).
MAX_FILE_BYTES = 16 * 1024 * 1024


def _entries(path: str) -> list[dict[str, Any]]:
    file = Path(path)
    try:
        size = file.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ValueError(f"{path} is {size} bytes: at most {MAX_FILE_BYTES} are read")
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    partitions = data.get("partitions") if isinstance(data, dict) else None
    if not isinstance(partitions, list):
        raise ValueError(f'{path}: expected an object with a "partitions" list')
    if len(partitions) > MAX_PARTITIONS_PER_REQUEST:
        raise ValueError(
            f"{path} lists {len(partitions)} partitions: at most {MAX_PARTITIONS_PER_REQUEST}"
        )
    for i, entry in enumerate(partitions):
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: partitions[{i}] is not an object")
    return partitions


def _tp(path: str, i: int, entry: Mapping[str, Any]) -> TopicPartition:
    topic, partition = entry.get("topic"), entry.get("partition")
    if not isinstance(topic, str) or not topic:
        raise ValueError(f'{path}: partitions[{i}] needs a "topic" string')
    if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
        raise ValueError(f'{path}: partitions[{i}] needs a "partition" number >= 0')
    return TopicPartition(topic, partition)


def _no_repeats(path: str, tps: list[TopicPartition]) -> None:
    seen: set[TopicPartition] = set()
    for tp in tps:
        if tp in seen:
            raise ValueError(f"{path} names {tp.topic}-{tp.partition} twice")
        seen.add(tp)


def read_reassignment_plan(path: str) -> dict[TopicPartition, list[int]]:
    """partition -> target replicas, from a kafka-reassign-partitions plan."""
    plan: dict[TopicPartition, list[int]] = {}
    entries = _entries(path)
    tps = []
    for i, entry in enumerate(entries):
        tp = _tp(path, i, entry)
        replicas = entry.get("replicas")
        if (
            not isinstance(replicas, list)
            or not replicas
            or not all(isinstance(b, int) and not isinstance(b, bool) for b in replicas)
        ):
            raise ValueError(
                f'{path}: partitions[{i}] ({tp.topic}-{tp.partition}) needs a "replicas" '
                "list of broker ids"
            )
        tps.append(tp)
        plan[tp] = list(replicas)
    _no_repeats(path, tps)
    return plan


def read_offsets(path: str) -> dict[TopicPartition, int]:
    """partition -> offset, from a kafka-delete-records offsets file."""
    offsets: dict[TopicPartition, int] = {}
    tps = []
    for i, entry in enumerate(_entries(path)):
        tp = _tp(path, i, entry)
        offset = entry.get("offset")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < -1:
            raise ValueError(
                f'{path}: partitions[{i}] ({tp.topic}-{tp.partition}) needs an "offset": '
                "-1 (the high watermark) or a number >= 0"
            )
        tps.append(tp)
        offsets[tp] = offset
    _no_repeats(path, tps)
    return offsets


def read_partitions(path: str) -> list[TopicPartition]:
    """The partitions of a kafka-leader-election partitions file."""
    tps = [_tp(path, i, entry) for i, entry in enumerate(_entries(path))]
    _no_repeats(path, tps)
    return tps


def plan_json(plan: Mapping[TopicPartition, list[int]]) -> str:
    """A reassignment plan in kafka-reassign-partitions' format (one line)."""
    return json.dumps(
        {
            "version": 1,
            "partitions": [
                {"topic": tp.topic, "partition": tp.partition, "replicas": replicas}
                for tp, replicas in sorted(plan.items())
            ],
        }
    )
