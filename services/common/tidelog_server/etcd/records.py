"""Typed values of the etcd key layout (see `keys` for where each lives).

Values are UTF-8 JSON. Each record decodes what any earlier release wrote
(missing fields take their defaults, spacing does not matter) and encodes
compactly with sorted keys, so that equal records are equal bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PartitionState:
    """`<prefix>/partitions/<topic>/<p>/state`: who leads, in which epoch, with which ISR.

    Written by the coordinator when it creates a topic or elects a leader, and
    by the leader when its ISR changes; `version` counts the writes.

    `elr`: the eligible leader replicas (Kafka's KIP-966): replicas removed
    from the ISR while it was below the topic's min.insync.replicas, kept
    while it stays below (tidelog_server.election_rule.next_elr says what
    every ISR change makes of it). No acks=all record is acknowledged while
    the ISR is below min.insync.replicas, so each holds every record
    acknowledged: it may lead as an ISR member may (election_rule.
    elect_in_sync), and counts for neither the high watermark nor acks.
    Left out when empty: the bytes an older release wrote, which means none
    (an older release reading it ignores it, as it ignored the rule).
    """

    leader: int = -1
    leader_epoch: int = 0
    isr: tuple[int, ...] = ()
    version: int = 1
    elr: tuple[int, ...] = ()

    @classmethod
    def decode(cls, value: bytes) -> PartitionState:
        data = json.loads(value)
        return cls(
            leader=int(data.get("leader", -1)),
            leader_epoch=int(data.get("leader_epoch", 0)),
            isr=tuple(int(b) for b in data.get("isr", [])),
            version=int(data.get("version", 1)),
            elr=tuple(int(b) for b in data.get("elr") or []),
        )

    def encode(self) -> bytes:
        body: dict[str, object] = {
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "isr": list(self.isr),
            "version": self.version,
        }
        if self.elr:
            body["elr"] = list(self.elr)
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def _compact(body: dict[str, object]) -> bytes:
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def _by_topic(partitions: tuple[tuple[str, int], ...]) -> dict[str, list[int]]:
    """(topic, partition) pairs as {topic: [partition, ...]}, sorted."""
    grouped: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        grouped.setdefault(topic, []).append(partition)
    return grouped


@dataclass(frozen=True)
class BrokerRegistration:
    """`<prefix>/brokers/ids/<id>`: a live broker, bound to its session lease.

    Written by the broker when it registers; read by the coordinators
    (placement, leader election) and the other brokers (Metadata, replica
    fetching). `max_partitions` and `open_file_limit` are the resources the
    broker reports (None: an older broker that reports none).

    `offline_partitions`: the replicas on this broker whose log a storage
    failure took offline (a reset or truncation that failed part-way; they
    serve nothing until the broker restarts), as Kafka's broker registration
    lists its offline log directories. The broker rewrites its registration
    (same key, same lease, so its create revision stays) when the set
    changes; the controller elects none of them and drops them from the
    ISR. Encoded as {topic: [partition, ...]} and left out when empty, so
    that a registration without any is the bytes an older broker wrote (and
    an older broker's registration means: nothing offline).

    `torn_partitions`: the replicas here whose log may have lost its tail
    when this broker opened it (it was not shut down cleanly, or recovery
    cut damage: a cut at a batch boundary leaves no damage to find) and that
    have neither caught up with a leader nor led since
    (LogManager.torn_partitions; the name is older than that meaning, and
    kept for compatibility): records they acknowledged as ISR members may
    be gone, so the controller elects none of them while another ISR member
    may return (they may stay in the ISR and catch up). At most
    MAX_OFFLINE_REPORTED (the broker's ClusterLink). Encoded and left out as
    `offline_partitions` is.

    `torn_figures`: for each torn replica here, (topic, partition, last
    epoch, log end offset): the newest leader epoch of its log (-1 without
    an epoch history) and the offset after its last record, as of when the
    broker last wrote its registration (it rewrites it while they move,
    ClusterLink). When every ISR member that may return is torn, the
    controller elects the one holding the most by these figures
    (tidelog_server.election_rule.most_complete). A separate key of its own,
    {topic: [[partition, last_epoch, log_end_offset], ...]}, left out when
    empty: a coordinator older than it reads `torn_partitions` as before and
    ignores it; a registration without it (an older broker) means no
    figures, and the controller elects the first torn one in assignment
    order, as before.

    `starting`: written by a broker that has not yet hosted (opened,
    recovering them) the logs etcd assigns it, so its `torn_partitions` are
    not known yet; it rewrites the registration without it once they are.
    The controller elects no such broker. Left out when False (an older
    broker's registration: nothing to wait for).
    """

    broker_id: int
    host: str
    port: int
    rack: str = ""
    #: Partition replicas the broker can host.
    max_partitions: int | None = None
    open_file_limit: int | None = None
    #: The internal listener's port (replication; brokers only dial it).
    #: None: a broker from before the listeners were split, which serves
    #: replication on its client port.
    internal_port: int | None = None
    #: (topic, partition) of each offline replica here, sorted.
    offline_partitions: tuple[tuple[str, int], ...] = ()
    #: (topic, partition) of each torn replica here, sorted.
    torn_partitions: tuple[tuple[str, int], ...] = ()
    #: (topic, partition, last epoch, log end offset) of each torn replica
    #: here, sorted (see the class doc).
    torn_figures: tuple[tuple[str, int, int, int], ...] = ()
    #: Its logs are not hosted yet (see the class doc).
    starting: bool = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def internal_address(self) -> str:
        """Where other brokers fetch from this one as followers."""
        return f"{self.host}:{self.internal_port or self.port}"

    @classmethod
    def decode(cls, value: bytes) -> BrokerRegistration:
        data = json.loads(value)
        max_partitions = data.get("max_partitions")
        open_files = data.get("open_file_limit")
        internal_port = data.get("internal_port")
        offline = data.get("offline_partitions") or {}
        torn = data.get("torn_partitions") or {}
        figures = data.get("torn_figures") or {}
        return cls(
            broker_id=int(data["id"]),
            host=str(data.get("host", "")),
            port=int(data.get("port", 0)),
            rack=str(data.get("rack") or ""),
            max_partitions=None if max_partitions is None else int(max_partitions),
            open_file_limit=None if open_files is None else int(open_files),
            internal_port=None if internal_port is None else int(internal_port),
            offline_partitions=tuple(
                sorted((str(t), int(p)) for t, ps in offline.items() for p in ps)
            ),
            torn_partitions=tuple(sorted((str(t), int(p)) for t, ps in torn.items() for p in ps)),
            torn_figures=tuple(
                sorted(
                    (str(t), int(p), int(epoch), int(end))
                    for t, logs in figures.items()
                    for p, epoch, end in logs
                )
            ),
            starting=bool(data.get("starting", False)),
        )

    def encode(self) -> bytes:
        body: dict[str, object] = {
            "id": self.broker_id,
            "host": self.host,
            "port": self.port,
            "rack": self.rack,
        }
        if self.max_partitions is not None:
            body["max_partitions"] = self.max_partitions
        if self.open_file_limit is not None:
            body["open_file_limit"] = self.open_file_limit
        if self.internal_port is not None:
            body["internal_port"] = self.internal_port
        if self.offline_partitions:
            body["offline_partitions"] = _by_topic(self.offline_partitions)
        if self.torn_partitions:
            body["torn_partitions"] = _by_topic(self.torn_partitions)
        if self.torn_figures:
            by_topic: dict[str, list[list[int]]] = {}
            for topic, partition, epoch, end in sorted(self.torn_figures):
                by_topic.setdefault(topic, []).append([partition, epoch, end])
            body["torn_figures"] = by_topic
        if self.starting:
            body["starting"] = True
        return _compact(body)


@dataclass(frozen=True)
class CoordinatorRegistration:
    """`<prefix>/coordinators/<id>` (and a candidate's value in the controller
    election): a live coordinator replica and where clients reach it."""

    coordinator_id: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def decode(cls, value: bytes) -> CoordinatorRegistration:
        data = json.loads(value)
        return cls(
            coordinator_id=str(data.get("id", "")),
            host=str(data.get("host", "")),
            port=int(data.get("port", 0)),
        )

    def encode(self) -> bytes:
        return _compact({"id": self.coordinator_id, "host": self.host, "port": self.port})


@dataclass(frozen=True)
class Reassignment:
    """A partition's replica move in progress (in its topic's record).

    While it lasts, the partition's replicas are `target` followed by the
    `original` replicas not in it; the controller completes it (replicas =
    target) once every target replica is in the ISR; a cancel restores
    `original`."""

    target: tuple[int, ...]
    original: tuple[int, ...]
    #: Bytes per second a leader sends to the adding replicas (0: no limit).
    throttle_bytes_per_s: int = 0
    #: Wall-clock ms since the epoch when it started.
    started_ms: int = 0

    @property
    def adding(self) -> tuple[int, ...]:
        return tuple(b for b in self.target if b not in self.original)

    @property
    def removing(self) -> tuple[int, ...]:
        return tuple(b for b in self.original if b not in self.target)

    @property
    def replicas(self) -> tuple[int, ...]:
        """Every replica while the move lasts: the target, then the leaving ones."""
        return self.target + self.removing

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Reassignment:
        return cls(
            target=tuple(int(b) for b in data.get("target", ())),  # type: ignore[attr-defined]
            original=tuple(int(b) for b in data.get("original", ())),  # type: ignore[attr-defined]
            throttle_bytes_per_s=int(data.get("throttle_bytes_per_s", 0)),  # type: ignore[call-overload]
            started_ms=int(data.get("started_ms", 0)),  # type: ignore[call-overload]
        )

    def to_json(self) -> dict[str, object]:
        return {
            "target": list(self.target),
            "original": list(self.original),
            "throttle_bytes_per_s": self.throttle_bytes_per_s,
            "started_ms": self.started_ms,
        }


@dataclass(frozen=True)
class TopicAssignment:
    """`<prefix>/topics/<name>`: a topic's id, the replicas of each partition
    (index = partition), its config overrides and the reassignments in
    progress (partition -> Reassignment; the key is left out when there are
    none, so a record without any is the bytes an older release wrote).
    Written by the coordinator that creates the topic (alters its configs,
    adds partitions, reassigns them); `version` counts the writes."""

    name: str
    topic_id: str
    replicas: tuple[tuple[int, ...], ...]
    configs: dict[str, str]
    version: int = 1
    #: Wall-clock time of creation, ms since the epoch.
    created_ms: int = 0
    reassignments: dict[int, Reassignment] = field(default_factory=dict)

    @classmethod
    def decode(cls, value: bytes) -> TopicAssignment:
        data = json.loads(value)
        # In partition order; an entry without its number is at its index.
        partitions = [
            p
            for _, p in sorted(
                enumerate(data.get("partitions", [])),
                key=lambda entry: int(entry[1].get("partition", entry[0])),
            )
        ]
        return cls(
            name=str(data.get("name", "")),
            topic_id=str(data.get("topic_id", "")),
            replicas=tuple(tuple(int(b) for b in p.get("replicas", ())) for p in partitions),
            configs={str(k): str(v) for k, v in data.get("configs", {}).items()},
            version=int(data.get("version", 1)),
            created_ms=int(data.get("created_ms", 0)),
            reassignments={
                int(p): Reassignment.from_json(r) for p, r in data.get("reassignments", {}).items()
            },
        )

    def encode(self) -> bytes:
        body: dict[str, object] = {
            "name": self.name,
            "topic_id": self.topic_id,
            "partitions": [
                {"partition": p, "replicas": list(replicas)}
                for p, replicas in enumerate(self.replicas)
            ],
            "configs": self.configs,
            "version": self.version,
            "created_ms": self.created_ms,
        }
        if self.reassignments:
            body["reassignments"] = {
                str(p): r.to_json() for p, r in sorted(self.reassignments.items())
            }
        return _compact(body)
