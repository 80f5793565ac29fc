"""Ctrl-C (SIGINT) at random moments to a group Consumer polling in its main
thread, alone on its loop (so poll() runs the SDK's loop: tidelog._sigint):
each interrupt is a KeyboardInterrupt from poll(), the consumer goes on
receiving every record exactly once and in order, stays in its group, and
close() commits and leaves promptly.

The consumer is tests/integration/groups/ctrl_c_proc.py, in a subprocess so
that the signals go to it alone; a producer writes to the topic meanwhile."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tidelog import Consumer, Producer, TopicPartition, _sigint

from tests.integration.groups.conftest import committed_offsets, create_topic
from tests.support.cluster import ClusterProcesses

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 3
PER_PARTITION = 4000
INTERRUPTS = 200
#: Generous bounds for a loaded machine; a consumer whose fetching or
#: membership an interrupt broke never gets there.
READY_S = 60
EXIT_S = 120


class Child:
    """ctrl_c_proc in a subprocess; its JSON lines collected by a thread."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.groups.ctrl_c_proc", *args],
                stdout=subprocess.PIPE,
                stderr=log,
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.events.append(json.loads(line))

    def event(self, kind: str) -> dict[str, Any] | None:
        with self._lock:
            return next((e for e in self.events if e["event"] == kind), None)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def produce_paced(bootstrap: str, topic: str, done: threading.Event) -> None:
    """PER_PARTITION records to each partition, in small bursts over about
    two seconds: the consumer is busy receiving while the interrupts come."""
    with Producer(bootstrap, linger_ms=2) as producer:
        sent = []
        for i in range(0, PER_PARTITION, 50):
            for j in range(i, i + 50):
                for p in range(PARTITIONS):
                    sent.append(producer.send(topic, value=b"%d-%d" % (p, j), partition=p))
            time.sleep(0.025)
        producer.flush()
        for future in sent:
            future.get(timeout=60)
    done.set()


def test_ctrl_c_during_poll_is_raised_by_poll_and_costs_nothing(
    cluster: ClusterProcesses, names: tuple[str, str], tmp_path: Path
) -> None:
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)
    stop_path = tmp_path / "stop"
    child = Child(
        [cluster.bootstrap, group, topic, str(PARTITIONS), str(PER_PARTITION), str(stop_path)],
        tmp_path / "child.log",
    )
    try:
        deadline = time.monotonic() + READY_S
        while child.event("ready") is None:
            assert child.proc.poll() is None, "the consumer process ended early"
            assert time.monotonic() < deadline, "the consumer did not get its partitions"
            time.sleep(0.05)
        produced = threading.Event()
        producer = threading.Thread(
            target=produce_paced, args=(cluster.bootstrap, topic, produced), daemon=True
        )
        producer.start()
        seed = random.randrange(1 << 30)
        rng = random.Random(seed)
        for _ in range(INTERRUPTS):
            time.sleep(rng.uniform(0.001, 0.02))
            if child.proc.poll() is not None:
                break
            child.proc.send_signal(signal.SIGINT)
        producer.join(60)
        assert produced.is_set(), "the producer did not finish"
        stop_path.touch()
        try:
            child.proc.wait(EXIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the consumer did not finish within {EXIT_S} s (seed {seed})")
        report = child.event("report")
        assert child.proc.returncode == 0 and report is not None, (
            f"the consumer process failed (seed {seed}): {child.proc.returncode}"
        )
        print("child report:", report)
        assert report["interrupts"] > 0
        assert report["received"] == {str(p): PER_PARTITION for p in range(PARTITIONS)}, report
        assert all(report["in_order"].values()), report
        committed = asyncio.run(committed_offsets(cluster.bootstrap, group))
        assert committed == {p: PER_PARTITION for p in range(PARTITIONS)}
    finally:
        child.kill()
        log = child.log_path.read_text(errors="replace")[-4000:]
        print(f"--- child log (last 4000 chars)\n{log}")


def test_a_ctrl_c_taken_as_poll_ends_gives_its_records_back(
    cluster: ClusterProcesses, names: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGINT that Python handles at the very end of poll() (at the entry of
    _sigint.leave, after poll() took its records): poll() raises
    KeyboardInterrupt and the records come again from the next poll (they
    were lost once: poll() had looked for a pending interrupt just before)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are set in the main thread only")
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    topic, _ = names
    create_topic(cluster, topic, 1)
    tp = TopicPartition(topic, 0)
    try:
        with Producer(cluster.bootstrap) as producer:
            for i in range(10):
                producer.send(topic, b"%d" % i, partition=0)
            producer.flush()
        with Consumer(
            bootstrap_servers=cluster.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        ) as consumer:
            consumer.assign([tp])
            first: list[int] = []
            deadline = time.monotonic() + READY_S
            while not first and time.monotonic() < deadline:
                first = [r.offset for r in consumer.poll(timeout_ms=200, max_records=1).get(tp, [])]
            assert first == [0]
            leave = _sigint.leave

            def signalled_at_leave(guarded: bool) -> None:
                if guarded:
                    _sigint.STATE.pending = True  # the handler ran here, deferred
                leave(guarded)

            monkeypatch.setattr(_sigint, "leave", signalled_at_leave)
            with pytest.raises(KeyboardInterrupt):
                consumer.poll(timeout_ms=200, max_records=5)
            monkeypatch.setattr(_sigint, "leave", leave)
            again = [r.offset for r in consumer.poll(timeout_ms=2000, max_records=5).get(tp, [])]
            assert again == [1, 2, 3, 4, 5]
    finally:
        signal.signal(signal.SIGINT, before)
