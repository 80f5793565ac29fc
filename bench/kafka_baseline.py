"""Apache Kafka 4.x as the baseline for Tidelog's benchmarks, run on this machine.

The point is to measure Kafka itself, with Kafka's own tools, in the same run and on the same
machine as Tidelog, so the comparison is of like with like. Standard library only.

Installing
----------
Kafka is not downloaded as a release tarball: ``bench/kafka/pom.xml`` names the broker
(``org.apache.kafka:kafka_2.13``), the tools (``kafka-tools``: ``org.apache.kafka.tools.
ProducerPerformance``, ``ConsumerPerformance``, ``EndToEndLatency``, ``TopicCommand``) and a
log4j2 binding, and :func:`ensure_kafka` has Maven copy those jars from Maven Central into a
cache directory, ``~/.cache/tidelog/kafka-<version>/`` by default (``$TIDELOG_KAFKA_CACHE``
overrides it; ``$TIDELOG_KAFKA_VERSION`` picks another version, default 4.4.0). A marker file
(``.resolved``, holding the version and the pom's hash) makes later runs skip Maven: a warm
:func:`ensure_kafka` takes milliseconds. It also compiles ``bench/kafka/src/FixedRateLatency.
java`` with ``javac`` into ``<cache>/classes`` (see below). If Java, Maven or the jars cannot
be had, :class:`KafkaUnavailable` says why, so a caller can print it and skip only the
baseline.

Running a cluster
-----------------
:class:`KafkaCluster` starts KRaft nodes in combined mode (``process.roles=broker,controller``)
with a static voter set (``controller.quorum.voters``), after formatting each node's storage
with ``kafka.tools.StorageTool format --cluster-id <random id>``. Every listener is bound to
127.0.0.1 on a free port. Data, ``server.log`` (log4j2, INFO) and the GC log live in a temporary
directory that is removed on exit. Broker JVM: ``-Xms1G -Xmx1G`` and G1, as
``kafka-server-start.sh`` sets it. Readiness is polled with Kafka's own protocol (ApiVersions,
then Metadata until every broker is registered and unfenced), never a fixed sleep. On exit
each node gets SIGTERM, then SIGKILL after a timeout, by its own PID (also registered with
``atexit``). ``broker_count=3`` starts three combined nodes forming one 3-voter quorum, for the
replication workloads.

Workloads and the mapping to the paper
--------------------------------------
Each runner starts one tool JVM (``java -cp <classpath> <main class>``, ``-Xmx512M``), parses
what it prints, and returns a dict in the shared result schema::

    {"workload": str, "system": "kafka", "records_per_s": float, "mb_per_s": float,
     "p50_ms": float|None, "p99_ms": float|None, "p999_ms": float|None,
     "rss_mb": float|None, "cpu_s_per_million": {"broker": float, "client": float},
     "records": int, "record_bytes": int, "detail": {...}}

- ``mb_per_s`` is ``records_per_s * record_bytes / 1e6``: decimal megabytes of record values
  (payload only, no keys, headers or framing). Kafka's tools print MiB (2**20); their own
  figures are kept under ``detail``.
- ``rss_mb`` is the broker JVMs' peak resident set (``VmHWM`` in ``/proc/<pid>/status``, MiB,
  summed over the brokers), read after the workload; it is a peak since the broker started.
- ``cpu_s_per_million.broker`` is the broker JVMs' utime+stime over the workload (from
  ``/proc/<pid>/stat`` before and after, summed over brokers); ``.client`` is the tool JVM's
  user+system time from its rusage (``os.wait4``). Both per million records. The client figure
  includes the JVM's start-up and JIT (about 1-2 CPU seconds), so it is pessimistic for short
  runs.
- :func:`producer_perf` runs ProducerPerformance. ``p50/p99/p999`` are its per-send
  acknowledgement latencies (send() to callback). The paper's "batch of 1 vs 50 messages" is
  mapped with ``batch_records``: the producer's ``batch.size`` is set to hold that many records
  (``61 + n * (record_size + 12)`` bytes: the v2 batch header plus a per-record framing
  allowance), so ``batch_records=1`` gives one record per batch (a record that does not fit a
  batch's room opens a new batch) and ``batch_records=50`` gives about 50; ``linger.ms``
  defaults to 0 for one record per batch and 10 ms otherwise. ``batch_size``/``linger_ms``
  given explicitly win. With neither, Kafka's defaults (16 KiB, 5 ms) apply.
- :func:`consumer_perf` runs ConsumerPerformance with ``--fetch-size`` (that is
  ``max.partition.fetch.bytes``) and ``fetch.max.bytes`` both set to ``fetch_max_bytes``,
  200 KB by default as in the paper. ``records_per_s`` is the tool's ``fetch.nMsg.sec``,
  which excludes the consumer group join (``nMsg.sec`` including it is under ``detail``).
- :func:`end_to_end_latency` does not use Kafka's ``EndToEndLatency``: that tool sends one
  record and waits for it to be consumed before sending the next, so it has no rate. Instead
  ``FixedRateLatency`` (bench/kafka/src, compiled against kafka-clients) produces at a fixed
  rate with ``linger.ms=0`` and consumes in the same JVM (assign + seek to end, so no group);
  a record's latency is the time the consumer's poll returned it minus the send timestamp
  embedded in it. The first two seconds of records (``warmup_records``) are not counted, and
  the client JVM runs C1-only (``LATENCY_JVM``) so its JIT does not take a core from the
  broker. ``linger_ms`` defaults to 0 (each record is sent as soon as it is due). On this
  2-core VM the figures are noisy from run to run (p50 3-30 ms seen at 10,000/s): repeat it.
  Coordinated-omission corrected figures (from the scheduled send time) are under ``detail``.

Measured here (2 vCPU KVM, Kafka 4.4.0, 100-byte records, one partition): cold Maven resolve
~13 s with an empty ~/.m2, warm ensure_kafka ~1 ms, cache 44 MB; single node up in ~6 s,
three nodes in 30-45 s. ProducerPerformance acks=1 with Kafka's default batching 48-84k
records/s (262 KB batches: ~240k/s; ``batch_records=1``: ~4k/s, ``=50``: ~66k/s);
ConsumerPerformance with 200 KB fetches 200-250k records/s. Unthrottled ProducerPerformance
latencies are queueing time in the producer's 32 MB buffer, not broker latency.

Smoke run (about a minute)::

    .venv/bin/python bench/kafka_baseline.py [--records N] [--latency-seconds S] [--json FILE]
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_VERSION = os.environ.get("TIDELOG_KAFKA_VERSION", "4.4.0")
HERE = Path(__file__).resolve().parent
POM = HERE / "kafka" / "pom.xml"
LATENCY_SRC = HERE / "kafka" / "src" / "FixedRateLatency.java"
MARKER = ".resolved"
LATENCY_MAIN = "FixedRateLatency"
PRODUCER_PERF = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERF = "org.apache.kafka.tools.ConsumerPerformance"
TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"
STORAGE_TOOL = "kafka.tools.StorageTool"
KAFKA_MAIN = "kafka.Kafka"
LOOPBACK = "127.0.0.1"

BROKER_JVM = [
    "-Xms1G",
    "-Xmx1G",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]
TOOL_JVM = ["-Xmx512M", "-XX:+UseG1GC", "-Djava.awt.headless=true"]
# The fixed-rate latency client: C1 only. With C2 its JIT compiler burns several CPU seconds
# during the run, which on two cores is taken from the broker and shows up as broker latency
# (measured here: p50 12-16 ms with C2 against 3-5 ms C1-only at 10,000/s).
LATENCY_JVM = [*TOOL_JVM, "-XX:TieredStopAtLevel=1"]
# Short admin tools (format, topic creation): C1 only and serial GC start faster on 2 cores.
ADMIN_JVM = ["-Xmx256M", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]

BROKER_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""

TOOLS_LOG4J2 = """\
status = warn
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
"""


class KafkaUnavailable(Exception):
    """Kafka cannot be run here; ``reason`` says why (print it and skip the baseline)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class KafkaStartError(KafkaUnavailable):
    """The jars are there but the broker did not start (the reason holds its log's tail)."""


class ToolError(RuntimeError):
    """A Kafka tool exited non-zero or printed nothing parsable."""


@dataclass(frozen=True)
class KafkaInstall:
    """What :func:`ensure_kafka` resolved: jars, Java, version and the compiled helper."""

    version: str
    cache_dir: Path
    lib_dir: Path
    java: str
    classes_dir: Path | None  # FixedRateLatency.class, None without javac

    @property
    def classpath(self) -> str:
        return str(self.lib_dir / "*")

    @property
    def tools_log4j2(self) -> Path:
        return self.cache_dir / "tools-log4j2.properties"

    @property
    def broker_log4j2(self) -> Path:
        return self.cache_dir / "broker-log4j2.properties"


# ---------------------------------------------------------------------------- install


def default_cache_dir(version: str = DEFAULT_VERSION) -> Path:
    env = os.environ.get("TIDELOG_KAFKA_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "tidelog" / f"kafka-{version}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tail(text: str, lines: int = 25) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # Maven's colour codes
    return "\n".join(text.strip().splitlines()[-lines:])


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_kafka(
    version: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    mvn_timeout_s: float = 900.0,
) -> KafkaInstall:
    """Return a usable Kafka install, resolving it with Maven on the first call.

    Raises :class:`KafkaUnavailable` when Java or Maven is missing or Maven cannot fetch the
    jars. Warm calls (marker present and matching version and pom) do no Maven work.
    """
    version = version or DEFAULT_VERSION
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir(version)
    java = shutil.which("java")
    if not java:
        raise KafkaUnavailable("no `java` on PATH (Kafka needs Java 17+)")
    if not POM.is_file():
        raise KafkaUnavailable(f"missing {POM}")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KafkaUnavailable(f"cannot create cache dir {cache}: {e}") from e
    lib = cache / "lib"
    want = {"version": version, "pom_sha256": _sha256(POM)}
    with _locked(cache / ".lock"):
        if not _marker_matches(cache / MARKER, want, lib, version):
            _resolve_with_maven(cache, lib, version, mvn_timeout_s)
            (cache / MARKER).write_text(json.dumps(want) + "\n")
        (cache / "broker-log4j2.properties").write_text(BROKER_LOG4J2)
        (cache / "tools-log4j2.properties").write_text(TOOLS_LOG4J2)
        classes = _compile_latency_tool(cache, lib, version)
    return KafkaInstall(
        version=version, cache_dir=cache, lib_dir=lib, java=java, classes_dir=classes
    )


def _marker_matches(marker: Path, want: dict[str, str], lib: Path, version: str) -> bool:
    try:
        have = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return have == want and (lib / f"kafka_2.13-{version}.jar").is_file()


def _resolve_with_maven(cache: Path, lib: Path, version: str, timeout_s: float) -> None:
    mvn = shutil.which("mvn")
    if not mvn:
        raise KafkaUnavailable(
            "no `mvn` on PATH: Maven is needed to fetch Kafka from Maven Central"
        )
    staging = cache / "lib.partial"
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [
        mvn,
        "-q",
        "-B",
        "-Dstyle.color=never",
        "-f",
        str(POM),
        f"-Dkafka.version={version}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}",
        "-DincludeScope=runtime",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise KafkaUnavailable(
            f"Maven did not finish within {timeout_s:.0f}s resolving Kafka {version}"
        ) from e
    if proc.returncode != 0:
        out = _tail(proc.stdout + "\n" + proc.stderr)
        raise KafkaUnavailable(
            f"Maven could not obtain Kafka {version} (exit {proc.returncode}):\n{out}"
        )
    if not (staging / f"kafka_2.13-{version}.jar").is_file():
        raise KafkaUnavailable(f"Maven ran but kafka_2.13-{version}.jar is not in {staging}")
    shutil.rmtree(lib, ignore_errors=True)
    staging.rename(lib)


def _compile_latency_tool(cache: Path, lib: Path, version: str) -> Path | None:
    """FixedRateLatency compiled into a directory named after its source's digest: checkouts
    with different sources (worktrees of several branches) share the cache without one
    deleting the classes another's JVM is loading. Compiled aside, then renamed into place."""
    javac = shutil.which("javac")
    if not javac or not LATENCY_SRC.is_file():
        return None
    digest = _sha256(LATENCY_SRC)
    classes = cache / f"classes-{digest[:16]}"
    if (classes / f"{LATENCY_MAIN}.class").is_file():
        return classes
    staging = Path(tempfile.mkdtemp(prefix="classes-", dir=cache))
    clients = lib / f"kafka-clients-{version}.jar"
    cmd = [javac, "-nowarn", "-d", str(staging), "-cp", str(clients), str(LATENCY_SRC)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise KafkaUnavailable(f"javac failed on {LATENCY_SRC.name}:\n{_tail(proc.stderr)}")
    try:
        staging.rename(classes)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (classes / f"{LATENCY_MAIN}.class").is_file():
            raise
        # Another process put the same classes there first.
    return classes


# ---------------------------------------------------------------------------- /proc helpers

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of a live process, in seconds (0.0 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _proc_hwm_mb(pid: int) -> float | None:
    """Peak resident set (VmHWM) of a live process, in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return None


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# ---------------------------------------------------------------------------- readiness probes


def _kafka_request(
    port: int, api_key: int, api_version: int, body: bytes, timeout: float = 2.0
) -> bytes:
    """One request/response on a fresh connection (request header v1, response header v0)."""
    client_id = b"tidelog-bench"
    header = struct.pack(">hhih", api_key, api_version, 1, len(client_id)) + client_id
    payload = header + body
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as s:
        s.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", _recv_exact(s, 4))[0]
        resp = _recv_exact(s, size)
    if struct.unpack(">i", resp[:4])[0] != 1:
        raise OSError("correlation id mismatch")
    return resp[4:]


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return bytes(buf)


def _registered_brokers(port: int) -> int:
    """Brokers in a Metadata v4 response (registered and unfenced), or -1 if not serving."""
    try:
        api = _kafka_request(port, 18, 0, b"")  # ApiVersions v0: error_code first
        if struct.unpack(">h", api[:2])[0] != 0:
            return -1
        # Metadata v4: topics = [] (none), allow_auto_topic_creation = false
        md = _kafka_request(port, 3, 4, struct.pack(">ib", 0, 0))
        return struct.unpack(">i", md[4:8])[0]  # after throttle_time_ms
    except (OSError, struct.error):
        return -1


# ---------------------------------------------------------------------------- cluster

_LIVE_CLUSTERS: dict[str, KafkaCluster] = {}


def _cluster_id() -> str:
    # As Kafka's Uuid.randomUuid(): never starting with "-", which the storage tool's
    # argument parser would take for an option ("--cluster-id: expected one argument").
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class KafkaCluster:
    """KRaft cluster of ``broker_count`` combined broker+controller nodes on 127.0.0.1.

    ``with KafkaCluster() as k: ...`` gives ``k.bootstrap`` ("127.0.0.1:PORT[,...]"),
    ``k.pid`` (first node's JVM), ``k.pids``, ``k.data_dir``. Use ``keep_dir=True`` to keep
    the temporary directory (logs, data) for a post-mortem.
    """

    def __init__(
        self,
        install: KafkaInstall | None = None,
        broker_count: int = 1,
        heap_opts: Sequence[str] = ("-Xms1G", "-Xmx1G"),
        extra_config: dict[str, str] | None = None,
        start_timeout_s: float = 120.0,
        stop_timeout_s: float = 30.0,
        keep_dir: bool = False,
    ) -> None:
        if broker_count < 1:
            raise ValueError("broker_count must be >= 1")
        self.install = install
        self.broker_count = broker_count
        self.heap_opts = list(heap_opts)
        self.extra_config = dict(extra_config or {})
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.keep_dir = keep_dir
        self.data_dir: Path | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.broker_ports: list[int] = []
        self.controller_ports: list[int] = []
        self._lock = threading.Lock()

    # -- public surface
    @property
    def bootstrap(self) -> str:
        return ",".join(f"{LOOPBACK}:{p}" for p in self.broker_ports)

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def log_path(self, node: int = 0) -> Path:
        assert self.data_dir is not None
        return self.data_dir / f"node{node + 1}" / "logs" / "server.log"

    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- lifecycle
    def start(self) -> None:
        install = self.install = self.install or ensure_kafka()
        self.data_dir = Path(tempfile.mkdtemp(prefix="tidelog-kafka-"))
        atexit.register(self.stop)
        try:
            ports = _free_ports(2 * self.broker_count)
            self.broker_ports = ports[: self.broker_count]
            self.controller_ports = ports[self.broker_count :]
            cluster_id = _cluster_id()
            voters = ",".join(
                f"{i + 1}@{LOOPBACK}:{p}" for i, p in enumerate(self.controller_ports)
            )
            configs = [self._write_node(i, voters) for i in range(self.broker_count)]
            self._format_all(install, configs, cluster_id)
            for i, cfg in enumerate(configs):
                self._launch(install, i, cfg)
            _LIVE_CLUSTERS[self.bootstrap] = self
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _node_dir(self, i: int) -> Path:
        assert self.data_dir is not None
        return self.data_dir / f"node{i + 1}"

    def _write_node(self, i: int, voters: str) -> Path:
        d = self._node_dir(i)
        (d / "data").mkdir(parents=True)
        (d / "logs").mkdir()
        n = self.broker_count
        props = {
            "process.roles": "broker,controller",
            "node.id": str(i + 1),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self.broker_ports[i]},CONTROLLER://{LOOPBACK}:{self.controller_ports[i]}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.broker_ports[i]}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(d / "data"),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": str(n),
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": str(n),
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": str(n),
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "3",
            "num.io.threads": "8",
        }
        props.update(self.extra_config)
        cfg = d / "server.properties"
        cfg.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return cfg

    def _jvm(self, install: KafkaInstall, i: int) -> list[str]:
        d = self._node_dir(i)
        return [
            install.java,
            *self.heap_opts,
            *[o for o in BROKER_JVM if not o.startswith(("-Xms", "-Xmx"))],
            f"-Xlog:gc*:file={d / 'logs' / 'gc.log'}:time,tags:filecount=2,filesize=20M",
            f"-Dkafka.logs.dir={d / 'logs'}",
            f"-Dlog4j2.configurationFile={install.broker_log4j2}",
            "-cp",
            install.classpath,
        ]

    def _format_all(self, install: KafkaInstall, configs: list[Path], cluster_id: str) -> None:
        """Format every node's storage, in parallel (one short JVM each)."""
        errors: list[BaseException] = []

        def one(i: int, cfg: Path) -> None:
            try:
                self._format(install, i, cfg, cluster_id)
            except BaseException as e:  # re-raised below, in the caller's thread
                errors.append(e)

        threads = [threading.Thread(target=one, args=(i, c)) for i, c in enumerate(configs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def _format(self, install: KafkaInstall, i: int, cfg: Path, cluster_id: str) -> None:
        cmd = [
            install.java,
            *ADMIN_JVM,
            f"-Dlog4j2.configurationFile={install.tools_log4j2}",
            "-cp",
            install.classpath,
            STORAGE_TOOL,
            "format",
            "--config",
            str(cfg),
            "--cluster-id",
            cluster_id,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise KafkaStartError(
                f"storage format failed for node {i + 1}:\n{_tail(proc.stdout + proc.stderr)}"
            )

    def _launch(self, install: KafkaInstall, i: int, cfg: Path) -> None:
        d = self._node_dir(i)
        with open(d / "logs" / "stdout.log", "wb") as out:
            proc = subprocess.Popen(
                [*self._jvm(install, i), KAFKA_MAIN, str(cfg)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=d,
            )
        with self._lock:
            self.procs.append(proc)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        delay = 0.05
        while True:
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    tail = self._log_tail(i)
                    raise KafkaStartError(f"node {i + 1} exited {p.returncode} on start:\n{tail}")
            if all(_registered_brokers(port) >= self.broker_count for port in self.broker_ports):
                return
            if time.monotonic() > deadline:
                raise KafkaStartError(
                    f"broker not ready after {self.start_timeout_s:.0f}s:\n{self._log_tail(0)}"
                )
            time.sleep(delay)
            delay = min(0.25, delay * 1.5)

    def _log_tail(self, i: int) -> str:
        parts = []
        for name in ("server.log", "stdout.log"):
            with contextlib.suppress(OSError):
                text = (self._node_dir(i) / "logs" / name).read_text(errors="replace")
                parts.append(_tail(text, 15))
        return "\n".join(parts)

    def stop(self) -> None:
        """SIGTERM every node (by PID), SIGKILL the ones still up after the timeout."""
        with self._lock:
            procs, self.procs = self.procs, []
        if self.broker_ports:
            _LIVE_CLUSTERS.pop(self.bootstrap, None)
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait()
        if self.data_dir is not None and not self.keep_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)


# ---------------------------------------------------------------------------- tools


@dataclass
class _ToolRun:
    rc: int
    stdout: str
    stderr: str
    cpu_s: float
    wall_s: float


def _run_tool(
    install: KafkaInstall,
    main_class: str,
    args: Sequence[str],
    timeout_s: float = 600.0,
    classpath: str | None = None,
    jvm: Sequence[str] = TOOL_JVM,
) -> _ToolRun:
    """Run ``java -cp ... main_class args``; returns output and the JVM's own CPU (rusage)."""
    cmd = [
        install.java,
        *jvm,
        f"-Dlog4j2.configurationFile={install.tools_log4j2}",
        "-cp",
        classpath or install.classpath,
        main_class,
        *args,
    ]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        try:
            status, rusage = _wait4(proc.pid, t0 + timeout_s)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(proc.pid, 0)
            proc.returncode = -9
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        return _ToolRun(
            rc=proc.returncode,
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
            cpu_s=rusage.ru_utime + rusage.ru_stime,
            wall_s=wall,
        )


def _wait4(pid: int, deadline: float) -> tuple[int, resource.struct_rusage]:
    delay = 0.005
    while True:
        wpid, status, rusage = os.wait4(pid, os.WNOHANG)
        if wpid == pid:
            return status, rusage
        if time.monotonic() > deadline:
            raise TimeoutError(f"tool pid {pid} did not finish in time")
        time.sleep(delay)
        delay = min(0.05, delay * 2)


def _check(run: _ToolRun, what: str) -> None:
    if run.rc != 0:
        raise ToolError(f"{what} exited {run.rc}:\n{_tail(run.stdout, 10)}\n{_tail(run.stderr)}")


def _broker_pids(bootstrap: str, broker_pids: Sequence[int] | None) -> list[int]:
    if broker_pids is not None:
        return list(broker_pids)
    cluster = _LIVE_CLUSTERS.get(bootstrap)
    return cluster.pids if cluster else []


class _BrokerMeter:
    """Broker CPU delta and peak RSS around one workload."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.cpu0 = sum(_proc_cpu_s(p) for p in self.pids)

    def cpu_s(self) -> float:
        return sum(_proc_cpu_s(p) for p in self.pids) - self.cpu0

    def rss_mb(self) -> float | None:
        vals = [v for v in (_proc_hwm_mb(p) for p in self.pids) if v is not None]
        return round(sum(vals), 1) if vals else None


def _result(
    workload: str,
    records: int,
    record_bytes: int,
    records_per_s: float,
    meter: _BrokerMeter,
    client_cpu_s: float,
    p50: float | None,
    p99: float | None,
    p999: float | None,
    detail: dict[str, object],
) -> dict[str, object]:
    per_m = 1e6 / records if records else 0.0
    return {
        "workload": workload,
        "system": "kafka",
        "records_per_s": round(records_per_s, 1),
        "mb_per_s": round(records_per_s * record_bytes / 1e6, 2),
        "p50_ms": p50,
        "p99_ms": p99,
        "p999_ms": p999,
        "rss_mb": meter.rss_mb(),
        "cpu_s_per_million": {
            "broker": round(meter.cpu_s() * per_m, 3),
            "client": round(client_cpu_s * per_m, 3),
        },
        "records": records,
        "record_bytes": record_bytes,
        "detail": detail,
    }


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    replication_factor: int = 1,
    configs: dict[str, str] | None = None,
    install: KafkaInstall | None = None,
) -> None:
    """Create a topic with Kafka's TopicCommand (raises ToolError on failure)."""
    install = install or ensure_kafka()
    args = [
        "--bootstrap-server",
        bootstrap,
        "--create",
        "--topic",
        name,
        "--partitions",
        str(partitions),
        "--replication-factor",
        str(replication_factor),
    ]
    for k, v in (configs or {}).items():
        args += ["--config", f"{k}={v}"]
    run = _run_tool(install, TOPIC_COMMAND, args, timeout_s=120, jvm=ADMIN_JVM)
    _check(run, f"create topic {name}")


# Kafka v2 batch header, and an allowance per record for its varint framing (length, attributes,
# timestamp and offset deltas, key length, value length, header count).
_BATCH_HEADER = 61
_RECORD_FRAMING = 12

_PRODUCER_FINAL = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th"
)


def producer_perf(
    bootstrap: str,
    topic: str,
    num_records: int,
    record_size: int,
    acks: str = "1",
    batch_records: int | None = None,
    linger_ms: int | None = None,
    batch_size: int | None = None,
    throughput: int = -1,
    compression: str | None = None,
    extra_props: dict[str, str] | None = None,
    broker_pids: Sequence[int] | None = None,
    install: KafkaInstall | None = None,
    workload: str | None = None,
) -> dict[str, object]:
    """Kafka's ProducerPerformance; see the module doc for the batch mapping."""
    install = install or ensure_kafka()
    props: dict[str, str] = {"acks": str(acks)}
    if batch_records is not None:
        props["batch.size"] = str(_BATCH_HEADER + batch_records * (record_size + _RECORD_FRAMING))
        props["linger.ms"] = "0" if batch_records <= 1 else "10"
    if batch_size is not None:
        props["batch.size"] = str(batch_size)
    if linger_ms is not None:
        props["linger.ms"] = str(linger_ms)
    if compression:
        props["compression.type"] = compression
    props.update(extra_props or {})
    args = [
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--num-records",
        str(num_records),
        "--record-size",
        str(record_size),
        "--throughput",
        str(throughput),
        "--reporting-interval",
        "600000",
        "--command-property",
        *[f"{k}={v}" for k, v in props.items()],
    ]
    meter = _BrokerMeter(_broker_pids(bootstrap, broker_pids))
    run = _run_tool(install, PRODUCER_PERF, args)
    _check(run, "ProducerPerformance")
    matches = _PRODUCER_FINAL.findall(run.stdout)
    if not matches:
        raise ToolError(f"ProducerPerformance printed no summary:\n{_tail(run.stdout)}")
    sent, rps, mib_s, avg, mx, p50, p95, p99, p999 = matches[-1]
    name = workload or f"produce_acks{acks}" + (f"_batch{batch_records}" if batch_records else "")
    detail = {
        "tool": PRODUCER_PERF,
        "producer_props": props,
        "tool_mib_per_s": float(mib_s),
        "avg_ms": float(avg),
        "max_ms": float(mx),
        "p95_ms": float(p95),
        "client_wall_s": round(run.wall_s, 2),
    }
    return _result(
        name,
        int(sent),
        record_size,
        float(rps),
        meter,
        run.cpu_s,
        float(p50),
        float(p99),
        float(p999),
        detail,
    )


def consumer_perf(
    bootstrap: str,
    topic: str,
    num_records: int,
    fetch_max_bytes: int = 200 * 1024,
    record_size: int | None = None,
    timeout_ms: int = 30000,
    extra_props: dict[str, str] | None = None,
    broker_pids: Sequence[int] | None = None,
    install: KafkaInstall | None = None,
    workload: str = "consume",
) -> dict[str, object]:
    """Kafka's ConsumerPerformance from the earliest offset, with a fresh group."""
    install = install or ensure_kafka()
    props = {"fetch.max.bytes": str(fetch_max_bytes), "auto.offset.reset": "earliest"}
    props.update(extra_props or {})
    args = [
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--num-records",
        str(num_records),
        "--fetch-size",
        str(fetch_max_bytes),
        "--timeout",
        str(timeout_ms),
        "--reporting-interval",
        "600000",
        "--group",
        f"tidelog-bench-{uuid.uuid4().hex[:8]}",
        "--command-property",
        *[f"{k}={v}" for k, v in props.items()],
    ]
    meter = _BrokerMeter(_broker_pids(bootstrap, broker_pids))
    run = _run_tool(install, CONSUMER_PERF, args)
    _check(run, "ConsumerPerformance")
    row = _parse_consumer_output(run.stdout)
    got = int(float(row["data.consumed.in.nMsg"]))
    mib = float(row["data.consumed.in.MB"])
    if record_size is None:
        record_size = round(mib * 1024 * 1024 / got) if got else 0
    detail = {
        "tool": CONSUMER_PERF,
        "consumer_props": {**props, "max.partition.fetch.bytes": str(fetch_max_bytes)},
        "nmsg_per_s_with_group_join": float(row["nMsg.sec"]),
        "rebalance_ms": float(row["rebalance.time.ms"]),
        "fetch_ms": float(row["fetch.time.ms"]),
        "tool_fetch_mib_per_s": float(row["fetch.MB.sec"]),
        "client_wall_s": round(run.wall_s, 2),
    }
    if got < num_records:
        detail["short_by"] = num_records - got
    return _result(
        workload,
        got,
        record_size,
        float(row["fetch.nMsg.sec"]),
        meter,
        run.cpu_s,
        None,
        None,
        None,
        detail,
    )


def _parse_consumer_output(stdout: str) -> dict[str, str]:
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith("start.time") and i + 1 < len(lines):
            keys = [k.strip() for k in ln.split(",")]
            vals = [v.strip() for v in lines[i + 1].split(",")]
            if len(vals) >= len(keys):
                return dict(zip(keys, vals, strict=False))
    raise ToolError(f"ConsumerPerformance printed no result row:\n{_tail(stdout)}")


def end_to_end_latency(
    bootstrap: str,
    topic: str,
    num_records: int,
    record_size: int,
    rate_per_s: float = 10000,
    acks: str = "1",
    linger_ms: int = 0,
    warmup_records: int | None = None,
    extra_props: dict[str, str] | None = None,
    broker_pids: Sequence[int] | None = None,
    install: KafkaInstall | None = None,
    workload: str = "e2e_latency",
    processes: int = 1,
) -> dict[str, object]:
    """Fixed-rate produce + consume (FixedRateLatency); latency percentiles in ms. In one
    JVM (`processes=1`), or the consumer in a JVM of its own (`processes=2`): started
    first, and the producer's JVM once it is at the end of the topic.

    ``extra_props`` keys need a ``producer.`` or ``consumer.`` prefix.
    """
    install = install or ensure_kafka()
    if install.classes_dir is None:
        raise KafkaUnavailable("javac is not available, so FixedRateLatency could not be compiled")
    if record_size < 24:
        raise ValueError("record_size must be >= 24 (sequence + two timestamps are embedded)")
    warmup = int(2 * rate_per_s) if warmup_records is None else warmup_records
    args = [
        bootstrap,
        topic,
        str(num_records),
        str(record_size),
        str(rate_per_s),
        str(acks),
        str(warmup),
    ]
    props = {"producer.linger.ms": str(linger_ms), **(extra_props or {})}
    args += [f"{k}={v}" for k, v in props.items()]
    classpath = f"{install.classes_dir}{os.pathsep}{install.classpath}"
    meter = _BrokerMeter(_broker_pids(bootstrap, broker_pids))
    timeout = (num_records + warmup) / rate_per_s + 180
    data: dict[str, Any]
    if processes == 2:
        data, run = _latency_two_jvms(install, args, classpath, timeout)
    else:
        run = _run_tool(
            install, LATENCY_MAIN, args, timeout_s=timeout, classpath=classpath, jvm=LATENCY_JVM
        )
        line = _last_json_line(run.stdout)
        if line is None:
            _check(run, "FixedRateLatency")
            raise ToolError(
                f"FixedRateLatency printed no result:\n{_tail(run.stdout)}\n{_tail(run.stderr)}"
            )
        data = json.loads(line)
    if run.rc not in (0, 3):
        _check(run, "FixedRateLatency")
    detail = {
        "tool": LATENCY_MAIN,
        "props": props,
        **{k: data[k] for k in data if not k.startswith(("p50", "p99", "p999"))},
        "client_wall_s": round(run.wall_s, 2),
        "processes": processes,
    }
    measured = int(data["measured"])
    # CPU is spread over warm-up + measured records: all were sent and consumed.
    sent = int(data["sent"])
    meter_records = sent if sent else measured
    res = _result(
        workload,
        meter_records,
        record_size,
        float(data["achieved_rate"]),
        meter,
        run.cpu_s,
        float(data["p50_ms"]),
        float(data["p99_ms"]),
        float(data["p999_ms"]),
        detail,
    )
    res["records"] = measured
    return res


def _last_json_line(stdout: str) -> str | None:
    """The last line of FixedRateLatency's output that holds its JSON result."""
    return next((ln for ln in reversed(stdout.splitlines()) if ln.startswith("{")), None)


def _latency_two_jvms(
    install: KafkaInstall, args: list[str], classpath: str, timeout_s: float
) -> tuple[dict[str, Any], _ToolRun]:
    """FixedRateLatency's consumer (role=consumer) in one JVM, then its producer
    (role=producer) in another; the consumer's latency JSON with the producer's send rate,
    and a _ToolRun whose CPU is both JVMs'."""
    cmd = [
        install.java,
        *LATENCY_JVM,
        f"-Dlog4j2.configurationFile={install.tools_log4j2}",
        "-cp",
        classpath,
        LATENCY_MAIN,
        *args,
        "role=consumer",
    ]
    with tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        consumer = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True
        )
        try:
            assert consumer.stdout is not None
            if consumer.stdout.readline().strip() != "ready":
                raise ToolError("FixedRateLatency role=consumer did not get ready")
            producer = _run_tool(
                install,
                LATENCY_MAIN,
                [*args, "role=producer"],
                timeout_s=timeout_s,
                classpath=classpath,
                jvm=LATENCY_JVM,
            )
            _check(producer, "FixedRateLatency role=producer")
            out = consumer.stdout.read()
            status, rusage = _wait4(consumer.pid, time.monotonic() + 120)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                consumer.kill()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(consumer.pid, 0)
            raise
        consumer.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    run = _ToolRun(
        rc=consumer.returncode,
        stdout=out,
        stderr=stderr,
        cpu_s=rusage.ru_utime + rusage.ru_stime + producer.cpu_s,
        wall_s=time.monotonic() - t0,
    )
    line = _last_json_line(out)
    sent = _last_json_line(producer.stdout)
    if line is None or sent is None:
        raise ToolError(f"FixedRateLatency printed no result:\n{_tail(out)}\n{_tail(stderr)}")
    data: dict[str, Any] = json.loads(line)
    sender = json.loads(sent)
    data.update(
        achieved_rate=sender["achieved_rate"],
        max_behind_ms=sender["max_behind_ms"],
        send_errors=sender["send_errors"],
    )
    return data, run


# ---------------------------------------------------------------------------- smoke run


def _print_table(rows: list[dict[str, object]]) -> None:
    def f(v: object, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    head = f"{'workload':<22}{'records':>10}{'rec/s':>12}{'MB/s':>9}"
    head += f"{'p50ms':>8}{'p99ms':>8}{'p999ms':>8}"
    head += f"{'rssMiB':>8}{'brkCPU/M':>10}{'cliCPU/M':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        cpu = r["cpu_s_per_million"]
        assert isinstance(cpu, dict)
        print(
            f"{r['workload']!s:<22}{r['records']!s:>10}{f(r['records_per_s'], ',.0f'):>12}"
            f"{f(r['mb_per_s'], '.1f'):>9}{f(r['p50_ms'], '.2f'):>8}{f(r['p99_ms'], '.2f'):>8}"
            f"{f(r['p999_ms'], '.2f'):>8}{f(r['rss_mb'], '.0f'):>8}"
            f"{cpu['broker']:>10.2f}{cpu['client']:>10.2f}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Smoke run of the Apache Kafka baseline.")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--latency-seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=10_000)
    ap.add_argument("--brokers", type=int, default=1)
    ap.add_argument(
        "--batches", action="store_true", help="also produce with 1 and 50 records per batch"
    )
    ap.add_argument("--json", help="write the results here as a JSON list")
    a = ap.parse_args(argv)

    t0 = time.monotonic()
    try:
        install = ensure_kafka()
    except KafkaUnavailable as e:
        print(f"Kafka baseline skipped: {e.reason}", file=sys.stderr)
        return 2
    print(
        f"kafka {install.version}: ready in {time.monotonic() - t0:.2f}s",
        f"(cache {install.cache_dir})",
    )
    rows: list[dict[str, object]] = []
    t1 = time.monotonic()
    with KafkaCluster(install, broker_count=a.brokers) as k:
        print(f"cluster up in {time.monotonic() - t1:.1f}s: bootstrap={k.bootstrap} pids={k.pids}")
        rf = a.brokers
        create_topic(k.bootstrap, "smoke", 1, rf, install=install)
        rows.append(
            producer_perf(k.bootstrap, "smoke", a.records, a.record_size, acks="1", install=install)
        )
        rows.append(
            consumer_perf(
                k.bootstrap, "smoke", a.records, record_size=a.record_size, install=install
            )
        )
        if a.batches:
            for n in (1, 50):
                topic = f"batch{n}"
                create_topic(k.bootstrap, topic, 1, rf, install=install)
                rows.append(
                    producer_perf(
                        k.bootstrap,
                        topic,
                        a.records,
                        a.record_size,
                        batch_records=n,
                        install=install,
                    )
                )
        create_topic(k.bootstrap, "latency", 1, rf, install=install)
        n_lat = int(a.rate * a.latency_seconds)
        rows.append(
            end_to_end_latency(
                k.bootstrap, "latency", n_lat, a.record_size, a.rate, install=install
            )
        )
    _print_table(rows)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2) + "\n")
    print(f"total {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
