"""A replicated cluster for fault tests: etcd, a coordinator, three brokers
with short session TTLs, and the workload helpers the tests share (a
producer that records what was acknowledged, a killer that SIGKILLs
leaders, a reader that reads every partition back).

Every process is started by the test and stopped through its own PID.
"""

from __future__ import annotations

import os
import random
import struct
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from tidelog import AdminClient, NewTopic, Producer
from tidelog.records import LOG_OVERHEAD
from tidelog.v1 import log_pb2, log_pb2_grpc

from tests.support.coordinator import CoordinatorProcess, start_coordinator
from tests.support.etcd import EtcdProcess
from tests.support.processes import BrokerProcess, start_broker
from tests.support.read_to_end import batches_to_end

SESSION_TTL_S = 2
#: Followers that stop fetching leave the ISR after this (tests: short).
REPLICA_LAG_MS = 3000


@dataclass
class ReplicatedCluster:
    etcd: EtcdProcess
    root: Path
    prefix: str
    coordinator: CoordinatorProcess | None = None
    brokers: list[BrokerProcess] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers)

    def start(
        self,
        count: int = 3,
        broker_settings: Sequence[str] = (),
        coordinator_session_ttl_s: int = SESSION_TTL_S,
    ) -> None:
        """`coordinator_session_ttl_s`: longer for a test that freezes the
        coordinator (SIGSTOP) and needs it to be the controller still when
        it resumes."""
        self.coordinator = start_coordinator(
            self.etcd.endpoint,
            self.root / "logs",
            prefix=self.prefix,
            coordinator_id="c0",
            session_ttl_s=coordinator_session_ttl_s,
        )
        for broker_id in range(count):
            args = [
                "--etcd", self.etcd.endpoint,
                "--etcd-prefix", self.prefix,
                "--session-ttl-s", str(SESSION_TTL_S),
                "--set", f"replica.lag.time.max.ms={REPLICA_LAG_MS}",
            ]  # fmt: skip
            for setting in broker_settings:
                args += ["--set", setting]
            self.brokers.append(
                start_broker(
                    self.root / f"broker-{broker_id}", extra_args=args, broker_id=broker_id
                )
            )

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()
        if self.coordinator is not None:
            self.coordinator.stop()

    def metadata(self, topic: str) -> log_pb2.MetadataResponse | None:
        for broker in self.brokers:
            if broker.proc is None:
                continue
            try:
                with grpc.insecure_channel(broker.address) as channel:
                    return log_pb2_grpc.LogStub(channel).Metadata(
                        log_pb2.MetadataRequest(topics=[topic]), timeout=2
                    )
            except grpc.RpcError:
                continue
        return None

    def leaders(self, topic: str) -> dict[int, int]:
        reply = self.metadata(topic)
        if reply is None:
            return {}
        return {p.partition: p.leader_id for p in reply.topics[0].partitions}

    def isr(self, topic: str) -> dict[int, list[int]]:
        reply = self.metadata(topic)
        if reply is None:
            return {}
        return {p.partition: list(p.isr) for p in reply.topics[0].partitions}

    def wait_full_isr(self, topic: str, replicas: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            isr = self.isr(topic)
            leaders = self.leaders(topic)
            if (
                isr
                and all(len(m) == replicas for m in isr.values())
                and all(v >= 0 for v in leaders.values())
            ):
                return True
            time.sleep(0.1)
        return False

    def leaders_serving(self, topic: str) -> bool:
        """Whether every partition has a leader in metadata and that broker
        itself answers as its leader (ListOffsets, which only a leader
        answers). Metadata is a broker's view of etcd: it names the leader
        the controller wrote, which may not have applied that state yet."""
        leaders = self.leaders(topic)
        if not leaders or min(leaders.values()) < 0:
            return False
        for partition, leader in leaders.items():
            request = log_pb2.ListOffsetsRequest(
                partitions=[
                    log_pb2.ListOffsetsPartition(
                        topic=topic, partition=partition, timestamp_ms=log_pb2.LATEST
                    )
                ]
            )
            try:
                with grpc.insecure_channel(self.brokers[leader].address) as channel:
                    reply = log_pb2_grpc.LogStub(channel).ListOffsets(request, timeout=2)
            except grpc.RpcError:
                return False
            if reply.partitions[0].error.code:
                return False
        return True

    def create_topic(
        self, name: str, partitions: int, replicas: int, configs: dict[str, str]
    ) -> None:
        """Create the topic and wait until every partition's leader serves it.
        A full ISR in metadata alone proves nothing: a new topic's states
        are written with every replica in the ISR, so a test that wrote to
        the named leader at once sometimes found it had not applied its
        state yet (NOT_LEADER_OR_FOLLOWER)."""
        with AdminClient(bootstrap_servers=self.bootstrap) as admin:
            admin.create_topics([NewTopic(name, partitions, replicas, topic_configs=configs)])
        assert self.wait_full_isr(name, replicas, 20), self.isr(name)
        deadline = time.monotonic() + 20
        while not self.leaders_serving(name):
            assert time.monotonic() < deadline, f"{name}: leaders {self.leaders(name)} not serving"
            time.sleep(0.1)


@contextmanager
def running_replicated_cluster(
    etcd: EtcdProcess, root: Path, prefix: str, count: int = 3
) -> Iterator[ReplicatedCluster]:
    """A started ReplicatedCluster for the duration of the block."""
    cluster = ReplicatedCluster(etcd, root, prefix)
    try:
        cluster.start(count)
        yield cluster
    finally:
        cluster.stop()


class AckedProducer:
    """Sends `total` records (value = b"<partition>:<seq>") round-robin to
    the partitions, from a thread, spread evenly over `duration_s`, and
    records which were acknowledged."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        total: int,
        duration_s: float = 0.0,
        **options: Any,
    ):
        self.duration_s = duration_s
        self.topic = topic
        self.partitions = partitions
        self.total = total
        self.options = options
        self.bootstrap = bootstrap
        self.acked: dict[int, list[int]] = defaultdict(list)
        #: Per partition, how many records were handed to send() (seqs 0..n-1).
        self.sent = [0] * partitions
        self.failed = 0
        #: Why sends failed: error text -> count.
        self.errors: Counter[str] = Counter()
        self.ack_times: list[float] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the producer did not finish"

    def _on_ok(self, partition: int, seq: int) -> None:
        with self._lock:
            self.acked[partition].append(seq)
            self.ack_times.append(time.monotonic())

    def _on_error(self, error: BaseException) -> None:
        with self._lock:
            self.failed += 1
            self.errors[f"{type(error).__name__}: {error}"[:300]] += 1

    def _run(self) -> None:
        try:
            with Producer(bootstrap_servers=self.bootstrap, **self.options) as producer:
                started = time.monotonic()
                for i in range(self.total):
                    if self.stop.is_set():
                        break
                    if self.duration_s and i % 500 == 0:
                        due = started + self.duration_s * i / self.total
                        time.sleep(max(0.0, due - time.monotonic()))
                    partition = i % self.partitions
                    seq = self.sent[partition]
                    self.sent[partition] += 1
                    future = producer.send(
                        self.topic, value=f"{partition}:{seq}".encode(), partition=partition
                    )
                    future.add_callback(lambda _md, p=partition, s=seq: self._on_ok(p, s))
                    future.add_errback(self._on_error)
                producer.flush()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def acked_count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self.acked.values())


#: A batch's first fields: base offset (int64) and the length of the rest (int32).
BATCH_PREFIX = struct.Struct(">qi")


class LeaderKiller:
    """Every `period_s` (or as soon as the last restart is done, when it took
    longer), SIGKILLs the leader of a random partition and restarts it
    (optionally tearing a follower's log tail while it is down)."""

    def __init__(self, cluster: ReplicatedCluster, topic: str, period_s: float, seed: int = 7):
        self.cluster = cluster
        self.topic = topic
        self.period_s = period_s
        self.random = random.Random(seed)
        self.kills = 0
        self.torn = 0
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None
        self.tear_follower = False

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self.stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        # On a fixed cadence from the start (kill k is due at k * period_s), not
        # period_s after the last restart: restarts (two brokers' when a
        # follower is torn) took ~5 s under load, and a 12 s run then saw one
        # kill where the test needs two.
        started = time.monotonic()
        try:
            while not self.stop.wait(
                max(0.0, started + (self.kills + 1) * self.period_s - time.monotonic())
            ):
                leaders = self.cluster.leaders(self.topic)
                live = [b for b in leaders.values() if b >= 0]
                if not live:
                    self.stop.wait(0.2)  # due, but no leader to kill yet
                    continue
                victim_id = self.random.choice(live)
                victim = self.cluster.brokers[victim_id]
                victim.kill()
                self.kills += 1
                if self.tear_follower:
                    self._tear_a_follower(victim_id)
                time.sleep(0.5)
                victim.spawn()
        except BaseException as exc:
            self.error = exc

    def _tear_a_follower(self, leader_id: int) -> None:
        """Kill a follower too and cut its active segment: at a random byte
        (recovery finds a torn batch), or, every other tear, at a random
        batch boundary (what ext4 leaves after a power loss: the size of an
        earlier write(); recovery finds nothing wrong, and only the missing
        clean-shutdown marker says records may be gone). A 900 s soak with
        random bytes alone lost 9.9 M acknowledged records through the ~1 in
        600 tears that landed on a boundary."""
        others = [
            b for b in self.cluster.brokers if b.broker_id != leader_id and b.proc is not None
        ]
        if len(others) < 2:
            return
        follower = self.random.choice(others)
        follower.kill()
        for log_dir in follower.data_dir.glob(f"{self.topic}-*"):
            segments = sorted(log_dir.glob("*.log"))
            if not segments:
                continue
            active = segments[-1]
            size = active.stat().st_size
            if size > 0:
                os.truncate(active, self._cut_at(active, size))
                self.torn += 1
        follower.spawn()

    def _cut_at(self, segment: Path, size: int) -> int:
        """Where to cut `segment` (`size` bytes): see `_tear_a_follower`."""
        if self.torn % 2 == 0:
            return self.random.randrange(size)
        starts = _batch_starts(segment.read_bytes())
        return self.random.choice(starts) if starts else 0


def _batch_starts(data: bytes) -> list[int]:
    """Where each whole batch of a segment's bytes starts (from the length
    in each header; a partial batch at the end, which the kill may have
    left, is not one)."""
    starts = []
    position = 0
    while position + LOG_OVERHEAD <= len(data):
        size = BATCH_PREFIX.unpack_from(data, position)[1] + LOG_OVERHEAD
        if position + size > len(data):
            break
        starts.append(position)
        position += size
    return starts


def read_back(
    bootstrap: str, topic: str, partitions: int, timeout_s: float
) -> dict[int, list[int]]:
    """Every record of every partition, in log order, as seqs.

    Fails, saying how far it got, when it did not reach every partition's end
    offset (taken at the start) within `timeout_s`: a read cut short is not
    a loss, and a test that counted the records it never read as lost
    reported a loss that was not there."""
    out: dict[int, list[int]] = defaultdict(list)
    started = time.monotonic()
    for _, batch in batches_to_end(bootstrap, topic, partitions, timeout_s, max_records=100_000):
        for record in batch:
            partition, seq = record.value.decode().split(":")
            out[int(partition)].append(int(seq))
    print(
        f"read back {sum(len(v) for v in out.values())} records of {topic} "
        f"in {time.monotonic() - started:.0f} s"
    )
    return out


@dataclass
class Verdict:
    acked: int
    read: int
    lost: int
    duplicates: int
    out_of_order: int


def compare(acked: dict[int, list[int]], read: dict[int, list[int]]) -> Verdict:
    lost = duplicates = out_of_order = 0
    for partition in set(acked) | set(read):
        seen = read.get(partition, [])
        counts: dict[int, int] = defaultdict(int)
        for seq in seen:
            counts[seq] += 1
        duplicates += sum(c - 1 for c in counts.values() if c > 1)
        lost += sum(1 for seq in acked.get(partition, []) if counts.get(seq, 0) == 0)
        acked_set = set(acked.get(partition, []))
        last = -1
        for seq in seen:
            if seq in acked_set:
                if seq < last:
                    out_of_order += 1
                last = max(last, seq)
    return Verdict(
        sum(len(v) for v in acked.values()),
        sum(len(v) for v in read.values()),
        lost,
        duplicates,
        out_of_order,
    )


def describe_losses(acked: dict[int, list[int]], read: dict[int, list[int]]) -> str:
    """Per partition, the acknowledged seqs not read back, as ranges (the
    first few): whether a tail went missing or a stretch in the middle."""
    lines = []
    for partition in sorted(acked):
        seen = set(read.get(partition, []))
        missing = sorted(s for s in acked[partition] if s not in seen)
        if not missing:
            continue
        ranges: list[tuple[int, int]] = []
        for seq in missing:
            if ranges and seq == ranges[-1][1] + 1:
                ranges[-1] = (ranges[-1][0], seq)
            else:
                ranges.append((seq, seq))
        shown = ", ".join(f"{a}-{b}" for a, b in ranges[:8])
        lines.append(
            f"partition {partition}: {len(missing)} lost of {len(acked[partition])} acked, "
            f"read {len(read.get(partition, []))} (max read "
            f"{max(read.get(partition, [-1]))}); {len(ranges)} ranges: {shown}"
        )
    return "\n".join(lines)
