"""A group `Consumer` polling in its main thread while it is sent SIGINT
(Ctrl-C), for tests/integration/groups/test_consumer_ctrl_c.py.

Usage: python -m tests.integration.groups.ctrl_c_proc BOOTSTRAP GROUP TOPIC
       PARTITIONS PER_PARTITION STOP_PATH

Subscribes (auto-commit every 100 ms), polls until it owns all PARTITIONS and
prints {"event": "ready"}; then polls until the file STOP_PATH exists,
counting every KeyboardInterrupt and going on; then polls, with no more
interrupts coming, until it has PARTITIONS * PER_PARTITION records (or a
deadline), closes the consumer (which commits) and prints {"event": "report",
...}: the interrupts, where each was raised (the innermost frame's file), and
whether every partition came exactly once and in order (offsets 0, 1, ...).

Nothing here may lose a poll's result to an interrupt: `batches.append(
consumer.poll(...))` keeps it before any bytecode boundary of this module;
the records are looked at only once the interrupts stopped.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections import Counter
from typing import Any

from tidelog import Consumer

#: How long, after the interrupts stopped, the consumer may take to deliver
#: the rest: generous (a loaded machine); a consumer whose fetching died
#: never does.
DRAIN_S = 60.0


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def where(exc: BaseException) -> str:
    """The file and function the interrupt was raised in (innermost frame)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "?"
    code = tb.tb_frame.f_code
    return f"{os.path.basename(code.co_filename)}:{code.co_name}"


def interrupted_polls(
    consumer: Consumer, batches: list[dict[Any, Any]], stop_path: str, seen: Counter[str]
) -> None:
    """Poll until `stop_path` exists, through any number of interrupts.
    Two nested handlers: one raised between two polls, in this loop's own
    bytecode, lands in the outer one (a third, within microseconds of the
    second, is not coming: the test sends them milliseconds apart)."""
    while True:
        try:
            while not os.path.exists(stop_path):
                try:
                    batches.append(consumer.poll(timeout_ms=50))
                except KeyboardInterrupt as exc:
                    seen[where(exc)] += 1
            return
        except KeyboardInterrupt as exc:
            seen[where(exc)] += 1


def main() -> None:
    bootstrap, group, topic = sys.argv[1:4]
    partitions, per_partition = int(sys.argv[4]), int(sys.argv[5])
    stop_path = sys.argv[6]
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    consumer = Consumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
        enable_auto_commit=True,
        auto_commit_interval_ms=100,
    )
    batches: list[dict[Any, Any]] = []
    while len(consumer.assignment()) < partitions:
        batches.append(consumer.poll(timeout_ms=100))
    emit("ready")
    seen: Counter[str] = Counter()
    interrupted_polls(consumer, batches, stop_path, seen)
    emit("stopped", interrupts=sum(seen.values()))
    total = partitions * per_partition
    deadline = time.monotonic() + DRAIN_S
    received = sum(len(records) for polled in batches for records in polled.values())
    while received < total and time.monotonic() < deadline:
        polled = consumer.poll(timeout_ms=100)
        batches.append(polled)
        received += sum(len(records) for records in polled.values())
    offsets: dict[int, list[int]] = {p: [] for p in range(partitions)}
    for polled in batches:
        for tp, records in polled.items():
            offsets[tp.partition].extend(r.offset for r in records)
    in_order = {p: got == list(range(len(got))) for p, got in offsets.items()}
    start = time.monotonic()
    consumer.close()
    emit(
        "report",
        interrupts=sum(seen.values()),
        raised_in=dict(seen),
        received={p: len(got) for p, got in offsets.items()},
        in_order=in_order,
        close_s=round(time.monotonic() - start, 3),
    )


if __name__ == "__main__":
    main()
