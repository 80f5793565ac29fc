"""`tidelog dev` survives a broker's death: the demonstration the README
invites (kill a broker of a replicated topic, watch the fail-over) run as a
user would, with a producer (acks=all) and a consumer going all along."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from tidelog import AdminClient, Consumer, Producer, TopicPartition
from tidelog.errors import TidelogError

from tests.integration.test_cli import kill_dev, start_dev, tidelog, wait_banner
from tests.support.processes import free_ports_in_a_row

pytestmark = pytest.mark.timeout(300)

TOPIC = "failover"
PARTITIONS = 3


class Output:
    """What `tidelog dev` prints after its banner, read by a thread."""

    def __init__(self, dev: subprocess.Popen[bytes]) -> None:
        self.text = ""
        self._lock = threading.Lock()
        threading.Thread(target=self._read, args=(dev,), daemon=True).start()

    def _read(self, dev: subprocess.Popen[bytes]) -> None:
        assert dev.stdout is not None
        for line in dev.stdout:
            with self._lock:
                self.text += line.decode(errors="replace")

    def __contains__(self, needle: str) -> bool:
        with self._lock:
            return needle in self.text


class Partitions:
    """Each (leader, ISR) state of the topic's partitions, polled from
    before the kill on through one AdminClient: a fail-over that lasts a
    moment is still seen."""

    def __init__(self, bootstrap: str, stop: threading.Event) -> None:
        self.states: list[list[tuple[int, list[int]]]] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        threading.Thread(target=self._poll, args=(bootstrap, stop), daemon=True).start()
        self._ready.wait(30)

    def _poll(self, bootstrap: str, stop: threading.Event) -> None:
        with AdminClient(bootstrap) as admin:
            while not stop.is_set():
                try:
                    (described,) = admin.describe_topics([TOPIC])
                except TidelogError:
                    continue
                state = [(p.leader, sorted(p.isr)) for p in described.partitions]
                with self._lock:
                    if not self.states or self.states[-1] != state:
                        self.states.append(state)
                self._ready.set()
                time.sleep(0.05)

    def seen(self, partition_0: Callable[[list[tuple[int, list[int]]]], bool]) -> bool:
        """Whether any state seen so far of partition 0 satisfies the check."""
        with self._lock:
            return partition_0([state[0] for state in self.states])

    def latest_full(self) -> bool:
        with self._lock:
            return bool(self.states) and all(isr == [0, 1, 2] for _, isr in self.states[-1])


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)


def broker_process(dev_pid: int, broker_id: int) -> psutil.Process:
    for child in psutil.Process(dev_pid).children():
        cmdline = child.cmdline()
        if "tidelog_broker" in cmdline and cmdline[cmdline.index("--broker-id") + 1] == str(
            broker_id
        ):
            return child
    raise AssertionError(f"no process for broker {broker_id}")


def test_a_killed_broker_is_restarted_and_rejoins_without_losing_acknowledged_records(
    tmp_path: Path,
) -> None:
    port = free_ports_in_a_row(4)
    bootstrap = f"127.0.0.1:{port}"
    dev = start_dev(tmp_path / "dev", port, "--brokers", "3")
    children: list[psutil.Process] = []
    stop = threading.Event()
    acknowledged: list[bytes | None] = []
    failed: list[str] = []
    consumed: set[bytes | None] = set()
    try:
        banner = wait_banner(dev).decode()
        assert "started again" in banner, banner
        children = psutil.Process(dev.pid).children(recursive=True)
        output = Output(dev)
        tidelog(
            "topics", "create", TOPIC, "--partitions", str(PARTITIONS),
            "--replication-factor", "3", "--config", "min.insync.replicas=2",
            bootstrap=bootstrap,
        )  # fmt: skip

        def produce() -> None:
            with Producer(bootstrap, acks="all") as producer:
                n = 0
                while not stop.is_set():
                    value = b"r%d" % n
                    n += 1
                    try:
                        producer.send_and_wait(TOPIC, value, timeout=60)
                        acknowledged.append(value)
                    except TidelogError as exc:  # not acknowledged: may be lost
                        failed.append(repr(exc))
                    time.sleep(0.005)

        def consume() -> None:
            with Consumer(bootstrap_servers=bootstrap) as consumer:
                partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
                consumer.assign(partitions)
                consumer.seek_to_beginning(*partitions)
                while not stop.is_set():
                    for batch in consumer.poll(timeout_ms=500).values():
                        consumed.update(record.value for record in batch)

        threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(acknowledged) >= 50, 60, "records acknowledged before the kill")

        with AdminClient(bootstrap) as admin:
            (topic,) = admin.describe_topics([TOPIC])
        victim_id = topic.partitions[0].leader  # a leader: the fail-over is real
        victim = broker_process(dev.pid, victim_id)
        watcher = Partitions(bootstrap, stop)
        victim.kill()
        victim.wait(10)
        before_kill = len(acknowledged)

        wait_until(
            lambda: f"broker {victim_id} exited with code -9" in output, 30, "the death reported"
        )
        wait_until(lambda: f"broker {victim_id} restarted" in output, 60, "the broker restarted")
        reborn = broker_process(dev.pid, victim_id)
        assert reborn.pid != victim.pid
        children.append(reborn)
        assert dev.poll() is None  # the cluster kept running
        # The controller noticed: the victim lost its leadership or left an ISR...
        wait_until(
            lambda: watcher.seen(
                lambda states: any(
                    leader != victim_id or victim_id not in isr for leader, isr in states
                )
            ),
            60,
            f"broker {victim_id} out of partition 0's leadership or ISR",
        )
        # ...and then it is back in every ISR.
        wait_until(lambda: watcher.latest_full(), 120, f"broker {victim_id} back in every ISR")
        described = tidelog("topics", "describe", TOPIC, bootstrap=bootstrap).stdout.decode()
        rows = [line.split() for line in described.splitlines()[2:] if line.strip()]
        assert len(rows) == PARTITIONS, described
        assert all(sorted(row[3].split(",")) == ["0", "1", "2"] for row in rows), described
        # Writes went on after the kill, and nothing acknowledged is lost.
        wait_until(lambda: len(acknowledged) >= before_kill + 50, 60, "writes after the kill")
        stop.set()
        for thread in threads:
            thread.join(90)
        with Consumer(bootstrap_servers=bootstrap) as consumer:
            partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            everything: set[bytes | None] = set()
            deadline = time.monotonic() + 60
            while not set(acknowledged) <= everything and time.monotonic() < deadline:
                for batch in consumer.poll(timeout_ms=500).values():
                    everything.update(record.value for record in batch)
        lost = set(acknowledged) - everything
        assert not lost, f"{len(lost)} acknowledged records lost: {sorted(map(repr, lost))[:10]}"
        assert consumed, "the consumer running during the kill read nothing"

        dev.send_signal(signal.SIGINT)
        assert dev.wait(timeout=60) == 0
        _gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, alive
    finally:
        stop.set()
        kill_dev(dev, children)


def test_a_broker_that_crashes_at_start_is_left_down_after_a_few_restarts(
    tmp_path: Path,
) -> None:
    """No hot loop: the delay doubles and the restarts per minute are capped;
    then the broker stays down, said so, and the rest keeps serving."""
    port = free_ports_in_a_row(3)
    data_dir = tmp_path / "dev"
    dev = start_dev(data_dir, port, "--brokers", "2")
    children: list[psutil.Process] = []
    try:
        wait_banner(dev)
        children = psutil.Process(dev.pid).children(recursive=True)
        output = Output(dev)
        broken = broker_process(dev.pid, 1)
        broken.kill()
        broken.wait(10)
        # Its data directory becomes a file: every start now fails at once.
        (data_dir / "broker-1").rename(data_dir / "broker-1.moved")
        (data_dir / "broker-1").write_bytes(b"")

        wait_until(lambda: "broker 1 exited" in output and "left down" in output, 180, "given up")
        restarts = output.text.count("broker 1 restarted")
        assert restarts == 5, output.text  # RESTARTS_PER_MINUTE
        delays = re.findall(
            r"broker 1 exited with code -?\d+; restarting it in (\d+) s", output.text
        )
        assert [int(d) for d in delays] == [1, 2, 4, 8, 16], output.text
        time.sleep(3)  # and no more after it gave up
        assert output.text.count("broker 1 restarted") == restarts
        assert dev.poll() is None
        listed = tidelog("topics", "list", bootstrap=f"127.0.0.1:{port}")  # broker 0 serves
        assert listed.returncode == 0

        dev.send_signal(signal.SIGINT)
        assert dev.wait(timeout=60) == 0
        _gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, alive
    finally:
        kill_dev(dev, children)


def test_no_restart_leaves_a_dead_broker_down_and_the_rest_serving(tmp_path: Path) -> None:
    port = free_ports_in_a_row(3)
    dev = start_dev(tmp_path / "dev", port, "--brokers", "2", "--no-restart")
    children: list[psutil.Process] = []
    try:
        banner = wait_banner(dev).decode()
        assert "left down (--no-restart)" in banner, banner
        children = psutil.Process(dev.pid).children(recursive=True)
        output = Output(dev)
        victim = broker_process(dev.pid, 1)
        victim.kill()
        victim.wait(10)
        wait_until(lambda: "broker 1 exited with code -9; left down" in output, 30, "reported")
        assert dev.poll() is None
        tidelog("topics", "list", bootstrap=f"127.0.0.1:{port}")  # broker 0 serves
        assert "broker 1 restarted" not in output
        dev.send_signal(signal.SIGINT)
        assert dev.wait(timeout=60) == 0
        _gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, alive
    finally:
        kill_dev(dev, children)
