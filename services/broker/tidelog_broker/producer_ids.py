"""`InitProducerId` on a broker: producer ids for idempotent producers.

Producers ask the server they bootstrap from, so every broker answers:

- in cluster mode (`ProducerIdForwarder`), the call goes to a coordinator
  replica (the next one on UNAVAILABLE), which allocates ids from a counter
  in etcd (`tidelog_coordinator.producer_ids`); its answer or error is passed
  back as is;
- standalone (`LocalProducerIds`), the broker allocates ids itself from
  `producer-ids.json` in its data directory, so that the single-broker setup
  gets idempotence too. The file is written (temp file, fsync, rename, fsync
  of the directory) before the id is returned, so an id is never handed out
  twice, even across a crash. Its content::

      {"next_id": 12, "keys": {"<producer key>": [producer_id, epoch], ...}}

  A standalone broker also serves `DescribeCluster` as UNIMPLEMENTED, which
  clients read as "no consumer groups here" (GroupsNotSupportedError).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import grpc
import grpc.aio
from tidelog.errors import (
    GroupsNotSupportedError,
    InvalidRequestError,
    StorageError,
)
from tidelog.v1 import cluster_pb2, cluster_pb2_grpc
from tidelog_server.atomic_files import write_atomically
from tidelog_server.forwarding import CoordinatorForwarding

from tidelog_broker.coordinator_forwarding import forward_to_coordinator
from tidelog_broker.error_mapping import abort

log = logging.getLogger("tidelog.broker")

PRODUCER_IDS_FILE = "producer-ids.json"
#: The largest epoch a batch header can carry (int16).
MAX_EPOCH = 32_767
MAX_PRODUCER_KEY_CHARS = 255
#: Deadline of a forwarded InitProducerId: a producer waits for it at start.
INIT_PRODUCER_ID_TIMEOUT_S = 10.0


def _check_key(producer_key: str) -> None:
    if len(producer_key) > MAX_PRODUCER_KEY_CHARS:
        raise InvalidRequestError(
            f"producer_key is {len(producer_key)} characters; at most "
            f"{MAX_PRODUCER_KEY_CHARS} are allowed"
        )


class LocalProducerIds:
    """A standalone broker's producer id counter (see module doc). Not
    thread-safe: the broker's event loop calls it."""

    def __init__(self, data_dir: Path) -> None:
        self._path = data_dir / PRODUCER_IDS_FILE
        self._next_id = 0
        self._keys: dict[str, tuple[int, int]] = {}
        # producer id -> its key's epoch (keyed ids only; the others stay at 0).
        self._epochs: dict[int, int] = {}
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            # Written by rename after an fsync, so this is damage from outside;
            # starting from 0 could hand out ids already in logs. Refuse.
            raise StorageError(f"{self._path} unreadable ({exc}): cannot allocate ids") from exc
        self._next_id = int(data["next_id"])
        self._keys = {k: (int(v[0]), int(v[1])) for k, v in data.get("keys", {}).items()}
        self._epochs = {producer_id: epoch for producer_id, epoch in self._keys.values()}

    def highest_epoch(self, producer_id: int) -> int:
        """The highest epoch handed out for `producer_id` (0 for an id
        allocated without a key, or never allocated)."""
        return self._epochs.get(producer_id, 0)

    def init_producer_id(self, producer_key: str = "") -> tuple[int, int]:
        _check_key(producer_key)
        known = self._keys.get(producer_key) if producer_key else None
        if known is not None and known[1] < MAX_EPOCH:
            result = (known[0], known[1] + 1)
        else:
            result = (self._next_id, 0)
            self._next_id += 1
        if producer_key:
            self._keys[producer_key] = result
        self._save()
        # Known to the produce path only once durable: an epoch is never
        # accepted that a restart would forget.
        self._epochs[result[0]] = result[1]
        return result

    def _save(self) -> None:
        data = {"next_id": self._next_id, "keys": {k: list(v) for k, v in self._keys.items()}}
        try:
            write_atomically(self._path, json.dumps(data, sort_keys=True).encode("utf-8"))
        except OSError as exc:
            raise StorageError(f"cannot write {self._path}: {exc}") from exc


class StandaloneClusterServicer(cluster_pb2_grpc.ClusterServicer):
    """`tidelog.v1.Cluster` on a standalone broker: InitProducerId only."""

    def __init__(self, producer_ids: LocalProducerIds) -> None:
        self._producer_ids = producer_ids

    async def InitProducerId(
        self, request: cluster_pb2.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> cluster_pb2.InitProducerIdResponse:
        try:
            producer_id, epoch = self._producer_ids.init_producer_id(request.producer_key)
        except Exception as exc:
            await abort(context, exc, "allocating a producer id")
        return cluster_pb2.InitProducerIdResponse(producer_id=producer_id, producer_epoch=epoch)

    async def DescribeCluster(
        self, request: cluster_pb2.DescribeClusterRequest, context: grpc.aio.ServicerContext
    ) -> cluster_pb2.DescribeClusterResponse:
        await abort(
            context,
            GroupsNotSupportedError(
                "this broker runs standalone (no --etcd): there is no cluster to describe"
            ),
            "describing the cluster",
        )


class ProducerIdForwarder:
    """Cluster mode: InitProducerId forwarded to a coordinator replica, over
    the broker's shared channels (closed when the broker stops)."""

    def __init__(self, forwarding: CoordinatorForwarding) -> None:
        self._forwarding = forwarding

    async def forward(
        self, request: cluster_pb2.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> cluster_pb2.InitProducerIdResponse:
        response: cluster_pb2.InitProducerIdResponse = await forward_to_coordinator(
            self._forwarding,
            lambda channel: cluster_pb2_grpc.ClusterStub(channel).InitProducerId(
                request, timeout=INIT_PRODUCER_ID_TIMEOUT_S
            ),
            context,
            "InitProducerId",
        )
        return response
