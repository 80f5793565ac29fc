"""Typed values of the etcd key layout (see `keys` for where each lives).

Values are UTF-8 JSON. Each record decodes what any earlier release wrote
(missing fields take their defaults, spacing does not matter) and encodes
compactly with sorted keys, so that equal records are equal bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class PartitionState:
    """`<prefix>/partitions/<topic>/<p>/state`: who leads, in which epoch, with which ISR.

    Written by the coordinator when it creates a topic or elects a leader, and
    by the leader when its ISR changes; `version` counts the writes.
    """

    leader: int = -1
    leader_epoch: int = 0
    isr: tuple[int, ...] = ()
    version: int = 1

    @classmethod
    def decode(cls, value: bytes) -> PartitionState:
        data = json.loads(value)
        return cls(
            leader=int(data.get("leader", -1)),
            leader_epoch=int(data.get("leader_epoch", 0)),
            isr=tuple(int(b) for b in data.get("isr", [])),
            version=int(data.get("version", 1)),
        )

    def encode(self) -> bytes:
        body = {
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "isr": list(self.isr),
            "version": self.version,
        }
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
